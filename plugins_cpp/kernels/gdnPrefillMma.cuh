// Warp-level tensor-core helpers for the chunked prefill (sm_80+ mma.sync m16n8k16 / tf32 m16n8k8,
// ldmatrix, cp.async; stmatrix on sm_90). Private to gdnPrefill.cu.
// Fragment layouts (PTX ISA, m16n8k16, g = lane/4, q = lane%4):
//   A (16x16, row): a0 (g, 2q..2q+1)  a1 (g+8, 2q..)  a2 (g, 2q+8..)  a3 (g+8, 2q+8..)
//   B (16x8, col) : b0 (k=2q..2q+1, n=g)  b1 (k=2q+8.., n=g)
//   C (16x8)      : c0,c1 (g, 2q..2q+1)   c2,c3 (g+8, 2q..2q+1)
// so the C fragments of two neighbouring n8 tiles are exactly the A fragment of one k16 step
// (the accumulator of one product feeds the next product without leaving registers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

namespace gdn
{
namespace prefill_mma
{

__device__ __forceinline__ uint32_t smemAddr(void const* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async global->shared copy; srcBytes < 16 zero-fills the rest (0: pure zero fill, no read).
__device__ __forceinline__ void cpAsync16(void* smem, void const* gmem, int srcBytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smemAddr(smem)), "l"(gmem), "r"(srcBytes)
                 : "memory");
}
__device__ __forceinline__ void cpAsync16(uint32_t smem, void const* gmem, int srcBytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(srcBytes) : "memory");
}
__device__ __forceinline__ void cpAsyncCommit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cpAsyncWaitAll()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
// Orders this thread's global accesses through the generic proxy with bulk copies (async proxy) of the
// same memory: after its stores that another CTA's bulk copies read (prep), or after the acquire that
// made another CTA's stores visible, before its own bulk copies read them (wgmma scan). sm_90 only.
__device__ __forceinline__ void fenceProxyAsyncGlobal()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ldsmX4(uint32_t (&r)[4], void const* p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smemAddr(p)));
}
__device__ __forceinline__ void ldsmX4T(uint32_t (&r)[4], void const* p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smemAddr(p)));
}

// Same with a shared-memory (u32) address, so callers can add compile-time byte offsets.
__device__ __forceinline__ void ldsmX4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsmX4T(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// stmatrix .x4 .trans (sm_90): lanes 8m..8m+7 give the row addresses of matrix m; register m of each
// lane holds the (row lane/4, columns 2(lane%4), +1) pair of matrix m, stored transposed.
__device__ __forceinline__ void stsmX4T(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
#else
    __trap();  // callers use it under __CUDA_ARCH__ >= 900 only
#endif
}

// Per-lane byte offsets of the ldsmRowsNK / ldsmRowsKN patterns (element size 2, row stride in elements);
// tile (j|m, kk) then adds the compile-time 2 * (16 j * stride + 16 kk) or 2 * (16 kk * stride + 16 m).
__device__ __forceinline__ uint32_t ldsmLaneNK(int stride, int lane)
{
    return 2u * ((((lane >> 4) << 3) + (lane & 7)) * stride + (((lane >> 3) & 1) << 3));
}
__device__ __forceinline__ uint32_t ldsmLaneKN(int stride, int lane)
{
    return 2u * (((((lane >> 3) & 1) << 3) + (lane & 7)) * stride + ((lane >> 4) << 3));
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// d += a * b  (fp32 accumulate; T = __nv_bfloat16 or __half operands)
#define GDN_MMA16816(TY)                                                                                               \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "    \
                 "{%0,%1,%2,%3};\n"                                                                                    \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (std::is_same<T, __half>::value)
        GDN_MMA16816("f16");
    else
        GDN_MMA16816("bf16");
}
#undef GDN_MMA16816

// fp32 -> tf32 (round to nearest, ties away), as the b32 operand of a tf32 mma, which reads the upper 19 bits:
// adding half a unit of the kept bits rounds the magnitude, the same bits as cvt.rna.tf32.f32 for finite x (which
// sm_90 emulates with a finiteness test and a predicated add per element)
__device__ __forceinline__ uint32_t toTf32(float x)
{
    return __float_as_uint(x) + 0x1000u;
}

// d += a * b, m16n8k8 tf32 (A 16x8 row: a0 (g, q) a1 (g+8, q) a2 (g, q+4) a3 (g+8, q+4);
// B 8x8 col: b0 (k=q, n=g) b1 (k=q+4, n=g); C as for m16n8k16)
__device__ __forceinline__ void mmaTf32(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc (16x16 as two n8 tiles, C layout) += A (16x16, row-major fp32 in shared memory, row stride lda)
// * B (16x16, row-major [k][n], stride ldb), on tf32 tensor cores.
__device__ __forceinline__ void mmaBlock16Tf32(
    float (&acc)[2][4], float const* A, int lda, float const* B, int ldb, int lane)
{
    int const g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
    {
        float const* a = A + 8 * kk + q;
        uint32_t const af[4] = {toTf32(a[g * lda]), toTf32(a[(g + 8) * lda]), toTf32(a[g * lda + 4]),
            toTf32(a[(g + 8) * lda + 4])};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
        {
            float const* bp = B + (8 * kk + q) * ldb + 8 * nt + g;
            mmaTf32(acc[nt], af, toTf32(bp[0]), toTf32(bp[4 * ldb]));
        }
    }
}

// A fragment of k16 step `kk` from fp32 accumulators acc[n8 tile][4] (two n8 tiles per k16 step).
template <typename T, int NT>
__device__ __forceinline__ void accToA(uint32_t (&a)[4], float const (&acc)[NT][4], int kk)
{
    a[0] = pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
    a[1] = pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
    a[2] = pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[3] = pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// Lane address for ldmatrix.x4 (non-trans) giving the B fragments of n8 tiles (2j, 2j+1) at k16
// step kk, from a row-major [n][k] tile: r[0],r[1] -> tile 2j; r[2],r[3] -> tile 2j+1.
template <typename T>
__device__ __forceinline__ T const* ldsmRowsNK(T const* base, int stride, int j, int kk, int lane)
{
    int const row = 16 * j + ((lane >> 4) << 3) + (lane & 7);
    int const col = 16 * kk + (((lane >> 3) & 1) << 3);
    return base + row * stride + col;
}

// Lane address for ldmatrix.x4.trans giving the B fragments of n8 tiles (2m, 2m+1) at k16 step kk
// from a row-major [k][n] tile (B[k][n] = tile[k][n]).
template <typename T>
__device__ __forceinline__ T const* ldsmRowsKN(T const* base, int stride, int m, int kk, int lane)
{
    int const row = 16 * kk + (((lane >> 3) & 1) << 3) + (lane & 7);
    int const col = 16 * m + ((lane >> 4) << 3);
    return base + row * stride + col;
}

} // namespace prefill_mma
} // namespace gdn
