// GatedDeltaDecode: one token per sequence, float32 state [rows, Hv, K, V] read once and written once.
//
// Tiling and math: gdnDecodeStep.cuh (shared with the verify / commit kernels, gdnVerify.cu).
#include "gdnCommon.cuh"
#include "gdnDecodeStep.cuh"
#include "gdnKernels.h"
#include "gdnOpSpec.h"

#include <cstdint>

namespace gdn
{
namespace
{

using namespace detail;

// Small tiles (BV <= 16: the automatic pick for small batches, e.g. B = 1) load and store the state,
// touched once, with the streaming (evict-first) cache hint: it shortens the single-wave B = 1 launch, while
// larger tiles at large batches lose a little (docs/performance.md, Decode streaming hint).
template <bool Stream>
__device__ __forceinline__ void loadState4(float const* p, int64_t i, float (&out)[4])
{
    if constexpr (Stream)
    {
        float4 const v = __ldcs(reinterpret_cast<float4 const*>(p + i));
        out[0] = v.x;
        out[1] = v.y;
        out[2] = v.z;
        out[3] = v.w;
    }
    else
        load4(p, i, out);
}
template <bool Stream>
__device__ __forceinline__ void storeState4(float* p, int64_t i, float const (&x)[4])
{
    if constexpr (Stream)
        __stcs(reinterpret_cast<float4*>(p + i), make_float4(x[0], x[1], x[2], x[3]));
    else
        store4(p, i, x);
}

template <int K, int BV>
using DecodeTile = StepTile<K, BV>;

template <typename T, int K, int BV>
__global__ void __launch_bounds__(DecodeTile<K, BV>::NT) gdnDecodeKernel(GdnDecodeParams const p)
{
    using Tile = DecodeTile<K, BV>;
    constexpr int VL = Tile::VL, KG = Tile::KG, R = Tile::R, NW = Tile::NW, NRED = Tile::NRED;
    __shared__ __align__(16) float red[NW][VL][NRED];

    int const V = p.V;
    int const nvt = V / BV;
    int const blk = blockIdx.x;
    int const vt = blk % nvt;
    int const bh = blk / nvt;
    int const h = bh % p.Hv;
    int const b = bh / p.Hv;
    int const hk = h / (p.Hv / p.Hk);

    int const tid = threadIdx.x;
    int const vl = tid % VL;
    int const kg = tid / VL;
    int const col = vt * BV + vl * 4;

    T* o = static_cast<T*>(p.o);
    int64_t const oOff = (static_cast<int64_t>(b) * p.Hv + h) * V + col;

    // q, k, v and the gates do not depend on the state row: issue them first (in pool mode they are in
    // flight while the slot is read, which would otherwise add a dependent round trip before the state).
    T const* qp = static_cast<T const*>(p.q) + (static_cast<int64_t>(b) * p.Hk + hk) * K;
    T const* kp = static_cast<T const*>(p.k) + (static_cast<int64_t>(b) * p.Hk + hk) * K;
    float qr[R], kr[R];
#pragma unroll
    for (int i = 0; i < R; ++i)
    {
        qr[i] = loadF(qp, kg + i * KG);
        kr[i] = loadF(kp, kg + i * KG);
    }
    float vv[4];
    load4(static_cast<T const*>(p.v), oOff, vv);
    int64_t const gi = static_cast<int64_t>(b) * p.Hv + h;
    float const gIn = loadAny(p.g, p.gateType, gi);
    float const bIn = loadAny(p.beta, p.gateType, gi);

    int64_t row = b;
    if (p.stateMode == 1)
    {
        // slot -1 skips the sequence. Slots are not trusted (TensorRT times the plugin with inputs it fills
        // itself; the torch binding validates them on the host): any slot outside [0, P) skips it too.
        int const slot = p.slots[b];
        if (slot < 0 || slot >= p.P)  // skipped sequence: o = 0, pool untouched (uniform across the CTA)
        {
            if (kg == 0)
            {
                float const z[4] = {0.f, 0.f, 0.f, 0.f};
                store4(o, oOff, z);
            }
            return;
        }
        row = slot;
    }

    // The R state rows of this thread: all loads issued before the first use.
    int64_t const sOff = (row * p.Hv + h) * static_cast<int64_t>(K) * V + col;
    float S[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i)
        loadState4<(BV <= 16)>(p.stateIn, sOff + static_cast<int64_t>(kg + i * KG) * V, S[i]);

    float tot[12];
    stepTotals<R, NW, VL, NRED>(S, qr, kr, red, tid, tot);

    Gate const gt = computeGate(p.gateMode, gIn, bIn, p.ALog, p.dtBias, h);
    float const a = expf(gt.g);
    float delta[4], out[4];
    float const rk = stepDeltaOut(tot, a, gt.beta, vv, p.useQkL2norm, p.l2normEps, effectiveScale(p.scale, K),
                                  delta, out);
    if (kg == 0)
        store4(o, oOff, out);

#pragma unroll
    for (int i = 0; i < R; ++i)
    {
        stepUpdateRow(S[i], a, kr[i] * rk, delta);
        storeState4<(BV <= 16)>(p.stateOut, sOff + static_cast<int64_t>(kg + i * KG) * V, S[i]);
    }
}

template <typename T, int K, int BV>
cudaError_t launchTile(GdnDecodeParams const& p, cudaStream_t stream)
{
    using Tile = DecodeTile<K, BV>;
    int64_t const blocks = static_cast<int64_t>(p.B) * p.Hv * (p.V / BV);
    if (blocks > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    gdnDecodeKernel<T, K, BV><<<static_cast<unsigned>(blocks), Tile::NT, 0, stream>>>(p);
    return cudaGetLastError();
}

template <typename T, int BV>
cudaError_t launchK(GdnDecodeParams const& p, cudaStream_t stream)
{
    switch (p.K)
    {
    case 64: return launchTile<T, 64, BV>(p, stream);
    case 128: return launchTile<T, 128, BV>(p, stream);
    case 256: return launchTile<T, 256, BV>(p, stream);
    default: return cudaErrorInvalidValue;
    }
}

bool aligned(void const* ptr, uintptr_t n)
{
    return (reinterpret_cast<uintptr_t>(ptr) % n) == 0;
}

} // namespace

char const* gdnDecodeSupports(GdnDecodeParams const& p)
{
    if (p.B < 0 || p.P < 0 || p.Hk <= 0 || p.Hv <= 0)
        return "decode: B, P must be >= 0 and Hk, Hv > 0";
    if (p.Hv % p.Hk != 0)
        return "decode: Hv must be a multiple of Hk (grouped value attention)";
    if (!spec::isKernelHeadDim(p.K) || !spec::isKernelHeadDim(p.V))
        return "decode: the CUDA kernel supports head dims K, V in {64, 128, 256} only";
    if (!detail::isValidDType(p.ioType) || !detail::isValidDType(p.gateType))
        return "decode: ioType and gateType must be float32, float16 or bfloat16";
    if (p.gateMode != 0 && p.gateMode != 1)
        return "decode: gateMode must be 0 or 1";
    if (p.useQkL2norm != 0 && p.useQkL2norm != 1)
        return "decode: useQkL2norm must be 0 or 1";
    if (p.stateMode != 0 && p.stateMode != 1)
        return "decode: stateMode must be 0 or 1";
    if (p.stateMode == 0 && p.P != p.B)
        return "decode: stateMode 0 needs P == B (one state row per sequence)";
    if (!(p.scale >= 0.f) || !(p.l2normEps > 0.f))
        return "decode: scale must be >= 0 and l2normEps > 0";
    if (p.B == 0)
        return "";
    if (!p.q || !p.k || !p.v || !p.g || !p.beta || !p.o || !p.stateIn || !p.stateOut)
        return "decode: q, k, v, g, beta, o, stateIn and stateOut must be non-null";
    if (p.stateMode == 1 && !p.slots)
        return "decode: stateMode 1 needs slots";
    if (p.gateMode == 1 && (!p.ALog || !p.dtBias))
        return "decode: gateMode 1 needs ALog and dtBias";
    uintptr_t const ioAlign = p.ioType == DType::kFloat32 ? 16 : 8;
    if (!aligned(p.v, ioAlign) || !aligned(p.o, ioAlign))
        return "decode: v and o must be 16-byte (float32) / 8-byte (16-bit) aligned";
    if (!aligned(p.stateIn, 16) || !aligned(p.stateOut, 16))
        return "decode: stateIn and stateOut must be 16-byte aligned";
    if (!aligned(p.q, detail::dtypeBytes(p.ioType)) || !aligned(p.k, detail::dtypeBytes(p.ioType)))
        return "decode: q and k must be aligned to their element size";
    return "";
}

// Launch of params gdnDecodeSupports has accepted, with an explicit V-tile (8, 16, 32 or 64 columns); bv <= 0
// picks one. The C API calls it after its own check (one check per launch).
cudaError_t launchGdnDecodeSupported(GdnDecodeParams const& p, cudaStream_t stream, int bv)
{
    if (p.B == 0)
        return cudaSuccess;
    if (bv <= 0)
    {
        // With many CTAs the best tile keeps 8 float4 state rows per thread in flight (K=128: BV=64, 80
        // registers; K=256: BV=32); K=64 and mid-size batches take BV=32 (128-byte row segments); when even
        // BV=32 gives < 2 CTAs per SM (B=1) BV=16 spreads the work over the whole chip (docs/performance.md,
        // Decode V-tile).
        int64_t const heads = static_cast<int64_t>(p.B) * p.Hv;
        int const sms = smCount();
        if (p.K == 128 && heads * (p.V / 64) >= 4LL * sms)
            bv = 64;
        else if (heads * (p.V / 32) >= 2LL * sms)
            bv = 32;
        else
            bv = 16;
    }
    cudaError_t err = cudaErrorInvalidValue;
    switch (bv)
    {
    case 8: GDN_DISPATCH_DTYPE(p.ioType, T, err = (launchK<T, 8>(p, stream))); break;
    case 16: GDN_DISPATCH_DTYPE(p.ioType, T, err = (launchK<T, 16>(p, stream))); break;
    case 32: GDN_DISPATCH_DTYPE(p.ioType, T, err = (launchK<T, 32>(p, stream))); break;
    case 64: GDN_DISPATCH_DTYPE(p.ioType, T, err = (launchK<T, 64>(p, stream))); break;
    default: break;
    }
    return err;
}

cudaError_t launchGdnDecode(GdnDecodeParams const& p, cudaStream_t stream)
{
    if (gdnDecodeSupports(p)[0] != '\0')
        return cudaErrorInvalidValue;
    return launchGdnDecodeSupported(p, stream, 0);
}

} // namespace gdn
