// Chunked (64-token, WY/UT) prefill kernels for 16-bit I/O (bf16 / fp16), private to gdnPrefill.cu.
//
// Workspace, one slot per (chunk id, value head). Chunk c of sequence n (tokens bos_n + 64c ..) has
// id = bos_n / 64 + n + c, unique and < T/64 + N, so no host read of cu_seqlens is needed.
//   tm  [id][h][64][64] T : Tm' = (I + L)^-1 diag(beta), L_ij = beta_i e^{G_i-G_j} kn_i.kn_j (j < i)
//   aqk [id][h][64][64] T : Aqk_ij = e^{G_i-G_j} qn_i.kn_j (j <= i), qn = scale * q/|q|, kn = k/|k|
//   gqk [id][h][3][64] f32: G (cumulative log decay), qs = scale * rq, rk (inverse norms or 1)
// Tokens past the sequence end get g = 0, beta = 0, rq = rk = 0 (all their terms vanish).
//
// Prep kernel (parallel over chunks x heads): q.k^T and k.k^T on tensor cores, the unit lower
// triangular inverse by forward substitution (one column per thread, fp32 registers).
// Scan kernel (per sequence x value head x V-tile, sequential over chunks): gdnPrefillScan.cuh.
#pragma once

#include "gdnCommon.cuh"
#include "gdnPrefillMma.cuh"

namespace gdn
{
namespace prefill_chunked
{

using namespace detail;
using namespace prefill_mma;

constexpr int kC = 64;  // chunk size (spec chunk_size)

// Largest n in [0, N) with cu[n] / 64 + n <= id (chunk ids are increasing in n).
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

// Workspace pointers (see the layout above); set up by the host from p.workspace.
struct ChunkWs
{
    void* aqk;
    void* tm;
    float* gq;
};

template <typename T, int K>
struct PrepSmem
{
    static constexpr int KS = K + 8;  // padded row (16 B): conflict-free ldmatrix
    static constexpr int LS = kC + 4;
    union
    {
        struct
        {
            T q[kC][KS];
            T k[kC][KS];
        } in;
        float X[kC][LS];  // (I + L)^-1, built after q and k are consumed
    } u;
    float L[kC][LS];
    float R[16][48];
    float G[kC], beta[kC], qs[kC], rk[kC];
    float scanTmp[2];
};

template <typename T, int K>
__global__ void __launch_bounds__(128) gdnPrefillPrepKernel(GdnPrefillParams const p, ChunkWs const ws)
{
    extern __shared__ __align__(16) unsigned char smemRaw[];
    auto& sm = *reinterpret_cast<PrepSmem<T, K>*>(smemRaw);
    constexpr int KS = PrepSmem<T, K>::KS;
    int const id = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int const n = seqOfChunk(p.cuSeqlens, p.N, id);
    int const bos = p.cuSeqlens[n], L = p.cuSeqlens[n + 1] - bos;
    int const c = id - (bos / kC + n);
    if (c < 0 || c * kC >= L)
        return;  // unused id (gap after a short or empty sequence)
    int const t0 = bos + c * kC, len = min(kC, L - c * kC);
    int const Hv = p.Hv, Hk = p.Hk, hk = h / (Hv / Hk);

    // raw q, k rows -> shared (16 B copies, zero rows past the end)
    constexpr int VEC = 8;  // 16-bit elements per 16 B
    for (int i = tid; i < kC * (K / VEC); i += 128)
    {
        int const r = i / (K / VEC), cc = (i % (K / VEC)) * VEC;
        bool const ok = r < len;
        int64_t const off = ((int64_t)(t0 + (ok ? r : 0)) * Hk + hk) * K + cc;
        cpAsync16(&sm.u.in.q[r][cc], static_cast<T const*>(p.q) + off, ok ? 16 : 0);
        cpAsync16(&sm.u.in.k[r][cc], static_cast<T const*>(p.k) + off, ok ? 16 : 0);
    }
    cpAsyncCommit();
    // gates and their cumulative sum (warps 0, 1: 32 tokens each)
    if (tid < kC)
    {
        float g = 0.f, b = 0.f;
        if (tid < len)
        {
            int64_t const gi = (int64_t)(t0 + tid) * Hv + h;
            Gate const gt = computeGate(
                p.gateMode, loadAny(p.g, p.gateType, gi), loadAny(p.beta, p.gateType, gi), p.ALog, p.dtBias, h);
            g = gt.g;
            b = gt.beta;
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1)
        {
            float const y = __shfl_up_sync(0xffffffffu, g, o);
            if (lane >= o)
                g += y;
        }
        if (tid == 31)
            sm.scanTmp[0] = g;
        sm.G[tid] = g;
        sm.beta[tid] = b;
    }
    cpAsyncWaitAll();
    __syncthreads();
    if (tid >= 32 && tid < kC)
        sm.G[tid] += sm.scanTmp[0];
    // inverse norms (warp w: rows w, w+4, ...)
    float const scale = effectiveScale(p.scale, K);
    for (int r = warp; r < kC; r += 4)
    {
        float sq = 0.f, sk = 0.f;
        for (int cc = lane; cc < K; cc += 32)
        {
            float const a = toFloat(sm.u.in.q[r][cc]), b = toFloat(sm.u.in.k[r][cc]);
            sq += a * a;
            sk += b * b;
        }
        sq = warpSum(sq);
        sk = warpSum(sk);
        if (lane == 0)
        {
            bool const ok = r < len;
            float const rq = p.useQkL2norm ? rsqrtf(sq + p.l2normEps) : 1.f;
            float const rkk = p.useQkL2norm ? rsqrtf(sk + p.l2normEps) : 1.f;
            sm.qs[r] = ok ? scale * rq : 0.f;
            sm.rk[r] = ok ? rkk : 0.f;
        }
    }
    __syncthreads();

    // k.k^T and q.k^T for rows 16w..16w+15 (8 n8 tiles over the 64 columns)
    float kk[8][4], qk[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            kk[j][e] = qk[j][e] = 0.f;
#pragma unroll
    for (int s = 0; s < K / 16; ++s)
    {
        uint32_t ak[4], aq[4];
        ldsmX4(ak, ldsmRowsNK(&sm.u.in.k[16 * warp][0], KS, 0, s, lane));
        ldsmX4(aq, ldsmRowsNK(&sm.u.in.q[16 * warp][0], KS, 0, s, lane));
        // ldsmRowsNK with j = 0 over 16 rows yields (rows 0-7|8-15) x (k lo|hi) as r0=(0-7,lo),
        // r1=(0-7,hi), r2=(8-15,lo), r3=(8-15,hi); the A fragment wants (0-7,lo),(8-15,lo),(0-7,hi),(8-15,hi).
        uint32_t const a1[4] = {ak[0], ak[2], ak[1], ak[3]};
        uint32_t const a2[4] = {aq[0], aq[2], aq[1], aq[3]};
#pragma unroll
        for (int j = 0; j < 4; ++j)
        {
            if (j > warp)
                break;  // only the lower triangle (column blocks <= row block) is used
            uint32_t b[4];
            ldsmX4(b, ldsmRowsNK(&sm.u.in.k[0][0], KS, j, s, lane));
            mma16816<T>(kk[2 * j], a1, b[0], b[1]);
            mma16816<T>(kk[2 * j + 1], a1, b[2], b[3]);
            mma16816<T>(qk[2 * j], a2, b[0], b[1]);
            mma16816<T>(qk[2 * j + 1], a2, b[2], b[3]);
        }
    }
    int64_t const slot = (int64_t)id * Hv + h;
    T* aqkOut = static_cast<T*>(ws.aqk) + slot * (kC * kC);
    T* tmOut = static_cast<T*>(ws.tm) + slot * (kC * kC);
    float* gqOut = ws.gq + slot * (3 * kC);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
        {
            int const i = 16 * warp + (lane >> 2) + 8 * hh;
            float const Gi = sm.G[i];
            float vals[2];
#pragma unroll
            for (int e = 0; e < 2; ++e)
            {
                int const jj = 8 * j + 2 * (lane & 3) + e;
                float const dec = jj <= i ? __expf(Gi - sm.G[jj]) : 0.f;
                sm.L[i][jj] = jj < i ? sm.beta[i] * dec * sm.rk[i] * sm.rk[jj] * kk[j][2 * hh + e] : 0.f;
                vals[e] = dec * sm.qs[i] * sm.rk[jj] * qk[j][2 * hh + e];
            }
            *reinterpret_cast<uint32_t*>(aqkOut + i * kC + 8 * j + 2 * (lane & 3)) = pack2<T>(vals[0], vals[1]);
        }
    __syncthreads();
    // (I + L)^-1 by 16x16 blocks: X_aa = (I + L_aa)^-1 by forward substitution (one column per
    // thread), then block rows a = 1..3: X_a,<a = -X_aa (L_a,<a X_<a,<a).
    if (tid < kC)
    {
        int const a = tid >> 4, cl = tid & 15, o = 16 * a;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; ++i)
        {
            float acc = (i == cl) ? 1.f : 0.f;
#pragma unroll
            for (int j = 0; j < i; ++j)
                acc = fmaf(-sm.L[o + i][o + j], x[j], acc);
            x[i] = acc;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i)
            sm.u.X[o + i][o + cl] = x[i];
    }
    __syncthreads();
#pragma unroll
    for (int a = 1; a < 4; ++a)
    {
        int const o = 16 * a, w = 16 * a;  // w: columns left of the diagonal block
        for (int idx = tid; idx < 16 * w; idx += 128)
        {
            int const i = idx / w, col = idx % w;
            float acc = 0.f;
            for (int j = (col >> 4) << 4; j < o; ++j)  // X[j][col] = 0 above the block diagonal
                acc = fmaf(sm.L[o + i][j], sm.u.X[j][col], acc);
            sm.R[i][col] = acc;
        }
        __syncthreads();
        for (int idx = tid; idx < 16 * w; idx += 128)
        {
            int const i = idx / w, col = idx % w;
            float acc = 0.f;
            for (int m = 0; m <= i; ++m)
                acc = fmaf(sm.u.X[o + i][o + m], sm.R[m][col], acc);
            sm.u.X[o + i][col] = -acc;
        }
        __syncthreads();
    }
    // Tm' = X diag(beta) (zero above the block diagonal), and the per-token scalars
    for (int idx = tid; idx < kC * kC / 2; idx += 128)
    {
        int const i = idx / (kC / 2), c2 = 2 * (idx % (kC / 2));
        bool const lo = (c2 >> 4) <= (i >> 4);
        float const v0 = lo ? sm.u.X[i][c2] * sm.beta[c2] : 0.f;
        float const v1 = lo ? sm.u.X[i][c2 + 1] * sm.beta[c2 + 1] : 0.f;
        *reinterpret_cast<uint32_t*>(tmOut + i * kC + c2) = pack2<T>(v0, v1);
    }
    if (tid < kC)
    {
        gqOut[tid] = sm.G[tid];
        gqOut[kC + tid] = sm.qs[tid];
        gqOut[2 * kC + tid] = sm.rk[tid];
    }
}

} // namespace prefill_chunked
} // namespace gdn
