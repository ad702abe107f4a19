// Chunked prefill scan on warpgroup tensor cores (wgmma, sm_90a), private to gdnPrefill.cu.
//
// Same math, workspace and grid as gdnPrefillScanKernel<T, K, 4> (gdnPrefillChunked.cuh): one CTA per
// (sequence, value head, 64-column V-tile), S^T (64 value rows x K, fp32) in the accumulators of one
// warpgroup (warps 0-3; warp w owns value columns 16w..16w+15). Per chunk, with A operands packed from the
// fp32 accumulators and B operands read by descriptor from 128B-swizzled tiles (gdnPrefillWgmma.cuh),
// issued in this order (commit groups separated by |):
//   P^T  = S^T k^T              m64n64k16  x K/16   (B = k, K-major)          |
//   O1^T = S^T q^T              m64n64k16  x K/16   (B = q, K-major)          |
//   X = v - e^G rk P; delta^T = X^T Tm'^T           m64n64k16 x 4             | O1 *= e^G qs
//   S^T  = e^{G_C} S^T + D^T k  m64n{K}k16 x 4      (B = k, MN-major)
//   O^T += delta^T Aqk^T        m64n64k16  x 4                                | o of chunk c - 1 stored
// with D = delta e^{G_C - G} rk. One product's accumulators become the next one's A registers (same
// fragment layout as mma.sync).
// Warp-specialised: a second warpgroup holds the producer warp (4) and the store warp (5); the producer fills
// kWgStages shared-memory stages, chunk c + 2 streaming in while c runs: a full chunk by bulk tensor copies (TMA:
// one lane issues 8 box copies and one 1 KB bulk copy, completing on the stage's `full` mbarrier; the tensor maps
// write the 128B swizzle themselves), the last, partial chunk of a sequence (rows past its end must read as zero)
// and launches without tensor maps by cp.async from its 32 lanes. Beside the prep kernel it also waits on the
// prep's ready counters.
// The math warps wait only on `full` and release a stage on its `empty` mbarrier (one arrival per warp): no CTA
// barrier per chunk. Each chunk's o is packed at the chunk's end and stored in the shadow of the next chunk's state
// update: stmatrix.trans into a swizzled staging tile and an mbarrier arrival; the store warp issues one bulk tensor
// store of the 64x64 tile (wgScanStoreO). The CTA launches with kScanLaunchRegs registers per thread; the math
// warpgroup then takes kScanMathRegs (setmaxnreg), the other warpgroup kScanAuxRegs.
// Why this shape, and what was measured against it: docs/performance.md (wgmma scan).
// K in {64, 128} (K = 256 would need 128 accumulator registers for S^T alone: the mma.sync kernel).
#pragma once

#include "gdnPrefillChunked.cuh"
#include "gdnPrefillWgmma.cuh"

#include <cuda.h>  // CUtensorMap (the type only: the maps are encoded by gdnPrefill.cu)
#include <type_traits>

namespace gdn
{
namespace prefill_chunked
{

using namespace prefill_wgmma;

// Tensor maps of the scan's tiles (gdnPrefill.cu encodes them per launch; use = 0: none, every stage
// by cp.async). 16-bit elements, 128-byte swizzle, boxes of 64 columns x 64 rows:
//   q, k: [T][Hk][K] box (64, 1, 64) ; v, o: [T][Hv][V] box (64, 1, 64) ; tm, aqk: [slot][64][64] box (64, 64, 1)
struct ScanTmaMaps
{
    CUtensorMap q, k, v, tm, aqk, o;  // o: the same box as v, stored to
    int use;
};

template <typename T, int K, int NS = kWgStages>
struct WgScanSmem
{
    static constexpr int VT = 64;
    struct Stage
    {
        T k[kC * K];  // swizzled tiles (swzOffset<64>), 1 KB aligned
        T q[kC * K];
        T tm[kC * kC];
        T aqk[kC * kC];
        T v[kC * VT];
        float gq[kC][4];
    };
    static constexpr uint32_t kTmaBytes = uint32_t(sizeof(Stage));  // a full stage: every byte by bulk copy
    Stage st[NS];
    T ob[kC * VT];  // o staging: a swizzled [64 tokens][64 values] tile (1 KB aligned)
    uint64_t full[NS];  // per stage: completes when its data has landed
    uint64_t empty[NS]; // per stage: completes when the 4 math warps are done with it
    uint64_t oFull;   // the o tile: the 4 math warps have written it
    uint64_t oEmpty;  // the o tile: the store warp has read it
};

// Rows [0, len) of a [64][C] 16-bit row-major global tile (row stride gStride) into a swizzled tile at
// shared byte address dst by the 32 lanes of the producer warp (rows >= len zero-filled). Lanes 8 apart
// take the same 16 B column chunk of 8 consecutive rows: distinct banks after the swizzle.
template <int C>
__device__ __forceinline__ void issueSwzTileWarp(uint32_t dst, uint16_t const* g, int64_t gStride, int len, int lane)
{
    constexpr int CH = C / 8;  // 16-byte column chunks per row
#pragma unroll 4
    for (int i = 0; i < 2 * CH; ++i)
    {
        int const f = 32 * i + lane, rs = f & 7, rest = f >> 3, cb = rest % CH, r = 8 * (rest / CH) + rs;
        bool const ok = r < len;
        cpAsync16(dst + swzOffset<kC>(r, 8 * cb), ok ? g + r * gStride + 8 * cb : g, ok ? 16 : 0);
    }
}

// acc (64 x 64) (+)= A (64 x 64, four k16 register fragments) * B, B[k][n] = tile[n][k] from the
// swizzled 64x64 tile at shared address `tile`. (Skipping the zero upper blocks of the triangular Tm'
// and Aqk with m64n48/n32/n16 products on sub-ranges of the accumulators made ptxas serialise every
// wgmma (C7511), so the full products are issued.)
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t r);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t r)
{
    // a bf16 is the high half of an fp32: one shift and one mask (the intrinsic spent a permute and a
    // multiply on the high half)
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t r)
{
    return __half22float2(*reinterpret_cast<__half2 const*>(&r));
}

// Byte offset in a swizzled [64][64] 16-bit tile of this lane's row address for the first of four x4
// ldmatrix/stmatrix (.trans) ops over the warp's 16 columns: row (lane & 7) + 8 (lane >> 4), column
// 16 warp + 8 ((lane >> 3) & 1). Op j adds 2048 j (rows 16 apart: 2 KB, the same swizzle phase).
__device__ __forceinline__ uint32_t x4LaneOffset(int warp, int lane)
{
    return swzOffset<kC>((lane & 7) + 8 * (lane >> 4), 16 * warp + 8 * ((lane >> 3) & 1));
}

// X = v - e^G rk P with the warp's v columns read by ldmatrix.trans straight into the accumulator
// layout (matrix m of an x4: n8 blocks j + m/2, column half m%2); vLane: the v tile's address plus
// x4LaneOffset.
template <typename T>
__device__ __forceinline__ void applyXld(float (&pa)[8][4], float const (&gq)[kC][4], uint32_t vLane, int lane)
{
    int const qd = lane & 3;
#pragma unroll
    for (int jp = 0; jp < 4; ++jp)
    {
        uint32_t r[4];
        ldsmX4T(r, vLane + 2048u * jp);
#pragma unroll
        for (int m = 0; m < 4; ++m)
        {
            int const j = 2 * jp + (m >> 1), hh = m & 1;
            float2 const v2 = unpack2<T>(r[m]);
            pa[j][2 * hh] = v2.x - gq[8 * j + 2 * qd][0] * pa[j][2 * hh];
            pa[j][2 * hh + 1] = v2.y - gq[8 * j + 2 * qd + 1][0] * pa[j][2 * hh + 1];
        }
    }
}

template <typename T>
__device__ __forceinline__ void wgProduct64(float (&acc)[8][4], uint32_t const (&a)[4][4], uint32_t tile, bool accumulate)
{
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        Wgmma<T, 64, 0>::run(acc, a[kk], descKMajor<kC>(tile, kk), (accumulate || kk) ? 1 : 0);
}

// The store warp: chunk cc's o from the staging tile once the math warps have written it (oFull), by one bulk
// tensor store of the 64x64 tile (a full chunk with a tensor map: the copy engine writes 128-byte rows) or by
// 16-byte stores of its rows < len (the last, partial chunk of a sequence, whose rows past the end the map would
// write; launches without tensor maps); the tile is released (oEmpty) once read. The math warps rewrite the tile a
// chunk later, so one tile is enough. (A separate warp keeps the store's issue and read wait off the math warps'
// chain: docs/performance.md, o by a store warp.)
template <typename T>
__device__ __forceinline__ void wgScanStoreO(GdnPrefillParams const& p, uint32_t obuf, uint32_t oFull, uint32_t oEmpty,
    void const* oMap, uint64_t pol, int h, int vbase, int bos, int L, int lane)
{
    int const Hv = p.Hv, V = p.V, nch = (L + kC - 1) / kC;
    for (int cc = 0; cc < nch; ++cc)
    {
        int const len = min(kC, L - cc * kC);
        mbarWait(oFull, cc & 1);
        if (oMap != nullptr && len == kC)
        {
            if (lane == 0)
            {
                // (initcheck does not count bulk stores as writes: it reports later reads of these rows,
                // sync_patterns.cu mode tma_store; the GPU tests check every element is written)
                tmaStore3d(oMap, obuf, vbase, h, bos + cc * kC, pol);
                bulkCommit();
                bulkWaitRead();
            }
        }
        else
        {
            T* const og = static_cast<T*>(p.o) + ((int64_t)(bos + cc * kC) * Hv + h) * V + vbase;
            int64_t const ld = (int64_t)Hv * V;
#pragma unroll 4
            for (int it = 0; it < 16; ++it)
            {
                int const f = 32 * it + lane, r = f >> 3, col = 8 * (f & 7);
                if (r < len)
                {
                    uint4 x;
                    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                                 : "r"(obuf + swzOffset<kC>(r, col)));
                    *reinterpret_cast<uint4*>(og + r * ld + col) = x;
                }
            }
        }
        __syncwarp();
        if (lane == 0)
            mbarArrive(oEmpty);
    }
    if (lane == 0)
        bulkWaitAll();  // the bulk stores have completed (before the CTA's shared memory goes)
}

// The producer warp of both wgmma scans: chunk c into stage c % NS once the consumers have released chunk
// c - NS (the stage's `empty` mbarrier). Beside the prep kernel (ws.ctl set), chunks cb .. cb + kReadyBlock - 1 (cb
// a multiple of kReadyBlock) are loaded only after their block counter shows every prep item of the block
// done (acquire loads by lane 0).
template <typename T, int K, int NS>
__device__ __forceinline__ void wgScanProduce(GdnPrefillParams const& p, ChunkWs const& ws, ScanTmaMaps const& maps,
    uint32_t st0, uint32_t full0, uint32_t empty0, int h, int hk, int vbase, int bos, int L, int id0, int lane)
{
    using SM = WgScanSmem<T, K, NS>;
    using St = typename SM::Stage;
    int const Hv = p.Hv, V = p.V, nch = (L + kC - 1) / kC;
    int const* ready = ws.ctl ? readyCounter(ws, p, hk, id0) : nullptr;
    int* const consumed = ws.ctl ? consumedCounter(ws, p, hk, id0) : nullptr;
    uint32_t phases = 0;
    // beside the prep: the prep items of this sequence's chunks come only if the prep attributes every chunk id to
    // it; garbage cu_seqlens can make sequences overlap, and then the scan does not wait (its data is garbage)
    bool const owned
        = lane == 0 && ready != nullptr && seqOwnsItsChunks(p.cuSeqlens, p.N, blockIdx.x / ws.segments, id0, nch);
    uint64_t const vPolicy = policyEvictFirst();  // v is read once
    for (int c = 0; c < nch; ++c)
    {
        int const si = c % NS;
        uint32_t const stAddr = st0 + si * uint32_t(sizeof(St)), full = full0 + 8u * si;
        if (c >= NS)
        {
            mbarWait(empty0 + 8u * si, (phases >> si) & 1u);
            phases ^= 1u << si;
        }
        if (ready != nullptr && c % kReadyBlock == 0)
        {
            if (lane == 0)
            {
                int const want = owned ? min(kReadyBlock, nch - c) : 0;
                while (loadAcquire(ready + c) < want)
                    __nanosleep(64);
                fenceProxyAsyncGlobal();  // the prep's stores, read next by bulk copies
                if (ws.throttle > 0)
                    addRelease(consumed + c, 1);  // progress, for the prep's throttle
            }
            __syncwarp();
        }
        int const t0 = bos + c * kC, len = min(kC, L - c * kC);
        int64_t const slot = (int64_t)(id0 + c) * Hv + h;
        if (maps.use && len == kC)
        {
            if (lane == 0)
            {
                mbarArriveExpectTx(full, SM::kTmaBytes);
#pragma unroll
                for (int cb = 0; cb < K / 64; ++cb)
                {
                    tmaLoad3d(stAddr + offsetof(St, k) + cb * (kC * 128), &maps.k, 64 * cb, hk, t0, full);
                    tmaLoad3d(stAddr + offsetof(St, q) + cb * (kC * 128), &maps.q, 64 * cb, hk, t0, full);
                }
                tmaLoad3d(stAddr + offsetof(St, tm), &maps.tm, 0, 0, int(slot), full);
                tmaLoad3d(stAddr + offsetof(St, aqk), &maps.aqk, 0, 0, int(slot), full);
                tmaLoad3d(stAddr + offsetof(St, v), &maps.v, vbase, h, t0, full, vPolicy);
                bulkLoad(stAddr + offsetof(St, gq), ws.gq + slot * (4 * kC), kC * 4 * sizeof(float), full);
                // beside the prep: v of chunk c + kL2Ahead into L2 (q, k and the slot are in L2 already, where
                // the prep left them; after the prep, prefetching every tile was slower for batches of sequences)
                if (ready != nullptr && c + kL2Ahead < nch)
                    tmaPrefetch3d(&maps.v, vbase, h, t0 + kL2Ahead * kC);
            }
            continue;
        }
        int64_t const qk0 = ((int64_t)t0 * p.Hk + hk) * K, qkRow = (int64_t)p.Hk * K;
        issueSwzTileWarp<K>(stAddr + offsetof(St, k), static_cast<uint16_t const*>(p.k) + qk0, qkRow, len, lane);
        issueSwzTileWarp<K>(stAddr + offsetof(St, q), static_cast<uint16_t const*>(p.q) + qk0, qkRow, len, lane);
        issueSwzTileWarp<SM::VT>(stAddr + offsetof(St, v),
            static_cast<uint16_t const*>(p.v) + ((int64_t)t0 * Hv + h) * V + vbase, (int64_t)Hv * V, len, lane);
        issueSwzTileWarp<kC>(stAddr + offsetof(St, tm), static_cast<uint16_t const*>(ws.tm) + slot * (kC * kC), kC,
            kC, lane);
        issueSwzTileWarp<kC>(stAddr + offsetof(St, aqk), static_cast<uint16_t const*>(ws.aqk) + slot * (kC * kC),
            kC, kC, lane);
        issueFactors<32>(stAddr + offsetof(St, gq), ws, slot, lane);
        // (racecheck reports these writes against the math warps' reads of the stage: it does not model the
        // full / empty mbarrier hand-off; tests/kernels/sanitizer/sync_patterns.cu, mode mbar_cpasync)
        cpAsyncCommit();
        cpAsyncWaitAll();
        fenceProxyAsync();  // written by the generic proxy, read by wgmma
        __syncwarp();
        if (lane == 0)
            mbarArrive(full);
    }
}

template <typename T, int K, int NS = kWgStages>
__global__ void __maxnreg__(kScanLaunchRegs) gdnPrefillScanWgKernel(
    GdnPrefillParams const p, ChunkWs const ws, __grid_constant__ ScanTmaMaps const maps)
{
#if GDN_WGMMA
    using SM = WgScanSmem<T, K, NS>;
    using St = typename SM::Stage;
    constexpr int NKT = K / 8, KS16 = K / 16;
    extern __shared__ __align__(1024) unsigned char smemRaw[];
    // the swizzle atoms need 1 KB alignment: the launch adds 1 KB of slack
    auto& sm = *reinterpret_cast<SM*>(smemRaw + ((1024u - (smemAddr(smemRaw) & 1023u)) & 1023u));
    int const G = ws.segments, n = blockIdx.x / G, sg = blockIdx.x % G;  // (G > 1: context-parallel pass 2)
    int const h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const Hv = p.Hv, V = p.V, hk = h / (Hv / p.Hk);
    int const vbase = blockIdx.z * SM::VT;
    SegRange const seg = segRange(p, n, sg, G);
    int const bos = seg.begin, L = seg.len;
    int const nch = (L + kC - 1) / kC, id0 = seg.id0;
    uint32_t const st0 = smemAddr(&sm.st[0]);
    uint32_t const full0 = smemAddr(&sm.full[0]), empty0 = smemAddr(&sm.empty[0]);
    if (threadIdx.x == 0)
    {
#pragma unroll
        for (int i = 0; i < NS; ++i)
        {
            mbarInit(full0 + 8u * i, 1);
            mbarInit(empty0 + 8u * i, 4);
        }
        mbarInit(smemAddr(&sm.oFull), 4);
        mbarInit(smemAddr(&sm.oEmpty), 1);
    }
    __syncthreads();

    if (warp >= 4)
    {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kScanAuxRegs));
        if (warp == 4)
            wgScanProduce<T, K, NS>(p, ws, maps, st0, full0, empty0, h, hk, vbase, bos, L, id0, lane);
        else if (warp == 5)  // o (written once) is evicted first from L2 beside the prep
            wgScanStoreO<T>(p, smemAddr(&sm.ob[0]), smemAddr(&sm.oFull), smemAddr(&sm.oEmpty),
                maps.use ? &maps.o : nullptr, ws.ctl != nullptr ? policyEvictFirst() : 0, h, vbase, bos, L, lane);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kScanMathRegs));

    // ---- math warpgroup (warps 0-3)
    int const vw = vbase + 16 * warp;
    float s[NKT][4];
    int64_t const sbase = ((int64_t)n * Hv + h) * K * V;
    if (G > 1)
    {
        // context-parallel pass 2, when launched as the programmatic dependent of the fix-up (kCpProgrammaticLaunch;
        // the fix-up had waited for every kernel before it, so the producer's tiles are complete): segInit after it
        asm volatile("griddepcontrol.wait;" ::: "memory");
        loadStateT(s, ws.segInit, ((int64_t)(n * G + sg) * Hv + h) * K * V, V, vw, lane);
    }
    else
        loadStateT(s, p.initialState, sbase, V, vw, lane);
    uint32_t const vLane = smemAddr(&sm.st[0].v[0]) + x4LaneOffset(warp, lane);
    // o of the previous chunk, packed: written to the staging tile in the shadow of this chunk's state update
    // (stmatrix.trans into the swizzled [64 tokens][64 values] layout of the tensor map's box, each warp its 16
    // columns), then handed to the store warp
    uint32_t op[4][4];
    uint32_t const oLane = smemAddr(&sm.ob[0]) + x4LaneOffset(warp, lane);
    uint32_t const oFull = smemAddr(&sm.oFull), oEmpty = smemAddr(&sm.oEmpty);
    auto storeO = [&](int cc)
    {
        if (cc > 0)
            mbarWait(oEmpty, (cc - 1) & 1);  // the store warp has read chunk cc - 1's o
#pragma unroll
        for (int j = 0; j < 4; ++j)
            stsmX4T(oLane + 2048u * j, op[j][0], op[j][1], op[j][2], op[j][3]);
        fenceProxyAsync();  // written by the generic proxy, read by the copy engine
        __syncwarp();
        if (lane == 0)
            mbarArrive(oFull);
    };
    uint32_t phases = 0;
    for (int c = 0; c < nch; ++c)
    {
        int const si = c % NS;
        mbarWait(full0 + 8u * si, (phases >> si) & 1u);
        phases ^= 1u << si;
        auto const& st = sm.st[si];
        uint32_t const sb = st0 + si * uint32_t(sizeof(St));
        uint32_t const aK = sb + offsetof(St, k), aQ = sb + offsetof(St, q);

        // P^T = S^T k^T and O1^T = S^T q^T (P is on the recurrence: its own commit group)
        uint32_t sa[KS16][4];
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            accToA<T>(sa[kk], s, kk);
        // S^T *= e^{G_C} ahead of the update (here, not in the shadow of P: ptxas would wait for the
        // in-flight wgmma before touching registers a wgmma once defined, C7517)
        scaleState(s, st.gq[0][3]);
        float pa[8][4], oa[8][4], da[8][4];
        wgFence();
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            Wgmma<T, 64, 0>::run(pa, sa[kk], descKMajor<kC>(aK, kk), kk > 0);
        wgCommit();
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            Wgmma<T, 64, 0>::run(oa, sa[kk], descKMajor<kC>(aQ, kk), kk > 0);
        wgCommit();
        wgWait<1>();
        fenceAcc(pa);

        // X = v - e^G rk P ; delta^T = X^T Tm'^T
        applyXld<T>(pa, st.gq, vLane + si * uint32_t(sizeof(St)), lane);
        uint32_t xa[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            accToA<T>(xa[kk], pa, kk);
        wgFence();
        wgProduct64<T>(da, xa, sb + offsetof(St, tm), false);
        wgCommit();
        wgWait<1>();  // O1 done, delta may run
        fenceAcc(oa);
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            fenceRegs(sa[kk]);
        applyO1(oa, st.gq, lane);
        wgWait<0>();
        fenceAcc(da);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            fenceRegs(xa[kk]);

        // S^T += (delta e^{G_C - G} rk)^T k (recurrence first), then O^T += delta^T Aqk^T
        uint32_t dA[4][4], uA[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            accToA<T>(dA[kk], da, kk);
        scaleTokens(da, st.gq, 2, lane);  // delta e^{G_C - G} rk (S^T was scaled by e^{G_C} above)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            accToA<T>(uA[kk], da, kk);
        wgFence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // B = k as [token][K]: MN-major
            Wgmma<T, K, 1>::run(s, uA[kk], descMNMajor<kC>(aK, kk), 1);
        wgCommit();
        wgProduct64<T>(oa, dA, sb + offsetof(St, aqk), true);
        wgCommit();
        if (c > 0)
            storeO(c - 1);  // while the tensor cores finish S and O2
        wgWait<0>();
        fenceAcc(oa);
        fenceAcc(s);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
        {
            fenceRegs(dA[kk]);
            fenceRegs(uA[kk]);
        }
        // every read of the stage is done (the wgmma waited, the loads used); the warp barrier orders the other
        // lanes' reads of v and the factors before lane 0's release
        __syncwarp();
        if (lane == 0)
            mbarArrive(empty0 + 8u * si);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            accToA<T>(op[j], oa, j);
    }
    if (nch > 0)
        storeO(nch - 1);
    if (sg == G - 1)
        storeStateT(s, p.finalState, sbase, V, vw, lane);
    // launched as the programmatic dependent of the prep kernel: end only after it has (so the work
    // after this kernel in the stream also follows the prep kernel)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#else
    (void)p, (void)ws, (void)maps;
    __trap();  // launched only where the sm_90a build runs (gdnPrefillWgmmaAvailable)
#endif
}

} // namespace prefill_chunked
} // namespace gdn
