// Warpgroup (wgmma, sm_90a) helpers for the chunked prefill scan: shared-memory matrix descriptors
// for the 128-byte-swizzled layout, fences, and m64nNk16 products with A in registers and B in
// shared memory, fp32 accumulate. Private to gdnPrefill.cu.
//
// Swizzled tiles: a 16-bit [R rows][C cols] tile (C a multiple of 64) is stored as atoms of 8 rows x
// 64 columns (1 KB, 1 KB aligned): atom (row group rg, column block cb) at (cb * R/8 + rg) * 1024; in
// it row r takes 128 B and its 16-byte chunk j sits at chunk position j ^ (r % 8) (bank-conflict-free
// for the tensor cores; the plain core-matrix layout measured 1.4x slower). As a B operand the same
// tile is read either way:
//   K-major  (tnspB 0): B[k][n] = tile[n][k]: SBO = 1024 (next 8 rows), LBO unused; k16 step kk
//                       starts at atom column kk / 4, +32 B per step inside the atom
//   MN-major (tnspB 1): B[k][n] = tile[k][n]: SBO = 1024 (next 8 rows = 8 k), LBO = R * 128 (next
//                       64 columns); k16 step kk starts 2 row groups further
//
// Accumulators: d[j][0..3] is the n8 block j in the mma.sync m16n8 C layout for the warp's 16 rows
// (warp w of the warpgroup owns rows 16w..16w+15); A registers use the m16n8k16 A layout. So the
// fp32 accumulators of one product are packed (accToA) into the A operand of the next.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GDN_WGMMA 1
#else
#define GDN_WGMMA 0
#endif

namespace gdn
{
namespace prefill_wgmma
{

// Byte offset of element (r, c) of a swizzled [R][*] 16-bit tile.
template <int R>
__host__ __device__ constexpr uint32_t swzOffset(int r, int c)
{
    return uint32_t(((c >> 6) * (R / 8) + (r >> 3)) * 1024 + (r & 7) * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4)
        + (c & 7) * 2);
}

// Shared-memory matrix descriptor of a 128-byte-swizzled operand: bits 0-13 start address >> 4, 16-29
// LBO >> 4, 32-45 SBO >> 4, 62-63 the swizzle mode (1: 128 B). Built from its two 32-bit words: the low
// word (address and LBO) by 32-bit adds, the high word (SBO and mode) a compile-time constant. (Adding
// the k16 step offsets to a 64-bit descriptor cost an add with carry and a second move per wgmma.)
template <uint32_t HI>
__device__ __forceinline__ uint64_t descWords(uint32_t lo)
{
    uint64_t d;
    asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(lo), "r"(HI));
    return d;
}
// The descriptor of the operand at shared address addr + off. Only the address's low 18 bits are the
// CTA's shared-memory offset: in a cluster launch the shared::cta addresses of CTA rank r > 0 carry r in
// higher bits, which would spill into the LBO field (read by the MN-major products). The offset is below
// 256 KB, so the 14-bit address field cannot carry into the LBO field.
template <uint32_t LBO, uint32_t SBO>
__device__ __forceinline__ uint64_t descAt(uint32_t addr, uint32_t off)
{
    return descWords<((SBO >> 4) & 0x3FFF) | (1u << 30)>(
        ((addr & 0x3FFFFu) >> 4) + (((LBO >> 4) & 0x3FFF) << 16) + (off >> 4));
}
// K-major B, k16 step kk, of a swizzled [R][*] tile at `tile`.
template <int R>
__device__ __forceinline__ uint64_t descKMajor(uint32_t tile, int kk)
{
    return descAt<16, 1024>(tile, (kk >> 2) * (R / 8) * 1024 + (kk & 3) * 32);
}
// MN-major B (rows are K), k16 step kk, of a swizzled [R][*] tile at `tile`
template <int R>
__device__ __forceinline__ uint64_t descMNMajor(uint32_t tile, int kk)
{
    return descAt<R * 128, 1024>(tile, kk * 2048);
}

__device__ __forceinline__ void wgFence()
{
#if GDN_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgCommit()
{
#if GDN_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgWait()
{
#if GDN_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared memory written by the generic proxy (st.shared, cp.async) and read next by wgmma.
__device__ __forceinline__ void fenceProxyAsync()
{
#if GDN_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Bulk copies (the tensor copy engine, TMA) completing on a shared-memory mbarrier.
__device__ __forceinline__ void mbarInit(uint32_t bar, int count)
{
#if GDN_WGMMA
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Thread-level: this thread's arrival, expecting `bytes` more from the copies that complete on `bar`.
__device__ __forceinline__ void mbarArriveExpectTx(uint32_t bar, uint32_t bytes)
{
#if GDN_WGMMA
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Thread-level: this thread's arrival (no transaction bytes).
__device__ __forceinline__ void mbarArrive(uint32_t bar)
{
#if GDN_WGMMA
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbarWait(uint32_t bar, uint32_t parity)
{
#if GDN_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
#endif
}
// L2 policy for data read or written once (streamed): evicted first, so it does not push out lines that
// are read again (q, k and the workspace slots beside the prep kernel).
__device__ __forceinline__ uint64_t policyEvictFirst()
{
    uint64_t pol = 0;
#if GDN_WGMMA
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}
// Box at coordinates (c0, c1, c2) of the 3-D tensor map `map` (a __grid_constant__ parameter's address),
// with the L2 cache policy pol (createpolicy) unless it is 0.
__device__ __forceinline__ void tmaLoad3d(
    uint32_t dst, void const* map, int c0, int c1, int c2, uint32_t bar, uint64_t pol = 0)
{
#if GDN_WGMMA
    if (pol != 0)
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
                     "[%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
            "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(pol)
            : "memory");
    else
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                     "%3, %4}], [%5];\n" ::"r"(dst),
            "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
            : "memory");
#endif
}
// Box (c0, c1, c2) of the 3-D tensor map `map` into L2 only (no shared memory, no completion to wait on), so
// that a later load of it hits L2.
__device__ __forceinline__ void tmaPrefetch3d(void const* map, int c0, int c1, int c2)
{
#if GDN_WGMMA
    asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(map), "r"(c0), "r"(c1),
        "r"(c2)
        : "memory");
#endif
}
// Shared tile at src -> box (c0, c1, c2) of the 3-D tensor map `map`, as one bulk tensor store of the
// calling thread's bulk group (L2 policy pol unless 0). The tile must be visible to the async proxy
// (fenceProxyAsync by its writers, then a barrier) and stay unchanged until bulkWaitRead.
__device__ __forceinline__ void tmaStore3d(void const* map, uint32_t src, int c0, int c1, int c2, uint64_t pol = 0)
{
#if GDN_WGMMA
    if (pol != 0)
        asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%1, %2, %3}], [%4], %5;\n"
                     ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src), "l"(pol)
                     : "memory");
    else
        asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
            "r"(c0), "r"(c1), "r"(c2), "r"(src)
            : "memory");
#endif
}
__device__ __forceinline__ void bulkCommit()
{
#if GDN_WGMMA
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Until every bulk store this thread committed has read its shared source.
__device__ __forceinline__ void bulkWaitRead()
{
#if GDN_WGMMA
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
// Until every bulk store this thread committed has completed (its writes done).
__device__ __forceinline__ void bulkWaitAll()
{
#if GDN_WGMMA
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// `bytes` (a multiple of 16) contiguous bytes from src (16 B aligned).
__device__ __forceinline__ void bulkLoad(uint32_t dst, void const* src, uint32_t bytes, uint32_t bar)
{
#if GDN_WGMMA
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
#endif
}
// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int NT>
__device__ __forceinline__ void fenceAcc(float (&d)[NT][4])
{
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            asm volatile("" : "+f"(d[j][e])::"memory");
}
__device__ __forceinline__ void fenceRegs(uint32_t (&a)[4])
{
#pragma unroll
    for (int e = 0; e < 4; ++e)
        asm volatile("" : "+r"(a[e])::"memory");
}

// d (64 x N, fp32) = (scaleD ? d : 0) + A (64 x 16, registers) * B (16 x N, descriptor); TB: tnspB.
// The asm text of one m64nNk16 product: N, the PTX type (bf16 / f16), the accumulator list, then the
// operand numbers of A (4 registers), the descriptor, scaleD and tnspB.
#define GDN_WG_RS_ASM(N, TY, ACC, A, DESC, SC, TB)                                                                     \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " SC ", 0;\nwgmma.mma_async.sync.aligned.m64n" N "k16.f32." TY "." TY " " ACC  \
    ", " A ", " DESC ", p, 1, 1, " TB ";\n}\n"
#define GDN_WG_ACC32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define GDN_WG_ACC64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define GDN_WG_OUT32(d) "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define GDN_WG_OUT64(d) "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define GDN_WG_IN(a, desc, sc, tb) "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(sc), "n"(tb)

template <typename T, int N, int TB>
struct Wgmma
{
    static_assert(N == 64 || N == 128, "m64n64k16 and m64n128k16 only");
    static __device__ __forceinline__ void run(float (&d)[N / 8][4], uint32_t const (&a)[4], uint64_t desc, int scaleD)
    {
#if GDN_WGMMA
        constexpr bool kHalf = std::is_same<T, __half>::value;
        if constexpr (N == 64 && kHalf)
            asm volatile(GDN_WG_RS_ASM("64", "f16", GDN_WG_ACC32, "{%32,%33,%34,%35}", "%36", "%37", "%38")
                         : GDN_WG_OUT32(d) : GDN_WG_IN(a, desc, scaleD, TB));
        else if constexpr (N == 64)
            asm volatile(GDN_WG_RS_ASM("64", "bf16", GDN_WG_ACC32, "{%32,%33,%34,%35}", "%36", "%37", "%38")
                         : GDN_WG_OUT32(d) : GDN_WG_IN(a, desc, scaleD, TB));
        else if constexpr (kHalf)
            asm volatile(GDN_WG_RS_ASM("128", "f16", GDN_WG_ACC64, "{%64,%65,%66,%67}", "%68", "%69", "%70")
                         : GDN_WG_OUT64(d) : GDN_WG_IN(a, desc, scaleD, TB));
        else
            asm volatile(GDN_WG_RS_ASM("128", "bf16", GDN_WG_ACC64, "{%64,%65,%66,%67}", "%68", "%69", "%70")
                         : GDN_WG_OUT64(d) : GDN_WG_IN(a, desc, scaleD, TB));
#else
        (void)d, (void)a, (void)desc, (void)scaleD;
        __trap();
#endif
    }
};

} // namespace prefill_wgmma
} // namespace gdn
