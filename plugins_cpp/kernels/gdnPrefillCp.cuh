// Context-parallel chunked prefill (16-bit I/O), private to gdnPrefill.cu: when the scan's grid (sequences x value
// heads x V tiles) cannot fill the GPU, each sequence is cut at chunk boundaries into G segments (the last one holds
// the partial chunk) that run at once. Exact, from the linearity of the chunk recurrence in the state:
//   the end state of segment s started from S is  M_s S + H_s,
// H_s: the end state from a zero state (segment 0: from the sequence's initial state), M_s (K x K): the end state of
// the same recurrence started from the identity with v = 0 (the transition).
//   pass 1 (gdnPrefillCpKernel<.., false>): H_s and M_s of segments 0 .. G-2, all at once, no outputs;
//   fix-up (gdnPrefillCpFixKernel): S_0 = initial state, S_{s+1} = M_s S_s + H_s (fp32, sequential over segments);
//   pass 2 (gdnPrefillCpKernel<.., true>): every segment from its true initial state S_s, writing o; the last
//   segment writes the final state.
// Pass 1 runs here (mma.sync) or on wgmma (gdnPrefillCpWgmma.cuh, scan kCpWg), the fix-up here; pass 2 runs the wgmma scan (gdnPrefillScanWgmma.cuh, ChunkWs::segments) where it
// can run, else gdnPrefillCpKernel<.., true>. Both kernels here are the warp-level mma.sync scan of
// gdnPrefillChunked.cuh (4 warps, V-tile 64) over the chunk range of one segment, reading the prep kernel's workspace slots (the segments' chunk ids are the sequence's). Nothing reads
// cu_seqlens on the host; segment ranges come from the clamped sequence ranges (seqRange), so every token row and
// chunk id stays in bounds whatever cu_seqlens holds.
#pragma once

#include "gdnPrefillChunked.cuh"

namespace gdn
{
namespace prefill_cp
{

using namespace prefill_chunked;

// Workspace of the context-parallel passes (after the chunked prep's slots; fp32)
struct CpWs
{
    float* hm;     // [N][G-1][Hv][K][V+K]: H_s in columns [0, V), M_s in columns [V, V+K)
    float* st;     // [N][G][Hv][K][V]: the true initial state S_s of each segment
    int segments;  // G >= 2
};

// Shared memory of a pass: double-buffered k, v, Tm', factors; pass 2 also q, Aqk and the o staging tiles (pass 1
// keeps one-row placeholders, so that it needs about half the shared memory).
template <typename T, int K, bool kOut>
struct CpSmem
{
    static constexpr int KS = K + 8, VS = 64 + 8, CS = kC + 8, OS = 16 + 8, OR = kOut ? kC : 1;
    struct Stage
    {
        T k[kC][KS];
        T v[kC][VS];
        T tm[kC][CS];
        float gq[kC][4];
        T q[OR][KS];
        T aqk[OR][CS];
    };
    Stage st[2];
    T out[4][OR][OS];
};

template <typename T, int K, bool kOut>
__device__ __forceinline__ void cpIssueStage(uint32_t stAddr, GdnPrefillParams const& p, ChunkWs const& ws,
    int64_t slot, int t0, int len, int h, int hk, int vbase, bool loadV)
{
    using SM = CpSmem<T, K, kOut>;
    using St = typename SM::Stage;
    int64_t const qkRow = (int64_t)p.Hk * K;
    int64_t const qk0 = ((int64_t)t0 * p.Hk + hk) * K;
    issueTile<K / 8, 128>(stAddr + offsetof(St, k), SM::KS, static_cast<uint16_t const*>(p.k) + qk0, qkRow, len);
    issueTile<kC / 8, 128>(stAddr + offsetof(St, tm), SM::CS, static_cast<uint16_t const*>(ws.tm) + slot * (kC * kC),
        kC, kC);
    if (loadV)
        issueTile<8, 128>(stAddr + offsetof(St, v), SM::VS,
            static_cast<uint16_t const*>(p.v) + ((int64_t)t0 * p.Hv + h) * p.V + vbase, (int64_t)p.Hv * p.V, len);
    if constexpr (kOut)
    {
        issueTile<K / 8, 128>(stAddr + offsetof(St, q), SM::KS, static_cast<uint16_t const*>(p.q) + qk0, qkRow, len);
        issueTile<kC / 8, 128>(stAddr + offsetof(St, aqk), SM::CS,
            static_cast<uint16_t const*>(ws.aqk) + slot * (kC * kC), kC, kC);
    }
    issueFactors<128>(stAddr + offsetof(St, gq), ws, slot, threadIdx.x);
}

// X = -e^G rk P (v = 0: the transition's columns)
__device__ __forceinline__ void applyXZero(float (&pa)[8][4], float const (&gq)[kC][4], int lane)
{
    int const qd = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
        {
            float const f = -gq[8 * j + 2 * qd + e][0];
            pa[j][e] *= f;
            pa[j][2 + e] *= f;
        }
}

// grid: pass 1 (N * (G-1), Hv, (V + K) / 64): z < V/64 the H_s columns, else the M_s columns (segment 0: none);
//       pass 2 (N * G, Hv, V / 64). 4 warps of 16 state columns each.
template <typename T, int K, bool kOut>
__global__ void __launch_bounds__(128, 1) gdnPrefillCpKernel(GdnPrefillParams const p, ChunkWs const ws, CpWs const cw)
{
    using SM = CpSmem<T, K, kOut>;
    using St = typename SM::Stage;
    constexpr int KS = SM::KS, CS = SM::CS, NKT = K / 8;
    extern __shared__ __align__(16) unsigned char smemRaw[];
    auto& sm = *reinterpret_cast<SM*>(smemRaw);
    int const G = cw.segments, segs = kOut ? G : G - 1;
    int const n = blockIdx.x / segs, sg = blockIdx.x % segs, h = blockIdx.y;
    int const lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, qd = lane & 3;
    int const Hv = p.Hv, V = p.V, hk = h / (Hv / p.Hk);
    int const col0 = blockIdx.z * 64;  // first state column of the CTA (pass 1: of [H | M])
    bool const isM = !kOut && col0 >= V;
    if (isM && sg == 0)
        return;  // the sequence's initial state is known: segment 0 needs no transition
    int const vw = col0 + 16 * warp;
    SegRange const seg = segRange(p, n, sg, G);
    int const nch = (seg.len + kC - 1) / kC;

    float s[NKT][4];
    if (kOut)
        loadStateT(s, cw.st, ((int64_t)(n * G + sg) * Hv + h) * K * V, V, vw, lane);
    else if (!isM)
        loadStateT(s, sg == 0 ? p.initialState : nullptr, ((int64_t)n * Hv + h) * K * V, V, vw, lane);
    else
    {
#pragma unroll
        for (int t = 0; t < NKT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[t][e] = (8 * t + 2 * qd + (e & 1)) == (vw - V + gr + 8 * (e >> 1)) ? 1.f : 0.f;
    }
    uint32_t const st0 = smemAddr(&sm.st[0]);
    uint32_t const laneQK = ldsmLaneNK(KS, lane), laneC = ldsmLaneNK(CS, lane), laneKT = ldsmLaneKN(KS, lane);
    int const mrow = 8 * (lane >> 4) + (lane & 7), mcol = 8 * ((lane >> 3) & 1);
    uint32_t const aOut = smemAddr(&sm.out[warp][0][0]) + 2u * (mrow * SM::OS + mcol);
    if (nch > 0)
        cpIssueStage<T, K, kOut>(st0, p, ws, (int64_t)seg.id0 * Hv + h, seg.begin, min(kC, seg.len), h, hk, col0, !isM);
    cpAsyncCommit();

    for (int c = 0; c < nch; ++c)
    {
        cpAsyncWaitAll();
        __syncthreads();
        if (c + 1 < nch)
            cpIssueStage<T, K, kOut>(st0 + ((c + 1) & 1) * uint32_t(sizeof(St)), p, ws,
                (int64_t)(seg.id0 + c + 1) * Hv + h, seg.begin + (c + 1) * kC, min(kC, seg.len - (c + 1) * kC), h, hk,
                col0, !isM);
        cpAsyncCommit();
        auto const& st = sm.st[c & 1];
        int const len = min(kC, seg.len - c * kC);
        uint32_t const sb = st0 + (c & 1) * uint32_t(sizeof(St));
        uint32_t const aK = sb + offsetof(St, k) + laneQK, aQ = sb + offsetof(St, q) + laneQK;
        uint32_t const aTm = sb + offsetof(St, tm) + laneC, aAq = sb + offsetof(St, aqk) + laneC;
        uint32_t const aKT = sb + offsetof(St, k) + laneKT;

        // P^T = S^T k^T (pass 2: and O1^T = S^T q^T)
        float pa[8][4], oa[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                pa[j][e] = oa[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < K / 16; ++kk)
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
                if constexpr (kOut)
                {
                    ldsmX4(b, aQ + 2u * (16 * j * KS + 16 * kk));
                    mma16816<T>(oa[2 * j], a, b[0], b[1]);
                    mma16816<T>(oa[2 * j + 1], a, b[2], b[3]);
                }
            }
        }
        if (isM)
            applyXZero(pa, st.gq, lane);
        else
            applyX(pa, st.gq, &st.v[0][16 * warp], SM::VS, lane);
        float da[8][4];
        mmaTriProduct<T, CS>(da, pa, aTm, false);
        if constexpr (kOut)
        {
            applyO1(oa, st.gq, lane);
            mmaTriProduct<T, CS>(oa, da, aAq, true);
            storeOTile<T, SM::OS>(oa, sm.out[warp], aOut,
                static_cast<T*>(p.o) + ((int64_t)(seg.begin + c * kC) * Hv + h) * V + vw, (int64_t)Hv * V, len, lane);
        }
        applyUpdateScales(da, s, st.gq, lane);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
        {
            uint32_t a[4];
            accToA<T>(a, da, kk);
#pragma unroll
            for (int m = 0; m < K / 16; ++m)
            {
                uint32_t b[4];
                ldsmX4T(b, aKT + 2u * (16 * kk * KS + 16 * m));
                mma16816<T>(s[2 * m], a, b[0], b[1]);
                mma16816<T>(s[2 * m + 1], a, b[2], b[3]);
            }
        }
    }
    cpAsyncWaitAll();
    if (kOut)
    {
        if (sg == G - 1)
            storeStateT(s, p.finalState, ((int64_t)n * Hv + h) * K * V, V, vw, lane);
    }
    else
        storeStateT(s, cw.hm, ((int64_t)(n * (G - 1) + sg) * Hv + h) * K * (V + K), V + K, vw, lane);
}

// Fix-up: per (sequence, value head, kFixCols state columns), S_0 = initial state (or 0), S_1 = H_0,
// S_{s+1} = M_s S_s + H_s in fp32, each S_s written to cw.st. Every M_s and H_s is in memory when it starts, so
// only the products form a chain: the rows of M_1 .. M_{G-2} stream through a two-stage cp.async pipeline of
// kFixRows-row blocks (all of M_s at K <= 128: one block and one barrier per step; 64 rows at K = 256), the CTA's
// columns of S_s sit transposed in shared memory (double-buffered over steps), and a block's rows of H_s are read
// into registers before its barrier.
// The products run on tf32 tensor cores in three terms (3xTF32: x = hi + lo, both tf32; hi.hi + hi.lo + lo.hi,
// each term in its own accumulator), which keeps fp32 accuracy: a warp computes one 16-row tile of a block x the
// 8 columns (mma m16n8k8) over a part of K; where a block has fewer than 8 row tiles (K = 64, and the 64-row blocks
// of K = 256) KS warps share a tile's K sum and add their parts through shared memory.
constexpr int kFixCols = 8, kFixWarps = 8, kFixThreads = 32 * kFixWarps, kFixStages = 2;
constexpr int kFixSmemBudget = 160 * 1024;  // within A100's opt-in shared memory per block (163 KB)
template <int K, int RB>  // with pipeline blocks of RB rows of M
struct CpFixSmemRows
{
    static constexpr int RT = RB / 16, KS = kFixWarps / RT;  // 16-row mma tiles per block; warps sharing one's K sum
    static constexpr int MS = K + 4;  // padded rows of M: conflict-free A fragments
    static constexpr int SS = K + 4;  // padded rows of S^T: conflict-free B fragments and transposed stores
    float m[kFixStages][RB][MS];
    float sT[2][kFixCols][SS];  // S_s^T (this CTA's columns), double-buffered over the steps
    float red[KS > 1 ? KS - 1 : 1][KS > 1 ? RT : 1][32][kFixCols / 2];  // K-split parts (C fragments of the n8 tiles)
};
template <int K>  // rows of M per pipeline block: all of M_s where it fits, else 64 or 32
constexpr int kFixRows = sizeof(CpFixSmemRows<K, K>) <= kFixSmemBudget ? K
    : sizeof(CpFixSmemRows<K, 64>) <= kFixSmemBudget                  ? 64
                                                                       : 32;
template <int K>
using CpFixSmem = CpFixSmemRows<K, kFixRows<K>>;

// Programmatic dependent launch (sm_90; kCpProgrammaticLaunch, off: measured slower at 1x64K): the context-parallel
// kernels after the prep can each launch as the programmatic dependent of the one before (cpLaunchDependent), so
// that a kernel's CTAs are placed and set up while the one before drains. Every CTA waits for the previous grid's
// completion (griddepcontrol.wait: it and its memory operations) before it reads anything that grid or an earlier
// one wrote, and only then lets the next kernel launch, so that a kernel launched early finds every grid before its
// predecessor complete.
__device__ __forceinline__ void cpWaitPreviousGrid()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kern<<<grid, threads, smem, stream>>>(args...) as the programmatic dependent of the stream's previous kernel
// (kCpProgrammaticLaunch; else in plain stream order, and griddepcontrol.wait returns at once)
template <typename... KArgs, typename... Args>
cudaError_t cpLaunchDependent(
    void (*kern)(KArgs...), dim3 grid, int threads, int smem, cudaStream_t stream, Args const&... args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = grid;
    lc.blockDim = dim3(unsigned(threads));
    lc.dynamicSmemBytes = size_t(smem);
    lc.stream = stream;
    lc.attrs = attr;
    lc.numAttrs = kCpProgrammaticLaunch ? 1 : 0;
    return cudaLaunchKernelEx(&lc, kern, args...);
}

template <int N>
__device__ __forceinline__ void cpAsyncWaitGroup()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// x as the two tf32 terms of 3xTF32: hi (x rounded to tf32) and lo (x - hi rounded to tf32)
__device__ __forceinline__ void splitTf32(float x, uint32_t& hi, uint32_t& lo)
{
    hi = toTf32(x) & 0xffffe000u;
    lo = toTf32(x - __uint_as_float(hi));
}

template <int K>
__global__ void __launch_bounds__(kFixThreads) gdnPrefillCpFixKernel(GdnPrefillParams const p, CpWs const cw)
{
    using SM = CpFixSmem<K>;
    static_assert(sizeof(SM) <= kFixSmemBudget, "fix-up shared memory");
    constexpr int C = kFixCols, RB = kFixRows<K>, NB = K / RB, RT = SM::RT, KS = SM::KS, MS = SM::MS, NT = C / 8;
    constexpr int KP = K / KS, STEPS = KP / 8;  // a warp's part of the K sum, in k8 steps
    static_assert(RT * KS == kFixWarps && KP % 8 == 0 && C % 8 == 0, "fix-up tiling");
    extern __shared__ __align__(16) unsigned char smemRaw[];
    auto& sm = *reinterpret_cast<SM*>(smemRaw);
    int const n = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int const warp = tid / 32, lane = tid % 32, g = lane >> 2, q = lane & 3;
    int const rt = warp % RT, ks = warp / RT, k0 = ks * KP;  // this warp's row tile and part of K
    int const G = cw.segments, Hv = p.Hv, V = p.V, col0 = blockIdx.z * C;
    int64_t const hmStride = (int64_t)Hv * K * (V + K);  // one segment's [Hv][K][V+K]
    float const* hm = cw.hm + ((int64_t)n * (G - 1) * Hv + h) * K * (V + K);
    auto stOut = [&](int sg, int r, int c) -> float&
    { return cw.st[(((int64_t)(n * G + sg) * Hv + h) * K + r) * V + col0 + c]; };
    cpWaitPreviousGrid();  // pass 1 (H_s, M_s) complete
    int const blocks = (G - 2) * NB;  // block f: rows (f % NB) * RB .. of M_{1 + f / NB}
    auto issue = [&](int f)
    {
        if (f < blocks)
        {
            float const* src = hm + (1 + f / NB) * hmStride + (int64_t)(f % NB) * RB * (V + K) + V;
            float* dst = &sm.m[f % kFixStages][0][0];
            for (int i = tid; i < RB * (K / 4); i += kFixThreads)
            {
                int const r = i / (K / 4), j = 4 * (i % (K / 4));
                cpAsync16(dst + r * MS + j, src + (int64_t)r * (V + K) + j, 16);
            }
        }
        cpAsyncCommit();
    };
#pragma unroll
    for (int f = 0; f < kFixStages - 1; ++f)
        issue(f);
    int64_t const s0 = ((int64_t)n * Hv + h) * K * V;
    for (int i = tid; i < K * C; i += kFixThreads)
    {
        int const r = i / C, c = i % C;
        stOut(0, r, c) = p.initialState ? p.initialState[s0 + (int64_t)r * V + col0 + c] : 0.f;
        float const hv = hm[(int64_t)r * (V + K) + col0 + c];  // H_0 (from the initial state)
        stOut(1, r, c) = hv;
        sm.sT[0][c][r] = hv;
    }
    // this lane's outputs of block b (C fragments, warps of part 0): rows b * RB + 16 rt + g (+ 8), columns
    // 8 nt + 2q, + 1 of each n8 tile nt
    auto outRow = [&](int b, int half) { return b * RB + 16 * rt + g + 8 * half; };
    float x[NT][4];  // H_s at those outputs of the block
    for (int f = 0; f < blocks; ++f)
    {
        int const sg = 1 + f / NB, b = f % NB, cur = (sg - 1) & 1;
        if (ks == 0)
        {
            float const* hs = hm + sg * hmStride + col0 + 2 * q;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int half = 0; half < 2; ++half)
                {
                    float2 const v = *reinterpret_cast<float2 const*>(hs + (int64_t)outRow(b, half) * (V + K) + 8 * nt);
                    x[nt][2 * half] = v.x;
                    x[nt][2 * half + 1] = v.y;
                }
        }
        cpAsyncWaitGroup<kFixStages - 2>();
        __syncthreads();  // block f (and, at b == 0, S_sg^T) visible; block f - 1's buffer free
        issue(f + kFixStages - 1);
        float const* mb = &sm.m[f % kFixStages][16 * rt + g][k0 + q];
        float const* sv = &sm.sT[cur][g][k0 + q];  // B fragments: k = q, q + 4 of each k8 step, n = g
        float dhh[NT][4] = {}, dhl[NT][4] = {}, dlh[NT][4] = {};
#pragma unroll
        for (int j = 0; j < STEPS; ++j)
        {
            float const a[4] = {mb[8 * j], mb[8 * MS + 8 * j], mb[8 * j + 4], mb[8 * MS + 8 * j + 4]};
            uint32_t ah[4], al[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                splitTf32(a[i], ah[i], al[i]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
            {
                uint32_t bh0, bl0, bh1, bl1;
                splitTf32(sv[8 * nt * SM::SS + 8 * j], bh0, bl0);
                splitTf32(sv[8 * nt * SM::SS + 8 * j + 4], bh1, bl1);
                mmaTf32(dlh[nt], al, bh0, bh1);
                mmaTf32(dhl[nt], ah, bl0, bl1);
                mmaTf32(dhh[nt], ah, bh0, bh1);
            }
        }
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[nt][i] = dhh[nt][i] + (dhl[nt][i] + dlh[nt][i]);
        if constexpr (KS > 1)
        {
            if (ks > 0)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    *reinterpret_cast<float4*>(&sm.red[ks - 1][rt][lane][4 * nt])
                        = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
            __syncthreads();  // the other parts' sums visible (read before the next block's first barrier)
            if (ks == 0)
#pragma unroll
                for (int o = 0; o < KS - 1; ++o)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                    {
                        float4 const r = *reinterpret_cast<float4 const*>(&sm.red[o][rt][lane][4 * nt]);
                        acc[nt][0] += r.x;
                        acc[nt][1] += r.y;
                        acc[nt][2] += r.z;
                        acc[nt][3] += r.w;
                    }
        }
        if (ks == 0)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int half = 0; half < 2; ++half)
                {
                    int const r = outRow(b, half), c = 8 * nt + 2 * q;
                    float const v0 = x[nt][2 * half] + acc[nt][2 * half], v1 = x[nt][2 * half + 1] + acc[nt][2 * half + 1];
                    sm.sT[cur ^ 1][c][r] = v0;  // S_{sg+1}^T, read after the next step's first barrier
                    sm.sT[cur ^ 1][c + 1][r] = v1;
                    *reinterpret_cast<float2*>(&stOut(sg + 1, r, c)) = make_float2(v0, v1);
                }
    }
    cpAsyncWaitAll();
}

// Bytes of the context-parallel workspace for `slots` >= N x G segment slots (hm: N x (G-1), st: N x G; 0: none)
inline size_t cpWorkspaceBytes(GdnPrefillParams const& p, int64_t slots)
{
    if (slots <= 0)
        return 0;
    return size_t(slots) * size_t(p.Hv) * size_t(p.K) * size_t(2 * p.V + p.K) * sizeof(float);
}

// (pass1: the mma.sync) pass 1, the fix-up and (pass2: the mma.sync one) pass 2 on `stream`, after the prep kernel
// (and after the wgmma pass 1 of gdnPrefillCpWgmma.cuh where pass1 is false)
template <typename T, int K>
cudaError_t launchCp(
    GdnPrefillParams const& p, ChunkWs const& ws, CpWs const& cw, bool pass1, bool pass2, cudaStream_t stream)
{
    int const G = cw.segments;
    if (int64_t(p.N) * G > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    if (pass1)
    {
        auto kern = gdnPrefillCpKernel<T, K, false>;
        int const smem = int(sizeof(CpSmem<T, K, false>));
        GDN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        kern<<<dim3(unsigned(p.N * (G - 1)), p.Hv, (p.V + K) / 64), 128, smem, stream>>>(p, ws, cw);
        GDN_CUDA_TRY(cudaGetLastError());
    }
    {
        auto kern = gdnPrefillCpFixKernel<K>;
        int const smem = int(sizeof(CpFixSmem<K>));
        GDN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        GDN_CUDA_TRY(cpLaunchDependent(kern, dim3(p.N, p.Hv, p.V / kFixCols), kFixThreads, smem, stream, p, cw));
    }
    if (pass2)
    {
        auto kern = gdnPrefillCpKernel<T, K, true>;
        int const smem = int(sizeof(CpSmem<T, K, true>));
        GDN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        kern<<<dim3(unsigned(p.N * G), p.Hv, p.V / 64), 128, smem, stream>>>(p, ws, cw);
        GDN_CUDA_TRY(cudaGetLastError());
    }
    return cudaSuccess;
}

} // namespace prefill_cp
} // namespace gdn
