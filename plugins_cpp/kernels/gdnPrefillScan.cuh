// Chunk scan kernel of the chunked prefill (16-bit I/O), private to gdnPrefill.cu; the workspace
// (Tm', Aqk, G / qs / rk per chunk and value head) comes from the prep kernel (gdnPrefillChunked.cuh).
//
// One CTA per (sequence, value head, V-tile of 16 * NCG columns), sequential over the chunks.
// NCG column groups of 16 value columns; each column group is split over KSPLIT warps along K, so a
// CTA has NCG * KSPLIT warps. Warp (cg, kh) keeps rows [kh K/KSPLIT, (kh+1) K/KSPLIT) of S for its 16
// columns as S^T (16 x K/KSPLIT, fp32) in mma accumulators, which double as A fragments:
//   P^T = S^T k^T, O1^T = S^T q^T      (K-partial per warp; partials summed through shared memory)
//   X = v - e^G rk P ; delta^T = X^T Tm'^T          (every warp of the group, identical operands)
//   o^T = (e^G qs) O1^T + delta^T Aqk^T             (the last warp of the group only)
//   S^T = e^{G_C} S^T + (delta e^{G_C - G} rk)^T k  (each warp its K rows)
// KSPLIT = 1 is the previous one-warp-per-column-group kernel. Splitting K gives more, shorter warps
// (per warp and chunk, K=128: 232 mma for KSPLIT 1, ~136 for 2, ~88 for 4) for one named-barrier
// exchange per chunk. Raw q, k, v tiles and the next workspace slot stream in by cp.async (double
// buffer); norms, scale and decays are applied to the accumulators, never to the operands.
#pragma once

#include "gdnPrefillChunked.cuh"

namespace gdn
{
namespace prefill_chunked
{

template <typename T, int K, int NCG, int KSPLIT>
struct ScanSmem
{
    static constexpr int NW = NCG * KSPLIT, KS = K + 8, VT = 16 * NCG, VS = VT + 8, CS = kC + 8, OS = 16 + 8;
    static constexpr int NX = KSPLIT > 1 ? NCG * KSPLIT : 1;  // exchange buffers (P and O1 partials)
    struct Stage
    {
        T k[kC][KS];
        T q[kC][KS];
        T v[kC][VS];
        T tm[kC][CS];
        T aqk[kC][CS];
        float gq[3][kC];
    };
    Stage st[2];
    T out[NCG][kC][OS];
    float xp[NX][32][32];  // [cg * KSPLIT + kh][fragment element][lane]
    float xo[NX][32][32];
};

// Rows [0, len) of a [rows][CH*8] 16-bit tile from global rows `g + r * gStride` into shared rows of
// `sStride` elements at byte address `dst` (rows >= len zero-filled). Per-thread offsets are fixed, so
// each pass is one pointer add and one cp.async.
template <int CH, int NT>
__device__ __forceinline__ void issueTile(uint32_t dst, int sStride, uint16_t const* g, int64_t gStride, int len)
{
    constexpr int RP = NT / CH;  // rows per pass
    static_assert(NT % CH == 0 && kC % RP == 0, "tile split");
    int const tid = threadIdx.x, r0 = tid / CH, cc = (tid % CH) * 8;
    uint16_t const* src = g + r0 * gStride + cc;
    dst += 2u * (r0 * sStride + cc);
#pragma unroll
    for (int pass = 0; pass < kC / RP; ++pass)
    {
        bool const ok = r0 + pass * RP < len;
        cpAsync16(dst + 2u * pass * RP * sStride, ok ? src + pass * RP * gStride : g, ok ? 16 : 0);
    }
}

template <typename SM>
__device__ __forceinline__ void scanIssueStage(uint32_t stAddr, GdnPrefillParams const& p, ChunkWs const& ws,
    int64_t slot, int t0, int len, int h, int hk, int vbase)
{
    using St = typename SM::Stage;
    constexpr int NT = 32 * SM::NW, KC = SM::KS - 8;
    int64_t const qkRow = (int64_t)p.Hk * KC, vRow = (int64_t)p.Hv * p.V;
    int64_t const qk0 = ((int64_t)t0 * p.Hk + hk) * KC;
    issueTile<KC / 8, NT>(stAddr + offsetof(St, k), SM::KS, static_cast<uint16_t const*>(p.k) + qk0, qkRow, len);
    issueTile<KC / 8, NT>(stAddr + offsetof(St, q), SM::KS, static_cast<uint16_t const*>(p.q) + qk0, qkRow, len);
    issueTile<SM::VT / 8, NT>(stAddr + offsetof(St, v), SM::VS,
        static_cast<uint16_t const*>(p.v) + ((int64_t)t0 * p.Hv + h) * p.V + vbase, vRow, len);
    issueTile<kC / 8, NT>(stAddr + offsetof(St, tm), SM::CS, static_cast<uint16_t const*>(ws.tm) + slot * (kC * kC),
        kC, kC);
    issueTile<kC / 8, NT>(stAddr + offsetof(St, aqk), SM::CS,
        static_cast<uint16_t const*>(ws.aqk) + slot * (kC * kC), kC, kC);
    float const* gq = ws.gq + slot * (3 * kC);
    if (threadIdx.x < 3 * kC / 4)
        cpAsync16(stAddr + offsetof(St, gq) + 16u * threadIdx.x, gq + 4 * threadIdx.x, 16);
}

// Barrier of the KSPLIT warps of one column group (ids 1.. ; id 0 is __syncthreads).
template <int KSPLIT>
__device__ __forceinline__ void groupBarrier(int cg)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + cg), "r"(32 * KSPLIT) : "memory");
}

template <typename T, int K, int NCG, int KSPLIT>
__global__ void __launch_bounds__(32 * NCG * KSPLIT, 1) gdnPrefillScanKernel(GdnPrefillParams const p, ChunkWs const ws)
{
    using SM = ScanSmem<T, K, NCG, KSPLIT>;
    constexpr int KS = SM::KS, CS = SM::CS, KW = K / KSPLIT, NKT = KW / 8;  // NKT: n8 tiles of S^T per warp
    static_assert(KW % 16 == 0, "K split");
    extern __shared__ __align__(16) unsigned char smemRaw[];
    auto& sm = *reinterpret_cast<SM*>(smemRaw);
    int const n = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const cg = warp % NCG, kh = warp / NCG;
    bool const outWarp = kh == KSPLIT - 1;
    int const Hv = p.Hv, V = p.V, hk = h / (Hv / p.Hk);
    int const vbase = blockIdx.z * SM::VT;
    int const bos = p.cuSeqlens[n], L = p.cuSeqlens[n + 1] - bos;
    int const nch = (L + kC - 1) / kC, id0 = bos / kC + n;
    int const gr = lane >> 2, qd = lane & 3;
    int const vw = vbase + 16 * cg;  // this warp's first value column
    int const k0 = kh * KW;          // this warp's first row of S

    // S^T rows in accumulator layout: s[t][e] = S[k0 + 8t + 2qd + (e&1)][vw + gr + 8(e>>1)]
    float s[NKT][4];
    int64_t const sbase = ((int64_t)n * Hv + h) * K * V;
#pragma unroll
    for (int t = 0; t < NKT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[t][e] = p.initialState ? p.initialState[sbase + (int64_t)(k0 + 8 * t + 2 * qd + (e & 1)) * V + vw + gr
                                                      + 8 * (e >> 1)]
                                     : 0.f;
    using St = typename SM::Stage;
    uint32_t const st0 = smemAddr(&sm.st[0]);
    uint32_t const laneQK = ldsmLaneNK(KS, lane) + 2u * k0, laneC = ldsmLaneNK(CS, lane);
    uint32_t const laneKT = ldsmLaneKN(KS, lane) + 2u * k0;
    if (nch > 0)
        scanIssueStage<SM>(st0, p, ws, (int64_t)id0 * Hv + h, bos, min(kC, L), h, hk, vbase);
    cpAsyncCommit();

    for (int c = 0; c < nch; ++c)
    {
        cpAsyncWaitAll();
        __syncthreads();
        if (c + 1 < nch)
            scanIssueStage<SM>(st0 + ((c + 1) & 1) * uint32_t(sizeof(St)), p, ws, (int64_t)(id0 + c + 1) * Hv + h,
                bos + (c + 1) * kC, min(kC, L - (c + 1) * kC), h, hk, vbase);
        cpAsyncCommit();
        auto const& st = sm.st[c & 1];
        int const len = min(kC, L - c * kC);
        uint32_t const sb = st0 + (c & 1) * uint32_t(sizeof(St));
        uint32_t const aK = sb + offsetof(St, k) + laneQK, aQ = sb + offsetof(St, q) + laneQK;
        uint32_t const aTm = sb + offsetof(St, tm) + laneC, aAq = sb + offsetof(St, aqk) + laneC;
        uint32_t const aKT = sb + offsetof(St, k) + laneKT;

        // P^T = S^T k^T and O1^T = S^T q^T over this warp's K rows (16 x 64 each)
        float pa[8][4], oa[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                pa[j][e] = oa[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KW / 16; ++kk)
        {
            uint32_t a[4];
            accToA<T>(a, s, kk);
#pragma unroll
            for (int j = 0; j < 4; ++j)
            {
                uint32_t b[4];
                ldsmX4(b, aK + 2u * (16 * j * KS + 16 * kk));
                mma16816<T>(pa[2 * j], a, b[0], b[1]);
                mma16816<T>(pa[2 * j + 1], a, b[2], b[3]);
                ldsmX4(b, aQ + 2u * (16 * j * KS + 16 * kk));
                mma16816<T>(oa[2 * j], a, b[0], b[1]);
                mma16816<T>(oa[2 * j + 1], a, b[2], b[3]);
            }
        }
        if constexpr (KSPLIT > 1)
        {
            // sum the K partials in a fixed order (kh = 0, 1, ..): every warp of the group gets the same P
            int const xb = cg * KSPLIT;
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                {
                    sm.xp[xb + kh][4 * j + e][lane] = pa[j][e];
                    if (!outWarp)
                        sm.xo[xb + kh][4 * j + e][lane] = oa[j][e];
                }
            groupBarrier<KSPLIT>(cg);
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                {
                    float sp = sm.xp[xb][4 * j + e][lane], so = 0.f;
#pragma unroll
                    for (int w = 1; w < KSPLIT; ++w)
                        sp += sm.xp[xb + w][4 * j + e][lane];
                    if (outWarp)
                    {
#pragma unroll
                        for (int w = 0; w < KSPLIT - 1; ++w)
                            so += sm.xo[xb + w][4 * j + e][lane];
                        oa[j][e] += so;
                    }
                    pa[j][e] = sp;
                }
        }
        // X = v - e^G rk P ; O1 *= e^G qs
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
            {
                int const tok = 8 * j + 2 * qd + e;
                float const eg = __expf(st.gq[0][tok]);
                float const f1 = eg * st.gq[2][tok], f2 = eg * st.gq[1][tok];
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
                {
                    float const vv = toFloat(st.v[tok][16 * cg + gr + 8 * hh]);
                    pa[j][2 * hh + e] = vv - f1 * pa[j][2 * hh + e];
                    oa[j][2 * hh + e] *= f2;
                }
            }
        // delta^T = X^T Tm'^T
        float da[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                da[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
        {
            uint32_t a[4];
            accToA<T>(a, pa, kk);
#pragma unroll
            for (int j = 0; j < 4; ++j)
            {
                if (kk > j)
                    continue;  // Tm' is lower (block) triangular
                uint32_t b[4];
                ldsmX4(b, aTm + 2u * (16 * j * CS + 16 * kk));
                mma16816<T>(da[2 * j], a, b[0], b[1]);
                mma16816<T>(da[2 * j + 1], a, b[2], b[3]);
            }
        }
        if (outWarp)
        {
            // O^T += delta^T Aqk^T
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
            {
                uint32_t a[4];
                accToA<T>(a, da, kk);
#pragma unroll
                for (int j = 0; j < 4; ++j)
                {
                    if (kk > j)
                        continue;  // Aqk is causal (lower triangular)
                    uint32_t b[4];
                    ldsmX4(b, aAq + 2u * (16 * j * CS + 16 * kk));
                    mma16816<T>(oa[2 * j], a, b[0], b[1]);
                    mma16816<T>(oa[2 * j + 1], a, b[2], b[3]);
                }
            }
            // o -> per-group staging (token rows), then 4-byte coalesced stores of the valid rows
            T(&ob)[kC][SM::OS] = sm.out[cg];
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    ob[8 * j + 2 * qd + (e & 1)][gr + 8 * (e >> 1)] = fromFloat<T>(oa[j][e]);
            __syncwarp();
            T* og = static_cast<T*>(p.o) + ((int64_t)(bos + c * kC) * Hv + h) * V + vw;
#pragma unroll
            for (int it = 0; it < kC / 4; ++it)
            {
                int const r = 4 * it + (lane >> 3), cc = 2 * (lane & 7);
                if (r < len)
                    *reinterpret_cast<uint32_t*>(og + (int64_t)r * Hv * V + cc)
                        = *reinterpret_cast<uint32_t const*>(&ob[r][cc]);
            }
            __syncwarp();
        }
        // S^T = e^{G_C} S^T + (delta e^{G_C - G} rk)^T k  (this warp's K rows)
        float const GC = st.gq[0][kC - 1];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
            {
                int const tok = 8 * j + 2 * qd + e;
                float const f = __expf(GC - st.gq[0][tok]) * st.gq[2][tok];
                da[j][e] *= f;
                da[j][2 + e] *= f;
            }
        float const eGC = __expf(GC);
#pragma unroll
        for (int t = 0; t < NKT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[t][e] *= eGC;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
        {
            uint32_t a[4];
            accToA<T>(a, da, kk);
#pragma unroll
            for (int m = 0; m < KW / 16; ++m)
            {
                uint32_t b[4];
                ldsmX4T(b, aKT + 2u * (16 * kk * KS + 16 * m));
                mma16816<T>(s[2 * m], a, b[0], b[1]);
                mma16816<T>(s[2 * m + 1], a, b[2], b[3]);
            }
        }
    }
    cpAsyncWaitAll();
#pragma unroll
    for (int t = 0; t < NKT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            p.finalState[sbase + (int64_t)(k0 + 8 * t + 2 * qd + (e & 1)) * V + vw + gr + 8 * (e >> 1)] = s[t][e];
}

} // namespace prefill_chunked
} // namespace gdn
