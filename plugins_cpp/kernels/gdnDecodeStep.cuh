// One recurrent step on a register-resident state tile: the pieces the decode kernel (gdnDecode.cu) and the
// verify / commit kernels (gdnVerify.cu) share.
//
// Tiling: one CTA per (sequence, value head, V-tile of BV columns). VL = BV/4 lanes run across V (each owns 4
// consecutive columns: one 16-byte float4 per state row) and KG = NT/VL K-groups split the K rows (group kg owns
// rows kg, kg+KG, ...: R rows per thread). Each thread keeps its R x 4 slice S of the state in registers.
//
// Math (one reduction pass instead of two): with a = exp(g), raw q, k and
// rq = scale * (l2norm ? 1/sqrt(|q|^2+eps) : 1), rk = (l2norm ? 1/sqrt(|k|^2+eps) : 1),
//   delta = beta * (v - a * rk * S^T k)
//   S'    = a * S + (rk k) delta^T
//   o     = S'^T (rq q) = rq * (a * S^T q + rk * (q.k) * delta)
// so S^T k, S^T q, |q|^2, |k|^2 and q.k are all reduced over K from the OLD state in one pass (in-thread over
// R rows, across the K-groups of a warp with shuffles, across warps in shared memory).
#pragma once

#include "gdnCommon.cuh"

namespace gdn
{
namespace detail
{

constexpr int kStepMaxThreads = 256;

template <int K, int BV>
struct StepTile
{
    static constexpr int VL = BV / 4;                                                       // lanes across V
    static constexpr int NT = (K * VL / 4) < kStepMaxThreads ? (K * VL / 4) : kStepMaxThreads;  // threads
    static constexpr int KG = NT / VL;                                                      // K-groups
    static constexpr int R = K / KG;                                                        // rows per thread
    static constexpr int NW = NT / 32;                                                      // warps
    static constexpr int NRED = 12;                                                         // reduced values (11 used)
    static_assert(VL >= 1 && VL <= 32 && (32 % VL) == 0, "BV/4 must divide 32");
    static_assert(NT % 32 == 0 && NT >= 32, "whole warps");
    static_assert(K % KG == 0 && R >= 1, "rows split evenly");
};

// The CTA-wide sums of S^T k (tot[0..3]), S^T q (tot[4..7]), |q|^2 (tot[8]), |k|^2 (tot[9]) and q.k (tot[10])
// for this thread's 4 columns. red is [NW][VL][NRED] shared floats; one __syncthreads inside: a caller that
// reuses red for the next step must pass the other half of a double buffer (or sync again).
template <int R, int NW, int VL, int NRED>
__device__ __forceinline__ void stepTotals(float const (&S)[R][4], float const (&qr)[R], float const (&kr)[R],
                                           float (*red)[VL][NRED], int tid, float (&tot)[12])
{
    float acc[11];
#pragma unroll
    for (int j = 0; j < 11; ++j)
        acc[j] = 0.f;
#pragma unroll
    for (int i = 0; i < R; ++i)
    {
#pragma unroll
        for (int j = 0; j < 4; ++j)
        {
            acc[j] = fmaf(S[i][j], kr[i], acc[j]);          // S^T k
            acc[4 + j] = fmaf(S[i][j], qr[i], acc[4 + j]);  // S^T q
        }
        acc[8] = fmaf(qr[i], qr[i], acc[8]);    // |q|^2
        acc[9] = fmaf(kr[i], kr[i], acc[9]);    // |k|^2
        acc[10] = fmaf(qr[i], kr[i], acc[10]);  // q.k
    }
    // Across the K-groups of this warp (lanes sharing lane % VL).
#pragma unroll
    for (int j = 0; j < 11; ++j)
        acc[j] = warpSumStrided<VL>(acc[j]);
    int const warp = tid / 32;
    int const lane = tid % 32;
    int const vl = tid % VL;
    if (lane < VL)
    {
#pragma unroll
        for (int j = 0; j < 11; ++j)
            red[warp][vl][j] = acc[j];
        red[warp][vl][11] = 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 12; ++j)
        tot[j] = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w)
    {
#pragma unroll
        for (int j = 0; j < 12; j += 4)
        {
            float4 const x = *reinterpret_cast<float4 const*>(&red[w][vl][j]);
            tot[j] += x.x;
            tot[j + 1] += x.y;
            tot[j + 2] += x.z;
            tot[j + 3] += x.w;
        }
    }
}

// From the totals: rk (the k normaliser), delta and o for this thread's 4 columns. qscale = effectiveScale.
__device__ __forceinline__ float stepDeltaOut(float const (&tot)[12], float a, float beta, float const (&vv)[4],
                                              bool l2norm, float eps, float qscale, float (&delta)[4],
                                              float (&out)[4])
{
    float const rk = l2norm ? rsqrtf(tot[9] + eps) : 1.f;
    float const rq = qscale * (l2norm ? rsqrtf(tot[8] + eps) : 1.f);
#pragma unroll
    for (int j = 0; j < 4; ++j)
    {
        delta[j] = beta * (vv[j] - a * rk * tot[j]);
        out[j] = rq * (a * tot[4 + j] + rk * tot[10] * delta[j]);
    }
    return rk;
}

// One state row of this thread: s <- a s + kn delta^T (kn = the row's normalised key entry).
__device__ __forceinline__ void stepUpdateRow(float (&s)[4], float a, float kn, float const (&d)[4])
{
#pragma unroll
    for (int j = 0; j < 4; ++j)
        s[j] = fmaf(a, s[j], kn * d[j]);
}

}  // namespace detail
}  // namespace gdn
