// Chunked prefill scan on warpgroup tensor cores (wgmma, sm_90a), private to gdnPrefill.cu.
//
// Same math, workspace and grid as gdnPrefillScanKernel<T, K, 4> (gdnPrefillChunked.cuh): one CTA per
// (sequence, value head, 64-column V-tile), S^T (64 value rows x K, fp32) in the accumulators of one
// warpgroup (warp w owns value columns 16w..16w+15). Per chunk, with A operands packed from the
// fp32 accumulators and B operands read by descriptor from 128B-swizzled tiles (gdnPrefillWgmma.cuh),
// issued in this order (commit groups separated by |):
//   P^T  = S^T k^T              m64n64k16  x K/16   (B = k, K-major)          | then
//   O1^T = S^T q^T              m64n64k16  x K/16   (B = q, K-major)          | the loads of chunk c+2
//   X = v - e^G rk P; delta^T = X^T Tm'^T           m64n64k16 x 4             | O1 *= e^G qs
//   S^T  = e^{G_C} S^T + D^T k  m64n{K}k16 x 4      (B = k, MN-major)
//   O^T += delta^T Aqk^T        m64n64k16  x 4                                | o store
// with D = delta e^{G_C - G} rk. One product's accumulators become the next one's A registers (same
// fragment layout as mma.sync). Tiles: 3 shared-memory stages, chunk c + 2 streaming in while c runs. A
// full chunk comes by bulk tensor copies (TMA: thread 0 issues 8 box copies and one 1 KB bulk copy, all
// completing on the stage's mbarrier; the tensor maps write the 128B swizzle themselves); the last,
// partial chunk of a sequence (rows past its end must read as zero) and launches without tensor maps
// use cp.async from every thread. ncu put 32% of the scan's stall samples on issuing those cp.async
// (their source registers held until the copy engine took them); the bulk copies removed that.
// Measured and dropped (benchmarks/notes_prefill.md): a second warpgroup for the O products, a
// loader warp for the copies (2 or 3 stages), m64n48/32/16 products that skip the zero blocks of the
// triangular Tm' and Aqk (ptxas then serialises every wgmma), o stores moved into the next chunk's
// P shadow (no gain).
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
//   q, k: [T][Hk][K] box (64, 1, 64) ; v: [T][Hv][V] box (64, 1, 64) ; tm, aqk: [slot][64][64] box (64, 64, 1)
struct ScanTmaMaps
{
    CUtensorMap q, k, v, tm, aqk;
    int use;
};

constexpr int kWgStages = 3;  // shared-memory stages: chunk c + 2 streams in while chunk c runs

template <typename T, int K, int NS = kWgStages>
struct WgScanSmem
{
    static constexpr int VT = 64, OS = 16 + 8;
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
    T out[4][kC][OS];
    uint64_t bar[NS];  // per stage: completes when its bulk copies have landed
};

// Rows [0, len) of a [64][C] 16-bit row-major global tile (row stride gStride) into a swizzled tile
// at shared byte address dst (rows >= len zero-filled). Lanes 8 apart take the same 16 B column chunk
// of 8 consecutive rows: distinct banks after the swizzle.
template <int C, bool FULL>
__device__ __forceinline__ void issueSwzTile(uint32_t dst, uint16_t const* g, int64_t gStride, int len)
{
    constexpr int CH = C / 8, GPP = 128 / (8 * CH);  // column chunks; row groups per pass
    static_assert(GPP >= 1 && 128 % (8 * CH) == 0, "tile split");
    int const tid = threadIdx.x, rs = tid & 7, cb = (tid >> 3) % CH, rg = (tid >> 3) / CH;
    int const r0 = 8 * rg + rs;
    uint16_t const* src = g + r0 * gStride + 8 * cb;
    int64_t const step = 8 * GPP * gStride;
    dst += swzOffset<kC>(r0, 8 * cb);
#pragma unroll
    for (int pass = 0; pass < kC / (8 * GPP); ++pass)
    {
        if (FULL)
            cpAsync16(dst + pass * GPP * 1024u, src, 16);
        else
        {
            bool const ok = r0 + pass * 8 * GPP < len;
            cpAsync16(dst + pass * GPP * 1024u, ok ? src : g, ok ? 16 : 0);
        }
        src += step;
    }
}

// The tiles of chunk (slot, t0, len) into the stage at stAddr. tma (a full chunk, tensor maps encoded):
// thread 0 issues bulk tensor copies completing on `bar`; else every thread issues cp.async with rows
// >= len zero-filled (the last chunk of a sequence, or no maps).
template <typename T, int K>
__device__ __forceinline__ void wgIssueStage(uint32_t stAddr, uint32_t bar, bool tma, ScanTmaMaps const& maps,
    GdnPrefillParams const& p, ChunkWs const& ws, int64_t slot, int t0, int len, int h, int hk, int vbase)
{
    using SM = WgScanSmem<T, K>;
    using St = typename SM::Stage;
    if (tma)
    {
        if (threadIdx.x == 0)
        {
            mbarArriveExpectTx(bar, SM::kTmaBytes);
#pragma unroll
            for (int cb = 0; cb < K / 64; ++cb)
            {
                tmaLoad3d(stAddr + offsetof(St, k) + cb * (kC * 128), &maps.k, 64 * cb, hk, t0, bar);
                tmaLoad3d(stAddr + offsetof(St, q) + cb * (kC * 128), &maps.q, 64 * cb, hk, t0, bar);
            }
            tmaLoad3d(stAddr + offsetof(St, tm), &maps.tm, 0, 0, int(slot), bar);
            tmaLoad3d(stAddr + offsetof(St, aqk), &maps.aqk, 0, 0, int(slot), bar);
            tmaLoad3d(stAddr + offsetof(St, v), &maps.v, vbase, h, t0, bar);
            bulkLoad(stAddr + offsetof(St, gq), ws.gq + slot * (4 * kC), kC * 4 * sizeof(float), bar);
        }
        return;
    }
    int64_t const qkRow = (int64_t)p.Hk * K;
    int64_t const qk0 = ((int64_t)t0 * p.Hk + hk) * K;
    int64_t const v0 = ((int64_t)t0 * p.Hv + h) * p.V + vbase;
    auto rows = [&](auto full)  // the token-row tiles: unpredicated for a full chunk
    {
        constexpr bool FULL = decltype(full)::value;
        issueSwzTile<K, FULL>(stAddr + offsetof(St, k), static_cast<uint16_t const*>(p.k) + qk0, qkRow, len);
        issueSwzTile<K, FULL>(stAddr + offsetof(St, q), static_cast<uint16_t const*>(p.q) + qk0, qkRow, len);
        issueSwzTile<SM::VT, FULL>(stAddr + offsetof(St, v), static_cast<uint16_t const*>(p.v) + v0,
            (int64_t)p.Hv * p.V, len);
    };
    if (len == kC)
        rows(std::true_type{});
    else
        rows(std::false_type{});
    issueSwzTile<kC, true>(stAddr + offsetof(St, tm), static_cast<uint16_t const*>(ws.tm) + slot * (kC * kC), kC, kC);
    issueSwzTile<kC, true>(stAddr + offsetof(St, aqk), static_cast<uint16_t const*>(ws.aqk) + slot * (kC * kC), kC, kC);
    issueFactors(stAddr + offsetof(St, gq), ws, slot);
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
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&r));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t r)
{
    return __half22float2(*reinterpret_cast<__half2 const*>(&r));
}

// X = v - e^G rk P with the warp's v columns read by ldmatrix.trans straight into the accumulator
// layout (matrix m of an x4: n8 blocks j + m/2, column half m%2); vLane: this lane's row address
// of the first x4 (row (lane & 7) + 8 (lane >> 4), column 8 ((lane >> 3) & 1) of the warp's 16) in
// the swizzled v tile (rows 16 apart: 2 KB apart, same swizzle).
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

template <typename T, int K, int NS = kWgStages>
__global__ void __launch_bounds__(128, 1) gdnPrefillScanWgKernel(
    GdnPrefillParams const p, ChunkWs const ws, __grid_constant__ ScanTmaMaps const maps)
{
#if GDN_WGMMA
    using SM = WgScanSmem<T, K, NS>;
    using St = typename SM::Stage;
    constexpr int NKT = K / 8, KS16 = K / 16;
    extern __shared__ __align__(1024) unsigned char smemRaw[];
    // the swizzle atoms need 1 KB alignment: the launch adds 1 KB of slack
    auto& sm = *reinterpret_cast<SM*>(smemRaw + ((1024u - (smemAddr(smemRaw) & 1023u)) & 1023u));
    int const n = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const Hv = p.Hv, V = p.V, hk = h / (Hv / p.Hk);
    int const vbase = blockIdx.z * SM::VT, vw = vbase + 16 * warp;
    int const bos = p.cuSeqlens[n], L = p.cuSeqlens[n + 1] - bos;
    int const nch = (L + kC - 1) / kC, id0 = bos / kC + n;

    float s[NKT][4];
    int64_t const sbase = ((int64_t)n * Hv + h) * K * V;
    loadStateT(s, p.initialState, sbase, V, vw, lane);

    uint32_t const st0 = smemAddr(&sm.st[0]);
    int const mrow = 8 * (lane >> 4) + (lane & 7), mcol = 8 * ((lane >> 3) & 1);
    uint32_t const aOut = smemAddr(&sm.out[warp][0][0]) + 2u * (mrow * SM::OS + mcol);
    // Beside the prep kernel (ws.ctl set), chunks cb .. cb + 7 (cb a multiple of kReadyBlock) are read
    // only after their block counter shows every prep item of the block done: thread 0 spins on it with
    // acquire loads before the barrier that precedes the block's first stage issue (one exposed L2 round
    // trip per 8 chunks; a load in flight across the wgmma fences would stall every chunk).
    int const* ready = ws.ctl ? readyCounter(ws, p, hk, id0) : nullptr;
    auto waitBlock = [&](int cb)
    {
        if (threadIdx.x == 0)
        {
            int const want = min(kReadyBlock, nch - cb);
            while (loadAcquire(ready + cb) < want)
                __nanosleep(64);
            fenceProxyAsyncGlobal();  // the prep's stores, read next by this thread's bulk copies
        }
    };
    uint32_t const bar0 = smemAddr(&sm.bar[0]);
    if (threadIdx.x == 0)
    {
#pragma unroll
        for (int i = 0; i < NS; ++i)
            mbarInit(bar0 + 8u * i, 1);
    }
    if (nch > 0 && ready != nullptr)
        waitBlock(0);
    __syncthreads();
    // Chunk c lives in stage c % NS. Chunks c + 1 .. c + NS - 1 are in flight while c runs; one cp.async
    // group is committed per issued chunk (empty for bulk copies). A stage that came by bulk copy (a full
    // chunk with tensor maps) is waited on its barrier (phase bit per stage), one by cp.async with wait_group.
    auto byTma = [&](int c) { return maps.use && L - c * kC >= kC; };
    auto issue = [&](int c)
    {
        if (c < nch)
        {
            int const si = c % NS;
            wgIssueStage<T, K>(st0 + si * uint32_t(sizeof(St)), bar0 + 8u * si, byTma(c), maps, p, ws,
                (int64_t)(id0 + c) * Hv + h, bos + c * kC, min(kC, L - c * kC), h, hk, vbase);
        }
        cpAsyncCommit();
    };
    uint32_t phases = 0;
#pragma unroll
    for (int c = 0; c < NS - 1; ++c)
        issue(c);

    int const vr = (lane & 7) + 8 * (lane >> 4), vc = 16 * warp + 8 * ((lane >> 3) & 1);
    uint32_t const vLane = smemAddr(&sm.st[0].v[0]) + swzOffset<kC>(vr, vc);
    for (int c = 0; c < nch; ++c)
    {
        int const si = c % NS;
        if (ready != nullptr && c + NS - 1 < nch && (c + NS - 1) % kReadyBlock == 0)
            waitBlock(c + NS - 1);  // the stage issued below starts a block
        cpAsyncWaitGroup<NS - 2>();
        if (byTma(c))
        {
            mbarWait(bar0 + 8u * si, (phases >> si) & 1u);
            phases ^= 1u << si;
        }
        fenceProxyAsync();
        __syncthreads();
        auto const& st = sm.st[si];
        int const len = min(kC, L - c * kC);
        uint32_t const sb = st0 + si * uint32_t(sizeof(St));
        uint32_t const aK = sb + offsetof(St, k), aQ = sb + offsetof(St, q);

        // P^T = S^T k^T and O1^T = S^T q^T (P is on the recurrence: its own commit group)
        uint32_t sa[KS16][4];
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            accToA<T>(sa[kk], s, kk);
        {
            // S^T *= e^{G_C} ahead of the update (here, not in the shadow of P: ptxas would wait for
            // the in-flight wgmma before touching registers a wgmma once defined, C7517)
            scaleState(s, st.gq[0][3]);
        }
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
        // in the shadow of P and O1: the loads of chunk c + NS - 1
        issue(c + NS - 1);
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
        wgWait<0>();
        fenceAcc(oa);
        fenceAcc(s);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
        {
            fenceRegs(dA[kk]);
            fenceRegs(uA[kk]);
        }
        storeOTile<T, SM::OS>(oa, sm.out[warp], aOut, static_cast<T*>(p.o) + ((int64_t)(bos + c * kC) * Hv + h) * V + vw,
            (int64_t)Hv * V, len, lane);
    }
    cpAsyncWaitAll();
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
