// GatedDeltaVerify and GatedDeltaCommit (speculative decoding, docs/speculative.md).
//
// Both use the decode kernel's tiling (gdnDecode.cu): one CTA per (sequence n, value head h, V-tile of BV
// columns); VL = BV/4 lanes across V (4 consecutive columns each), KG = NT/VL K-groups, R rows per thread; the
// R x 4 state slice stays in registers.
//
// Verify reads the state tile once, stages the sequence's T_n <= kMaxDraftTokens tokens (q, k, v, gates) in
// shared memory, then runs the decode step T_n times in registers (one reduction pass over K per token, one
// __syncthreads per token through a double-buffered reduction array) and writes o plus the per-step factors
// k_hat (L2-normed, unscaled), delta = beta (v - a S^T k_hat) and g. The state is never written.
// Commit stages the first accepted[n] factors and replays S <- exp(g) S + k_hat delta^T with the same float32
// operations the verify used on its register copy, then writes the tile back in place.
//
// Untrusted indices: each sequence's token range is [clamp(cu[n], 0, T), clamp(cu[n+1], start, T)], cut to
// kMaxDraftTokens tokens; accepted[n] is clamped to [0, T_n]; a slot outside [0, P) skips the sequence
// (verify: o and factors 0; commit: nothing written). No index reaches outside its buffer.
#include "gdnCommon.cuh"
#include "gdnDecodeStep.cuh"
#include "gdnKernels.h"
#include "gdnOpSpec.h"

#include <cstdint>
#include <cstdio>

namespace gdn
{
namespace
{

using namespace detail;

constexpr int kMaxTok = spec::kMaxDraftTokens;

template <int K, int BV>
using VerifyTile = StepTile<K, BV>;

// Token range of sequence n, clamped to [0, T] and kMaxTok tokens.
__device__ __forceinline__ void tokenRange(int32_t const* cu, int n, int T, int& s, int& e)
{
    int const a = cu[n];
    int const b = cu[n + 1];
    s = min(max(a, 0), T);
    e = min(max(b, s), T);
    e = min(e, s + kMaxTok);
}

template <typename T, int K, int BV>
__global__ void __launch_bounds__(VerifyTile<K, BV>::NT) gdnVerifyKernel(GdnVerifyParams const p)
{
    using Tile = VerifyTile<K, BV>;
    constexpr int VL = Tile::VL, KG = Tile::KG, R = Tile::R, NW = Tile::NW, NRED = Tile::NRED, NT = Tile::NT;
    __shared__ __align__(16) float red[2][NW][VL][NRED];
    __shared__ float sq[kMaxTok][K];
    __shared__ float sk[kMaxTok][K];
    __shared__ __align__(16) float sv[kMaxTok][BV];
    __shared__ float sg[kMaxTok];
    __shared__ float sb[kMaxTok];

    int const V = p.V;
    int const nvt = V / BV;
    int const blk = blockIdx.x;
    int const vt = blk % nvt;
    int const nh = blk / nvt;
    int const h = nh % p.Hv;
    int const n = nh / p.Hv;
    int const rep = p.Hv / p.Hk;
    int const hk = h / rep;

    int const tid = threadIdx.x;
    int const vl = tid % VL;
    int const kg = tid / VL;
    int const col = vt * BV + vl * 4;

    int s, e;
    tokenRange(p.cuSeqlens, n, p.T, s, e);
    int const nt = e - s;
    if (nt <= 0)
        return;

    T* o = static_cast<T*>(p.o);
    bool const writesK = (vt == 0) && (h % rep == 0);  // one CTA per (token, key head) writes commitK

    int64_t row = n;
    if (p.stateMode == 1)
    {
        int const slot = p.slots[n];
        if (slot < 0 || slot >= p.P)  // skipped: o and the factors are 0
        {
            float const z[4] = {0.f, 0.f, 0.f, 0.f};
            for (int t = kg; t < nt; t += KG)
            {
                int64_t const off = (static_cast<int64_t>(s + t) * p.Hv + h) * V + col;
                store4(o, off, z);
                store4(p.commitDelta, off, z);
            }
            if (vt == 0)
                for (int t = tid; t < nt; t += NT)
                    p.commitG[static_cast<int64_t>(s + t) * p.Hv + h] = 0.f;
            if (writesK)
                for (int i = tid; i < nt * K; i += NT)
                    p.commitK[(static_cast<int64_t>(s + i / K) * p.Hk + hk) * K + i % K] = 0.f;
            return;
        }
        row = slot;
    }

    // The state slice first (the longest latency), then the staged token inputs.
    int64_t const sOff = (row * p.Hv + h) * static_cast<int64_t>(K) * V + col;
    float S[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i)
        load4(p.state, sOff + static_cast<int64_t>(kg + i * KG) * V, S[i]);

    T const* qp = static_cast<T const*>(p.q);
    T const* kp = static_cast<T const*>(p.k);
    T const* vp = static_cast<T const*>(p.v);
    for (int i = tid; i < nt * K; i += NT)
    {
        int const t = i / K, c = i % K;
        int64_t const off = (static_cast<int64_t>(s + t) * p.Hk + hk) * K + c;
        sq[t][c] = loadF(qp, off);
        sk[t][c] = loadF(kp, off);
    }
    for (int i = tid; i < nt * VL; i += NT)
    {
        int const t = i / VL, c = (i % VL) * 4;
        float x[4];
        load4(vp, (static_cast<int64_t>(s + t) * p.Hv + h) * V + vt * BV + c, x);
        *reinterpret_cast<float4*>(&sv[t][c]) = make_float4(x[0], x[1], x[2], x[3]);
    }
    if (tid < nt)
    {
        int64_t const gi = static_cast<int64_t>(s + tid) * p.Hv + h;
        Gate const gt = computeGate(p.gateMode, loadAny(p.g, p.gateType, gi), loadAny(p.beta, p.gateType, gi),
                                    p.ALog, p.dtBias, h);
        sg[tid] = gt.g;
        sb[tid] = gt.beta;
        if (vt == 0)
            p.commitG[gi] = gt.g;
    }
    __syncthreads();

    float const qscale = effectiveScale(p.scale, K);
    for (int t = 0; t < nt; ++t)
    {
        float qr[R], kr[R];
#pragma unroll
        for (int i = 0; i < R; ++i)
        {
            qr[i] = sq[t][kg + i * KG];
            kr[i] = sk[t][kg + i * KG];
        }
        float tot[12];
        stepTotals<R, NW, VL, NRED>(S, qr, kr, red[t & 1], tid, tot);  // double buffer: red[t&1] is rewritten
                                                                      // at t+2, after every thread passed t+1
        float vv[4];
        *reinterpret_cast<float4*>(vv) = *reinterpret_cast<float4 const*>(&sv[t][vl * 4]);
        float delta[4], out[4];
        float const a = expf(sg[t]);
        float const rk = stepDeltaOut(tot, a, sb[t], vv, p.useQkL2norm, p.l2normEps, qscale, delta, out);
        int64_t const tok = s + t;
        if (kg == 0)
        {
            int64_t const off = (tok * p.Hv + h) * V + col;
            store4(o, off, out);
            store4(p.commitDelta, off, delta);
        }
        if (writesK && vl == 0)
        {
#pragma unroll
            for (int i = 0; i < R; ++i)
                p.commitK[(tok * p.Hk + hk) * K + kg + i * KG] = kr[i] * rk;
        }
#pragma unroll
        for (int i = 0; i < R; ++i)
            stepUpdateRow(S[i], a, kr[i] * rk, delta);
    }
}

template <int K, int BV>
__global__ void __launch_bounds__(VerifyTile<K, BV>::NT) gdnCommitKernel(GdnCommitParams const p)
{
    using Tile = VerifyTile<K, BV>;
    constexpr int VL = Tile::VL, KG = Tile::KG, R = Tile::R, NT = Tile::NT;
    __shared__ float sk[kMaxTok][K];
    __shared__ __align__(16) float sd[kMaxTok][BV];
    __shared__ float sa[kMaxTok];

    int const V = p.V;
    int const nvt = V / BV;
    int const blk = blockIdx.x;
    int const vt = blk % nvt;
    int const nh = blk / nvt;
    int const h = nh % p.Hv;
    int const n = nh / p.Hv;
    int const hk = h / (p.Hv / p.Hk);

    int const tid = threadIdx.x;
    int const vl = tid % VL;
    int const kg = tid / VL;
    int const col = vt * BV + vl * 4;

    int s, e;
    tokenRange(p.cuSeqlens, n, p.T, s, e);
    int const j = min(max(p.accepted[n], 0), e - s);
    if (j <= 0)
        return;
    int64_t row = n;
    if (p.stateMode == 1)
    {
        int const slot = p.slots[n];
        if (slot < 0 || slot >= p.P)
            return;
        row = slot;
    }

    int64_t const sOff = (row * p.Hv + h) * static_cast<int64_t>(K) * V + col;
    float S[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i)
        load4(p.state, sOff + static_cast<int64_t>(kg + i * KG) * V, S[i]);

    for (int i = tid; i < j * K; i += NT)
    {
        int const t = i / K, c = i % K;
        sk[t][c] = p.commitK[(static_cast<int64_t>(s + t) * p.Hk + hk) * K + c];
    }
    for (int i = tid; i < j * VL; i += NT)
    {
        int const t = i / VL, c = (i % VL) * 4;
        float x[4];
        load4(p.commitDelta, (static_cast<int64_t>(s + t) * p.Hv + h) * V + vt * BV + c, x);
        *reinterpret_cast<float4*>(&sd[t][c]) = make_float4(x[0], x[1], x[2], x[3]);
    }
    if (tid < j)
        sa[tid] = expf(p.commitG[static_cast<int64_t>(s + tid) * p.Hv + h]);
    __syncthreads();

    for (int t = 0; t < j; ++t)
    {
        float const a = sa[t];
        float d[4];
        *reinterpret_cast<float4*>(d) = *reinterpret_cast<float4 const*>(&sd[t][vl * 4]);
#pragma unroll
        for (int i = 0; i < R; ++i)
            stepUpdateRow(S[i], a, sk[t][kg + i * KG], d);
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
        store4(p.state, sOff + static_cast<int64_t>(kg + i * KG) * V, S[i]);
}

// V-tile: the decode launcher's choice for N*Hv heads (gdnDecode.cu).
int pickTile(int64_t heads, int K, int V)
{
    int const sms = smCount();
    if (K == 128 && heads * (V / 64) >= 4LL * sms)
        return 64;
    if (heads * (V / 32) >= 2LL * sms)
        return 32;
    return 16;
}

template <typename T, int K, int BV>
cudaError_t launchVerifyTile(GdnVerifyParams const& p, cudaStream_t stream)
{
    int64_t const blocks = static_cast<int64_t>(p.N) * p.Hv * (p.V / BV);
    if (blocks > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    gdnVerifyKernel<T, K, BV><<<static_cast<unsigned>(blocks), VerifyTile<K, BV>::NT, 0, stream>>>(p);
    return cudaGetLastError();
}

template <int K, int BV>
cudaError_t launchCommitTile(GdnCommitParams const& p, cudaStream_t stream)
{
    int64_t const blocks = static_cast<int64_t>(p.N) * p.Hv * (p.V / BV);
    if (blocks > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    gdnCommitKernel<K, BV><<<static_cast<unsigned>(blocks), VerifyTile<K, BV>::NT, 0, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int BV>
cudaError_t launchVerifyK(GdnVerifyParams const& p, cudaStream_t stream)
{
    switch (p.K)
    {
    case 64: return launchVerifyTile<T, 64, BV>(p, stream);
    case 128: return launchVerifyTile<T, 128, BV>(p, stream);
    case 256:
        if constexpr (BV <= 32)  // (BV = 64 would pass 48 KiB of static shared memory; pickTile never asks)
            return launchVerifyTile<T, 256, BV>(p, stream);
        else
            return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
    }
}

template <int BV>
cudaError_t launchCommitK(GdnCommitParams const& p, cudaStream_t stream)
{
    switch (p.K)
    {
    case 64: return launchCommitTile<64, BV>(p, stream);
    case 128: return launchCommitTile<128, BV>(p, stream);
    case 256:
        if constexpr (BV <= 32)
            return launchCommitTile<256, BV>(p, stream);
        else
            return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
    }
}

bool aligned(void const* ptr, uintptr_t n)
{
    return (reinterpret_cast<uintptr_t>(ptr) % n) == 0;
}

char const* shapeProblem(int T, int N, int P, int Hk, int Hv, int K, int V, int stateMode)
{
    if (T < 0 || N < 0 || P < 0 || Hk <= 0 || Hv <= 0)
        return "T, N, P must be >= 0 and Hk, Hv > 0";
    if (Hv % Hk != 0)
        return "Hv must be a multiple of Hk (grouped value attention)";
    if (!spec::isKernelHeadDim(K) || !spec::isKernelHeadDim(V))
        return "the CUDA kernel supports head dims K, V in {64, 128, 256} only";
    if (stateMode != 0 && stateMode != 1)
        return "stateMode must be 0 or 1";
    if (stateMode == 0 && P != N)
        return "stateMode 0 needs P == N (one state row per sequence)";
    return "";
}

} // namespace

char const* gdnVerifySupports(GdnVerifyParams const& p)
{
    static thread_local char buf[160];
    char const* why = shapeProblem(p.T, p.N, p.P, p.Hk, p.Hv, p.K, p.V, p.stateMode);
    if (why[0] != '\0')
    {
        snprintf(buf, sizeof(buf), "verify: %s", why);
        return buf;
    }
    if (!detail::isValidDType(p.ioType) || !detail::isValidDType(p.gateType))
        return "verify: ioType and gateType must be float32, float16 or bfloat16";
    if (p.gateMode != 0 && p.gateMode != 1)
        return "verify: gateMode must be 0 or 1";
    if (p.useQkL2norm != 0 && p.useQkL2norm != 1)
        return "verify: useQkL2norm must be 0 or 1";
    if (!(p.scale >= 0.f) || !(p.l2normEps > 0.f))
        return "verify: scale must be >= 0 and l2normEps > 0";
    if (p.N == 0 || p.T == 0)
        return "";
    if (!p.q || !p.k || !p.v || !p.g || !p.beta || !p.cuSeqlens || !p.state || !p.o || !p.commitK
        || !p.commitDelta || !p.commitG)
        return "verify: q, k, v, g, beta, cuSeqlens, state, o and the commit factors must be non-null";
    if (p.stateMode == 1 && !p.slots)
        return "verify: stateMode 1 needs slots";
    if (p.gateMode == 1 && (!p.ALog || !p.dtBias))
        return "verify: gateMode 1 needs ALog and dtBias";
    uintptr_t const ioAlign = p.ioType == DType::kFloat32 ? 16 : 8;
    if (!aligned(p.v, ioAlign) || !aligned(p.o, ioAlign))
        return "verify: v and o must be 16-byte (float32) / 8-byte (16-bit) aligned";
    if (!aligned(p.state, 16) || !aligned(p.commitDelta, 16))
        return "verify: state and commitDelta must be 16-byte aligned";
    return "";
}

char const* gdnCommitSupports(GdnCommitParams const& p)
{
    static thread_local char buf[160];
    char const* why = shapeProblem(p.T, p.N, p.P, p.Hk, p.Hv, p.K, p.V, p.stateMode);
    if (why[0] != '\0')
    {
        snprintf(buf, sizeof(buf), "commit: %s", why);
        return buf;
    }
    if (p.N == 0 || p.T == 0)
        return "";
    if (!p.commitK || !p.commitDelta || !p.commitG || !p.cuSeqlens || !p.accepted || !p.state)
        return "commit: commitK, commitDelta, commitG, cuSeqlens, accepted and state must be non-null";
    if (p.stateMode == 1 && !p.slots)
        return "commit: stateMode 1 needs slots";
    if (!aligned(p.state, 16) || !aligned(p.commitDelta, 16))
        return "commit: state and commitDelta must be 16-byte aligned";
    return "";
}

cudaError_t launchGdnVerify(GdnVerifyParams const& p, cudaStream_t stream)
{
    if (gdnVerifySupports(p)[0] != '\0')
        return cudaErrorInvalidValue;
    if (p.N == 0 || p.T == 0)
        return cudaSuccess;
    cudaError_t err = cudaErrorInvalidValue;
    switch (pickTile(static_cast<int64_t>(p.N) * p.Hv, p.K, p.V))
    {
    case 16: GDN_DISPATCH_DTYPE(p.ioType, T, err = (launchVerifyK<T, 16>(p, stream))); break;
    case 32: GDN_DISPATCH_DTYPE(p.ioType, T, err = (launchVerifyK<T, 32>(p, stream))); break;
    case 64: GDN_DISPATCH_DTYPE(p.ioType, T, err = (launchVerifyK<T, 64>(p, stream))); break;
    default: break;
    }
    return err;
}

cudaError_t launchGdnCommit(GdnCommitParams const& p, cudaStream_t stream)
{
    if (gdnCommitSupports(p)[0] != '\0')
        return cudaErrorInvalidValue;
    if (p.N == 0 || p.T == 0)
        return cudaSuccess;
    switch (pickTile(static_cast<int64_t>(p.N) * p.Hv, p.K, p.V))
    {
    case 16: return launchCommitK<16>(p, stream);
    case 32: return launchCommitK<32>(p, stream);
    case 64: return launchCommitK<64>(p, stream);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace gdn
