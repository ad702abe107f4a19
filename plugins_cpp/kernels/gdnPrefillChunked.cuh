// Chunked (64-token, WY/UT) prefill kernels for 16-bit I/O (bf16 / fp16), private to gdnPrefill.cu.
//
// Workspace, one slot per (chunk id, value head). Chunk c of sequence n (tokens bos_n + 64c ..) has
// id = bos_n / 64 + n + c, unique and < T/64 + N, so no host read of cu_seqlens is needed.
//   tm  [id][h][64][64] T : Tm' = (I + L)^-1 diag(beta), L_ij = beta_i e^{G_i-G_j} kn_i.kn_j (j < i)
//   aqk [id][h][64][64] T : Aqk_ij = e^{G_i-G_j} qn_i.kn_j (j <= i), qn = scale * q/|q|, kn = k/|k|
//   gq  [id][h][64][4] f32: per token e^G rk, e^G qs, e^{G_C - G} rk, e^{G_C} (G: cumulative log decay,
//                           G_C = G of the last token, qs = scale * rq, rq, rk: inverse norms or 1)
// Tokens past the sequence end get g = 0, beta = 0, rq = rk = 0 (all their terms vanish).
//
// Prep kernel (gdnPrefillPrep.cuh; parallel over chunks x key heads): q.k^T, k.k^T and the diagonal of q.q^T (the squared
// norms) on tensor cores, once per key head; then, per value head of the group (its own gates), the
// decayed L and Aqk and the unit lower triangular inverse by 16x16 blocks: diagonal blocks by fp32
// forward substitution, the blocks below them by tf32 tensor-core products.
// Scan kernel (per sequence x value head x V-tile, sequential over chunks), each warp owns 16 value
// columns and keeps S^T (16 x K, fp32) in mma accumulators, which double as A fragments:
//   P^T = S^T k^T ; X = v - e^G rk P ; delta^T = X^T Tm'^T
//   o^T = (e^G qs) (S^T q^T) + delta^T Aqk^T
//   S^T = e^{G_C} S^T + (delta e^{G_C - G} rk)^T k
// Raw q, k, v tiles and the workspace slot of the next chunk stream in by cp.async (double buffer);
// the norms, scale and decays are applied to the accumulators, never to the operands.
//
// cu_seqlens is trusted by no kernel: TensorRT times the plugin with inputs it fills itself, and only the torch
// binding validates values on the host. Every kernel reads a sequence's range through seqRange (offsets clamped
// into [0, T], end >= begin), which keeps every token row and chunk id in bounds; beside the prep, a scan CTA waits
// for prep items only when the prep attributes every chunk id of its sequence to it (seqOfChunk): garbage offsets
// can make sequences overlap, and then the items it would wait for go to another sequence.
#pragma once

#include "gdnCommon.cuh"
#include "gdnPrefillConfig.h"
#include "gdnPrefillMma.cuh"

namespace gdn
{
namespace prefill_chunked
{

using namespace detail;
using namespace prefill_mma;
using namespace prefill_config;

constexpr int kC = kChunk;  // chunk size (the spec's chunk_size)

// Offset cu[n] clamped into [0, T].
__device__ __forceinline__ int clampedOffset(int32_t const* cu, int n, int T)
{
    return min(max(cu[n], 0), T);
}

// Tokens [begin, end) of sequence n: cu_seqlens clamped into [0, T] with end >= begin (valid offsets unchanged).
// With begin, end in [0, T] every chunk id bos / 64 + n + c of the sequence stays below T / 64 + N.
struct SeqRange
{
    int begin, end;
};
__device__ __forceinline__ SeqRange seqRange(int32_t const* cu, int n, int T)
{
    int const b = clampedOffset(cu, n, T);
    return {b, max(clampedOffset(cu, n + 1, T), b)};
}

// Largest n in [0, N) with cu[n] / 64 + n <= id (chunk ids are increasing in n for valid offsets). The prep's
// sequence of chunk id `id`. Whatever cu holds, the result is non-decreasing in id (each probe's test is), so a
// sequence whose first and last chunk ids map to it has every chunk id mapped to it (seqOwnsItsChunks).
__device__ __forceinline__ int seqOfChunk(int32_t const* cu, int N, int id)
{
    int lo = 0, hi = N - 1;
    while (lo < hi)
    {
        int const mid = (lo + hi + 1) >> 1;
        if (cu[mid] / kC + mid <= id)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// Whether the prep attributes every chunk id id0 .. id0 + nch - 1 of sequence n to it (always, for valid offsets).
__device__ __forceinline__ bool seqOwnsItsChunks(int32_t const* cu, int N, int n, int id0, int nch)
{
    return nch == 0 || (seqOfChunk(cu, N, id0) == n && seqOfChunk(cu, N, id0 + nch - 1) == n);
}

// Tokens [begin, begin + len) of segment s of sequence n and the chunk id of its first chunk: the sequence's chunks
// split into G runs of ceil(chunks / G) (trailing segments may be empty; G = 1: the whole sequence).
struct SegRange
{
    int begin, len, id0;
};
__device__ __forceinline__ SegRange segRange(GdnPrefillParams const& p, int n, int s, int G)
{
    SeqRange const seq = seqRange(p.cuSeqlens, n, p.T);
    int const L = seq.end - seq.begin, nch = (L + kC - 1) / kC, cps = (nch + G - 1) / G;
    int const c0 = min(s * cps, nch), c1 = min(c0 + cps, nch);
    return {seq.begin + c0 * kC, max(0, min(L - c0 * kC, (c1 - c0) * kC)), seq.begin / kC + n + c0};
}

// Workspace pointers (see the layout above); set up by the host from p.workspace.
struct ChunkWs
{
    void* aqk;
    void* tm;
    float* gq;
    // When the scan runs beside the prep kernel (nullptr otherwise), zeroed before the prep kernel: the control
    // block (kCtl* below), then the ready counters (readyCounter), then the progress counters (consumedCounter).
    int* ctl;
    int scanCtas;  // SMs kept free for the scan's CTAs
    // CTAs per scan cluster: 2 when the scan runs as clusters of two V-tile CTAs of a value head, which
    // the hardware places on the two SMs of one TPC (%smid 2i and 2i + 1 on the H100, probed); the prep then
    // keeps SMs for the scan by whole TPCs (smid / 2), else 1 (SM by SM)
    int scanCluster;
    // Beside the scan: a prep item of chunk c >= throttle waits (at most kThrottleNs) until every scan CTA
    // of its key head has started loading chunk c - throttle's block, so that the scan reads q, k and the
    // workspace slot while they are still in L2 (0: no wait).
    int throttle;
    // Context-parallel pass 2 (gdnPrefillCp.cuh) on the wgmma scan: grid x = N x segments, CTA x runs segment
    // x % segments of sequence x / segments from segInit[N][segments][Hv][K][V]; only the last segment writes the
    // final state. 1 (and nullptr): one CTA per sequence from the initial state.
    int segments = 1;
    float const* segInit = nullptr;
};

// The control block of ws.ctl: the next work item, the SMs claimed, then one role slot per SM (by %smid).
constexpr int kCtlNextItem = 0, kCtlClaims = 1, kCtlRoles = 2;
constexpr int kCtlInts = kCtlRoles + kCtlSmIds;  // ints of the control block ahead of the ready counters

// Chunk ids per head: T/64 + N (sequence n's chunk c has id bos/64 + n + c); the workspace has one slot per
// (chunk id, value head), the beside mode one ready and one progress counter per (chunk id, key head).
__host__ __device__ __forceinline__ int64_t chunkIds(GdnPrefillParams const& p)
{
    return int64_t(p.T) / kC + p.N;
}
// ints of ws.ctl: the control block, then the ready counters, then the progress counters
__host__ __device__ __forceinline__ int64_t ctlInts(GdnPrefillParams const& p)
{
    return kCtlInts + 2 * chunkIds(p) * p.Hk;
}

// Ready counter of chunk id `id` of key head hk ([hk][id], T/64 + N ids per head): the counter of the
// first chunk id of each block of kReadyBlock chunks of a sequence counts the prep items of the block
// that are done.
__device__ __forceinline__ int* readyCounter(ChunkWs const& ws, GdnPrefillParams const& p, int hk, int id)
{
    return ws.ctl + kCtlInts + hk * chunkIds(p) + id;
}

// Scan progress counter of the block starting at chunk id `id` of key head hk (after the ready counters):
// every scan CTA of the key head adds 1 when it starts loading the block.
__device__ __forceinline__ int* consumedCounter(ChunkWs const& ws, GdnPrefillParams const& p, int hk, int id)
{
    return readyCounter(ws, p, hk, id) + chunkIds(p) * p.Hk;
}

__device__ __forceinline__ unsigned long long globalTimerNs()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void addRelease(int* f, int v)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(f), "r"(v) : "memory");
}
__device__ __forceinline__ int loadAcquire(int const* f)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
    return v;
}

// ---- per-warp pieces shared by the mma.sync and the wgmma scan kernels. A warp owns 16 value
// columns vw..vw+15 of S (S^T rows) in the m16n8 accumulator layout: x[t][e] = S[8t + 2qd + (e&1)][vw + gr + 8(e>>1)].

template <int NKT>
__device__ __forceinline__ void loadStateT(float (&s)[NKT][4], float const* src, int64_t sbase, int V, int vw, int lane)
{
    int const gr = lane >> 2, qd = lane & 3;
#pragma unroll
    for (int t = 0; t < NKT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[t][e] = src ? src[sbase + (int64_t)(8 * t + 2 * qd + (e & 1)) * V + vw + gr + 8 * (e >> 1)] : 0.f;
}

template <int NKT>
__device__ __forceinline__ void storeStateT(float const (&s)[NKT][4], float* dst, int64_t sbase, int V, int vw, int lane)
{
    int const gr = lane >> 2, qd = lane & 3;
#pragma unroll
    for (int t = 0; t < NKT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dst[sbase + (int64_t)(8 * t + 2 * qd + (e & 1)) * V + vw + gr + 8 * (e >> 1)] = s[t][e];
}

// X = v - e^G rk P (P^T accumulators over the 64 chunk tokens; v: the warp's 16 columns, row stride vs)
template <typename T>
__device__ __forceinline__ void applyX(float (&pa)[8][4], float const (&gq)[kC][4], T const* v, int vs, int lane)
{
    int const gr = lane >> 2, qd = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
        {
            int const tok = 8 * j + 2 * qd + e;
            float const f = gq[tok][0];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                pa[j][2 * hh + e] = toFloat(v[tok * vs + gr + 8 * hh]) - f * pa[j][2 * hh + e];
        }
}

// S^T *= f (every accumulator)
template <int NKT>
__device__ __forceinline__ void scaleState(float (&s)[NKT][4], float f)
{
#pragma unroll
    for (int t = 0; t < NKT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s[t][e] *= f;
}

// acc (16 x 64) (+)= X (16 x 64, accumulator layout, packed per k16 step) * B^T, B a 64x64 row-major 16-bit
// tile (row stride CS elements) at the warp's ldmatrix lane address `tile`, lower block triangular (Tm',
// Aqk): the k16 blocks above the diagonal are skipped.
template <typename T, int CS>
__device__ __forceinline__ void mmaTriProduct(float (&acc)[8][4], float const (&x)[8][4], uint32_t tile, bool accumulate)
{
    if (!accumulate)
    {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc[j][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
    {
        uint32_t a[4];
        accToA<T>(a, x, kk);
#pragma unroll
        for (int j = kk; j < 4; ++j)
        {
            uint32_t b[4];
            ldsmX4(b, tile + 2u * (16 * j * CS + 16 * kk));
            mma16816<T>(acc[2 * j], a, b[0], b[1]);
            mma16816<T>(acc[2 * j + 1], a, b[2], b[3]);
        }
    }
}

// a (16 columns x 64 tokens, accumulator layout) *= the per-token factor gq[token][col]
__device__ __forceinline__ void scaleTokens(float (&a)[8][4], float const (&gq)[kC][4], int col, int lane)
{
    int const qd = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
        {
            float const f = gq[8 * j + 2 * qd + e][col];
            a[j][e] *= f;
            a[j][2 + e] *= f;
        }
}

// O1 *= e^G qs
__device__ __forceinline__ void applyO1(float (&oa)[8][4], float const (&gq)[kC][4], int lane)
{
    scaleTokens(oa, gq, 1, lane);
}

// delta *= e^{G_C - G} rk (per token) and S^T *= e^{G_C}, ahead of S^T += delta^T k
template <int NKT>
__device__ __forceinline__ void applyUpdateScales(float (&da)[8][4], float (&s)[NKT][4], float const (&gq)[kC][4], int lane)
{
    scaleTokens(da, gq, 2, lane);
    scaleState(s, gq[0][3]);
}

// The warp's staged o tile (token rows of 16 values, row stride OS) -> 16-byte stores of rows < len to og
// (row stride ld; og 16 B aligned). Entered with the staging writes done by every lane of the warp.
template <typename T, int OS>
__device__ __forceinline__ void storeStaged(T (&ob)[kC][OS], T* og, int64_t ld, int len, int lane)
{
    __syncwarp();
    // 16 B per lane: rows lane/2 (+16, +32, +48), half lane%2 of the 32-byte row
    int const r0 = lane >> 1, half = 8 * (lane & 1);
    T* dst = og + (int64_t)r0 * ld + half;
    int64_t const step = 16 * ld;
    auto st = [&](int it)
    { *reinterpret_cast<uint4*>(dst + it * step) = *reinterpret_cast<uint4 const*>(&ob[r0 + 16 * it][half]); };
    if (len == kC)
    {
#pragma unroll
        for (int it = 0; it < 4; ++it)
            st(it);
    }
    else
    {
#pragma unroll
        for (int it = 0; it < 4; ++it)
            if (r0 + 16 * it < len)
                st(it);
    }
    __syncwarp();
}

// o^T accumulators (16 columns x 64 tokens) -> the warp's staging tile (token rows; sm_90: stmatrix.trans
// of the packed pairs at row address aOut) -> 16-byte stores of rows < len to og (row stride ld; og 16 B aligned).
template <typename T, int OS>
__device__ __forceinline__ void storeOTile(
    float const (&oa)[8][4], T (&ob)[kC][OS], uint32_t aOut, T* og, int64_t ld, int len, int lane)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
    for (int j = 0; j < 8; j += 2)
        stsmX4T(aOut + 2u * (8 * j * OS), pack2<T>(oa[j][0], oa[j][1]), pack2<T>(oa[j][2], oa[j][3]),
            pack2<T>(oa[j + 1][0], oa[j + 1][1]), pack2<T>(oa[j + 1][2], oa[j + 1][3]));
#else
    (void)aOut;
    int const gr = lane >> 2, qd = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            ob[8 * j + 2 * qd + (e & 1)][gr + 8 * (e >> 1)] = fromFloat<T>(oa[j][e]);
#endif
    storeStaged<T, OS>(ob, og, ld, len, lane);
}

template <typename T, int K, int NW>
struct ScanSmem
{
    static constexpr int KS = K + 8, VT = 16 * NW, VS = VT + 8, CS = kC + 8, OS = 16 + 8;
    struct Stage
    {
        T k[kC][KS];
        T q[kC][KS];
        T v[kC][VS];
        T tm[kC][CS];
        T aqk[kC][CS];
        float gq[kC][4];  // the workspace gq slot
    };
    Stage st[2];
    T out[NW][kC][OS];
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
    int64_t const step = RP * gStride;
    dst += 2u * (r0 * sStride + cc);
#pragma unroll
    for (int pass = 0; pass < kC / RP; ++pass)
    {
        bool const ok = r0 + pass * RP < len;
        cpAsync16(dst + 2u * pass * RP * sStride, ok ? src : g, ok ? 16 : 0);
        src += step;
    }
}

// The chunk's workspace gq slot (the per-token factors, 1 KB: 64 chunks of 16 B) by cp.async from threads
// tid of NT (the mma.sync scan's CTA, the wgmma scan's producer warp): staged the same way by both scans.
template <int NT>
__device__ __forceinline__ void issueFactors(uint32_t gqDst, ChunkWs const& ws, int64_t slot, int tid)
{
    static_assert(NT >= kC || kC % NT == 0, "factor split");
    // (the guarded form for a whole CTA keeps the K = 256 mma.sync scan at 255 registers without new spills)
    if constexpr (NT >= kC)
    {
        if (tid < kC)
            cpAsync16(gqDst + 16u * tid, ws.gq + slot * (4 * kC) + 4 * tid, 16);
    }
    else
    {
#pragma unroll
        for (int i = tid; i < kC; i += NT)
            cpAsync16(gqDst + 16u * i, ws.gq + slot * (4 * kC) + 4 * i, 16);
    }
}

template <typename T, int K, int NW>
__device__ __forceinline__ void scanIssueStage(uint32_t stAddr, GdnPrefillParams const& p, ChunkWs const& ws,
    int64_t slot, int t0, int len, int h, int hk, int vbase)
{
    using SM = ScanSmem<T, K, NW>;
    using St = typename SM::Stage;
    constexpr int NT = 32 * NW;
    int64_t const qkRow = (int64_t)p.Hk * K;
    int64_t const qk0 = ((int64_t)t0 * p.Hk + hk) * K;
    issueTile<K / 8, NT>(stAddr + offsetof(St, k), SM::KS, static_cast<uint16_t const*>(p.k) + qk0, qkRow, len);
    issueTile<K / 8, NT>(stAddr + offsetof(St, q), SM::KS, static_cast<uint16_t const*>(p.q) + qk0, qkRow, len);
    issueTile<kC / 8, NT>(stAddr + offsetof(St, tm), SM::CS, static_cast<uint16_t const*>(ws.tm) + slot * (kC * kC),
        kC, kC);
    issueTile<kC / 8, NT>(stAddr + offsetof(St, aqk), SM::CS,
        static_cast<uint16_t const*>(ws.aqk) + slot * (kC * kC), kC, kC);
    issueTile<SM::VT / 8, NT>(stAddr + offsetof(St, v), SM::VS,
        static_cast<uint16_t const*>(p.v) + ((int64_t)t0 * p.Hv + h) * p.V + vbase, (int64_t)p.Hv * p.V, len);
    issueFactors<NT>(stAddr + offsetof(St, gq), ws, slot, threadIdx.x);
}

template <typename T, int K, int NW>
__global__ void __launch_bounds__(32 * NW, 1) gdnPrefillScanKernel(GdnPrefillParams const p, ChunkWs const ws)
{
    using SM = ScanSmem<T, K, NW>;
    constexpr int KS = SM::KS, CS = SM::CS, NKT = K / 8;  // NKT: n8 tiles of S^T over K
    extern __shared__ __align__(16) unsigned char smemRaw[];
    auto& sm = *reinterpret_cast<SM*>(smemRaw);
    int const n = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int const Hv = p.Hv, V = p.V, hk = h / (Hv / p.Hk);
    int const vbase = blockIdx.z * SM::VT;
    SeqRange const seq = seqRange(p.cuSeqlens, n, p.T);
    int const bos = seq.begin, L = seq.end - seq.begin;
    int const nch = (L + kC - 1) / kC, id0 = bos / kC + n;
    int const vw = vbase + 16 * warp;  // this warp's first value column

    // S^T (16 value rows x K) in accumulator layout: s[t][e] = S[8t + 2qd + (e&1)][vw + gr + 8(e>>1)]
    float s[NKT][4];
    int64_t const sbase = ((int64_t)n * Hv + h) * K * V;
    loadStateT(s, p.initialState, sbase, V, vw, lane);
    using St = typename SM::Stage;
    uint32_t const st0 = smemAddr(&sm.st[0]);
    uint32_t const laneQK = ldsmLaneNK(KS, lane), laneC = ldsmLaneNK(CS, lane), laneKT = ldsmLaneKN(KS, lane);
    // stmatrix .x4 row addresses for the 8x8 matrices (j + (lane >> 4), hh = (lane >> 3) & 1)
    int const mrow = 8 * (lane >> 4) + (lane & 7), mcol = 8 * ((lane >> 3) & 1);
    uint32_t const aOut = smemAddr(&sm.out[warp][0][0]) + 2u * (mrow * SM::OS + mcol);
    if (nch > 0)
        scanIssueStage<T, K, NW>(st0, p, ws, (int64_t)id0 * Hv + h, bos, min(kC, L), h, hk, vbase);
    cpAsyncCommit();

    for (int c = 0; c < nch; ++c)
    {
        cpAsyncWaitAll();
        __syncthreads();
        if (c + 1 < nch)
            scanIssueStage<T, K, NW>(st0 + ((c + 1) & 1) * uint32_t(sizeof(St)), p, ws, (int64_t)(id0 + c + 1) * Hv + h, bos + (c + 1) * kC,
                min(kC, L - (c + 1) * kC), h, hk, vbase);
        cpAsyncCommit();
        auto const& st = sm.st[c & 1];
        int const len = min(kC, L - c * kC);
        uint32_t const sb = st0 + (c & 1) * uint32_t(sizeof(St));
        uint32_t const aK = sb + offsetof(St, k) + laneQK, aQ = sb + offsetof(St, q) + laneQK;
        uint32_t const aTm = sb + offsetof(St, tm) + laneC, aAq = sb + offsetof(St, aqk) + laneC;
        uint32_t const aKT = sb + offsetof(St, k) + laneKT;

        // P^T = S^T k^T and O1^T = S^T q^T (16 x 64 each)
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
                ldsmX4(b, aQ + 2u * (16 * j * KS + 16 * kk));
                mma16816<T>(oa[2 * j], a, b[0], b[1]);
                mma16816<T>(oa[2 * j + 1], a, b[2], b[3]);
            }
        }
        // X = v - e^G rk P ; O1 *= e^G qs (per-token factors precomputed by the prep kernel)
        applyX(pa, st.gq, &st.v[0][16 * warp], SM::VS, lane);
        applyO1(oa, st.gq, lane);
        // delta^T = X^T Tm'^T ; O^T += delta^T Aqk^T
        float da[8][4];
        mmaTriProduct<T, CS>(da, pa, aTm, false);
        mmaTriProduct<T, CS>(oa, da, aAq, true);
        // o -> per-warp staging (token rows; sm_90: stmatrix.trans of the accumulator pairs), then 16-byte
        // row stores of the valid rows
        storeOTile<T, SM::OS>(oa, sm.out[warp], aOut, static_cast<T*>(p.o) + ((int64_t)(bos + c * kC) * Hv + h) * V + vw,
            (int64_t)Hv * V, len, lane);
        // S^T = e^{G_C} S^T + (delta e^{G_C - G} rk)^T k
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
    storeStateT(s, p.finalState, sbase, V, vw, lane);
}

} // namespace prefill_chunked
} // namespace gdn
