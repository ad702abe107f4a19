// Pass 1 of the context-parallel prefill on warpgroup tensor cores (wgmma, sm_90a), private to gdnPrefill.cu: the
// same outputs as gdnPrefillCpKernel<.., false> (gdnPrefillCp.cuh): H_s (from a zero state; segment 0: from the
// initial state) and the transition M_s (from the identity, v = 0) of segments 0 .. G-2, no o. Per chunk only the
// recurrence of the wgmma scan (gdnPrefillScanWgmma.cuh):
//   P^T = S^T k^T (m64n64k16 x K/16) | X = v - e^G rk P (M_s columns: X = -e^G rk P); delta^T = X^T Tm'^T (x 4) |
//   S^T = e^{G_C} S^T + D^T k (m64n{K}k16 x 4)
// No q, Aqk or o tiles: a stage holds k, Tm', v (H_s columns only) and the factors, about 33 KB at K = 128, and a
// CTA is the math warpgroup plus one producer warp (160 threads), so that two CTAs share an SM (pass 1 has
// (G-1) x Hv x (V+K)/64 CTAs, more than the SMs at G = 8). The producer loads a full chunk by bulk tensor copies
// (the scan's tensor maps k, v, tm), a partial one (or a launch without maps) by cp.async with zero-filled rows.
#pragma once

#include "gdnPrefillCp.cuh"
#include "gdnPrefillScanWgmma.cuh"

namespace gdn
{
namespace prefill_cp
{

using namespace prefill_chunked;
using namespace prefill_wgmma;

constexpr int kCpWgThreads = 160;  // warps 0-3: math warpgroup; warp 4: producer

template <typename T, int K, int NS = kWgStages>
struct CpWgSmem
{
    struct Stage
    {
        T k[kC * K];  // swizzled tiles (swzOffset<64>), 1 KB aligned
        T tm[kC * kC];
        T v[kC * 64];
        float gq[kC][4];
    };
    Stage st[NS];
    uint64_t full[NS];
    uint64_t empty[NS];
};

// The producer warp: chunk c of the segment into stage c % NS once the math warps have released chunk c - NS
template <typename T, int K, int NS>
__device__ __forceinline__ void cpWgProduce(GdnPrefillParams const& p, ChunkWs const& ws, ScanTmaMaps const& maps,
    uint32_t st0, uint32_t full0, uint32_t empty0, int h, int hk, int vbase, bool loadV, SegRange const& seg, int lane)
{
    using St = typename CpWgSmem<T, K, NS>::Stage;
    int const Hv = p.Hv, V = p.V, nch = (seg.len + kC - 1) / kC;
    uint32_t const tmaBytes = uint32_t(sizeof(St::k) + sizeof(St::tm) + sizeof(St::gq) + (loadV ? sizeof(St::v) : 0));
    uint32_t phases = 0;
    for (int c = 0; c < nch; ++c)
    {
        int const si = c % NS;
        uint32_t const stAddr = st0 + si * uint32_t(sizeof(St)), full = full0 + 8u * si;
        if (c >= NS)
        {
            mbarWait(empty0 + 8u * si, (phases >> si) & 1u);
            phases ^= 1u << si;
        }
        int const t0 = seg.begin + c * kC, len = min(kC, seg.len - c * kC);
        int64_t const slot = (int64_t)(seg.id0 + c) * Hv + h;
        if (maps.use && len == kC)
        {
            if (lane == 0)
            {
                mbarArriveExpectTx(full, tmaBytes);
#pragma unroll
                for (int cb = 0; cb < K / 64; ++cb)
                    tmaLoad3d(stAddr + offsetof(St, k) + cb * (kC * 128), &maps.k, 64 * cb, hk, t0, full);
                tmaLoad3d(stAddr + offsetof(St, tm), &maps.tm, 0, 0, int(slot), full);
                if (loadV)
                    tmaLoad3d(stAddr + offsetof(St, v), &maps.v, vbase, h, t0, full, policyEvictFirst());
                bulkLoad(stAddr + offsetof(St, gq), ws.gq + slot * (4 * kC), kC * 4 * sizeof(float), full);
            }
            continue;
        }
        int64_t const qk0 = ((int64_t)t0 * p.Hk + hk) * K, qkRow = (int64_t)p.Hk * K;
        issueSwzTileWarp<K>(stAddr + offsetof(St, k), static_cast<uint16_t const*>(p.k) + qk0, qkRow, len, lane);
        if (loadV)
            issueSwzTileWarp<64>(stAddr + offsetof(St, v),
                static_cast<uint16_t const*>(p.v) + ((int64_t)t0 * Hv + h) * V + vbase, (int64_t)Hv * V, len, lane);
        issueSwzTileWarp<kC>(stAddr + offsetof(St, tm), static_cast<uint16_t const*>(ws.tm) + slot * (kC * kC), kC,
            kC, lane);
        issueFactors<32>(stAddr + offsetof(St, gq), ws, slot, lane);
        cpAsyncCommit();
        cpAsyncWaitAll();
        fenceProxyAsync();  // written by the generic proxy, read by wgmma
        __syncwarp();
        if (lane == 0)
            mbarArrive(full);
    }
}

// grid (N * (G-1), Hv, (V + K) / 64): z < V/64 the H_s columns, else the M_s columns (segment 0: none)
template <typename T, int K, int NS = kWgStages>
__global__ void __launch_bounds__(kCpWgThreads, 2) gdnPrefillCpPass1WgKernel(
    GdnPrefillParams const p, ChunkWs const ws, CpWs const cw, __grid_constant__ ScanTmaMaps const maps)
{
#if GDN_WGMMA
    using SM = CpWgSmem<T, K, NS>;
    using St = typename SM::Stage;
    constexpr int NKT = K / 8, KS16 = K / 16;
    extern __shared__ __align__(1024) unsigned char smemRaw[];
    auto& sm = *reinterpret_cast<SM*>(smemRaw + ((1024u - (smemAddr(smemRaw) & 1023u)) & 1023u));
    int const G = cw.segments, n = blockIdx.x / (G - 1), sg = blockIdx.x % (G - 1), h = blockIdx.y;
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const Hv = p.Hv, V = p.V, hk = h / (Hv / p.Hk);
    int const col0 = blockIdx.z * 64;  // first state column of the CTA in [H | M]
    bool const isM = col0 >= V;
    if (isM && sg == 0)
        return;  // the sequence's initial state is known: segment 0 needs no transition
    SegRange const seg = segRange(p, n, sg, G);
    int const nch = (seg.len + kC - 1) / kC;
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
    }
    __syncthreads();
    cpWaitPreviousGrid();  // the prep's workspace slots complete
    if (warp >= 4)
    {
        cpWgProduce<T, K, NS>(p, ws, maps, st0, full0, empty0, h, hk, isM ? 0 : col0, !isM, seg, lane);
        return;
    }

    // ---- math warpgroup (warps 0-3): warp w owns state columns col0 + 16w .. + 15
    int const vw = col0 + 16 * warp, gr = (lane >> 2), qd = lane & 3;
    float s[NKT][4];
    if (!isM)
        loadStateT(s, sg == 0 ? p.initialState : nullptr, ((int64_t)n * Hv + h) * K * V, V, vw, lane);
    else
    {
#pragma unroll
        for (int t = 0; t < NKT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[t][e] = (8 * t + 2 * qd + (e & 1)) == (vw - V + gr + 8 * (e >> 1)) ? 1.f : 0.f;
    }
    uint32_t const vLane = smemAddr(&sm.st[0].v[0]) + x4LaneOffset(warp, lane);
    uint32_t phases = 0;
    for (int c = 0; c < nch; ++c)
    {
        int const si = c % NS;
        mbarWait(full0 + 8u * si, (phases >> si) & 1u);
        phases ^= 1u << si;
        auto const& st = sm.st[si];
        uint32_t const sb = st0 + si * uint32_t(sizeof(St));
        uint32_t const aK = sb + offsetof(St, k);

        // P^T = S^T k^T
        uint32_t sa[KS16][4];
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            accToA<T>(sa[kk], s, kk);
        scaleState(s, st.gq[0][3]);  // S^T *= e^{G_C} ahead of the update
        float pa[8][4], da[8][4];
        wgFence();
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            Wgmma<T, 64, 0>::run(pa, sa[kk], descKMajor<kC>(aK, kk), kk > 0);
        wgCommit();
        wgWait<0>();
        fenceAcc(pa);
#pragma unroll
        for (int kk = 0; kk < KS16; ++kk)
            fenceRegs(sa[kk]);

        // X = v - e^G rk P (M_s columns: v = 0) ; delta^T = X^T Tm'^T
        if (isM)
            applyXZero(pa, st.gq, lane);
        else
            applyXld<T>(pa, st.gq, vLane + si * uint32_t(sizeof(St)), lane);
        uint32_t xa[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            accToA<T>(xa[kk], pa, kk);
        wgFence();
        wgProduct64<T>(da, xa, sb + offsetof(St, tm), false);
        wgCommit();
        wgWait<0>();
        fenceAcc(da);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            fenceRegs(xa[kk]);

        // S^T += (delta e^{G_C - G} rk)^T k
        scaleTokens(da, st.gq, 2, lane);
        uint32_t uA[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            accToA<T>(uA[kk], da, kk);
        wgFence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // B = k as [token][K]: MN-major
            Wgmma<T, K, 1>::run(s, uA[kk], descMNMajor<kC>(aK, kk), 1);
        wgCommit();
        wgWait<0>();
        fenceAcc(s);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            fenceRegs(uA[kk]);
        __syncwarp();  // every lane's reads of the stage are done before lane 0 releases it
        if (lane == 0)
            mbarArrive(empty0 + 8u * si);
    }
    storeStateT(s, cw.hm, ((int64_t)(n * (G - 1) + sg) * Hv + h) * K * (V + K), V + K, vw, lane);
#else
    (void)p, (void)ws, (void)cw, (void)maps;
    __trap();  // launched only where the sm_90a build runs
#endif
}

// Pass 1 on wgmma (K <= 128), on `stream` after the prep kernel (its programmatic dependent); then
// launchCp(.., pass1 = false, ..)
template <typename T, int K>
cudaError_t launchCpPass1Wg(
    GdnPrefillParams const& p, ChunkWs const& ws, CpWs const& cw, ScanTmaMaps const& maps, cudaStream_t stream)
{
    static_assert(K <= 128, "the wgmma pass 1 holds S^T of K <= 128 columns");
    int const G = cw.segments;
    if (int64_t(p.N) * (G - 1) > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    auto kern = gdnPrefillCpPass1WgKernel<T, K>;
    int const smem = int(sizeof(CpWgSmem<T, K>)) + 1024;  // + 1 KB: alignment slack for the swizzled tiles
    GDN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return cpLaunchDependent(kern, dim3(unsigned(p.N * (G - 1)), p.Hv, (p.V + K) / 64), kCpWgThreads, smem, stream, p,
        ws, cw, maps);
}

} // namespace prefill_cp
} // namespace gdn
