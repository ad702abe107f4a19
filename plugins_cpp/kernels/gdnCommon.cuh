// Device helpers shared by the gdn CUDA kernels (decode, prefill).
// dtype load/store for float32 / float16 / bfloat16, gate math, warp reductions, a
// compile-time dtype dispatch, a host-side error-check macro and a per-device cached attribute query.
// Header-only.
// Keep this interface stable: gdnDecode.cu and gdnPrefill.cu both include it.
#pragma once

#include "gdnKernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <atomic>
#include <cstdint>

namespace gdn
{
namespace detail
{

// ---------------------------------------------------------------------------------------------
// dtype <-> storage type
// ---------------------------------------------------------------------------------------------
template <DType D>
struct StorageOf;
template <>
struct StorageOf<DType::kFloat32>
{
    using type = float;
};
template <>
struct StorageOf<DType::kFloat16>
{
    using type = __half;
};
template <>
struct StorageOf<DType::kBFloat16>
{
    using type = __nv_bfloat16;
};

__host__ __device__ inline bool isValidDType(DType d)
{
    return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}

__host__ __device__ inline int dtypeBytes(DType d)
{
    return d == DType::kFloat32 ? 4 : 2;
}

// Dispatch a runtime DType to a compile-time storage type `T` inside the body:
//   GDN_DISPATCH_DTYPE(p.ioType, T, { launch<T>(...); });
// Evaluates to nothing for an invalid dtype (callers reject those first via *Supports).
#define GDN_DISPATCH_DTYPE(dtype, T, ...)                                                                              \
    switch (dtype)                                                                                                     \
    {                                                                                                                  \
    case ::gdn::DType::kFloat32:                                                                                       \
    {                                                                                                                  \
        using T = float;                                                                                               \
        __VA_ARGS__;                                                                                                   \
        break;                                                                                                         \
    }                                                                                                                  \
    case ::gdn::DType::kFloat16:                                                                                       \
    {                                                                                                                  \
        using T = __half;                                                                                              \
        __VA_ARGS__;                                                                                                   \
        break;                                                                                                         \
    }                                                                                                                  \
    case ::gdn::DType::kBFloat16:                                                                                      \
    {                                                                                                                  \
        using T = __nv_bfloat16;                                                                                       \
        __VA_ARGS__;                                                                                                   \
        break;                                                                                                         \
    }                                                                                                                  \
    default: break;                                                                                                    \
    }

// ---------------------------------------------------------------------------------------------
// scalar conversion
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float toFloat(float x)
{
    return x;
}
__device__ __forceinline__ float toFloat(__half x)
{
    return __half2float(x);
}
__device__ __forceinline__ float toFloat(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float x);
template <>
__device__ __forceinline__ float fromFloat<float>(float x)
{
    return x;
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float x)
{
    return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

template <typename T>
__device__ __forceinline__ float loadF(T const* p, int64_t i)
{
    return toFloat(p[i]);
}

// Runtime-typed scalar load (gates: a few values per CTA, not worth a template axis).
__device__ __forceinline__ float loadAny(void const* p, DType d, int64_t i)
{
    switch (d)
    {
    case DType::kFloat16: return __half2float(static_cast<__half const*>(p)[i]);
    case DType::kBFloat16: return __bfloat162float(static_cast<__nv_bfloat16 const*>(p)[i]);
    default: return static_cast<float const*>(p)[i];
    }
}

// ---------------------------------------------------------------------------------------------
// 4-wide vector load/store: 16 bytes for float32, 8 bytes for 16-bit types.
// `p + i` must be aligned to 4 elements.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void load4(float const* p, int64_t i, float (&out)[4])
{
    float4 const v = *reinterpret_cast<float4 const*>(p + i);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
}
__device__ __forceinline__ void load4(__half const* p, int64_t i, float (&out)[4])
{
    uint2 const raw = *reinterpret_cast<uint2 const*>(p + i);
    __half2 const a = *reinterpret_cast<__half2 const*>(&raw.x);
    __half2 const b = *reinterpret_cast<__half2 const*>(&raw.y);
    float2 const fa = __half22float2(a);
    float2 const fb = __half22float2(b);
    out[0] = fa.x;
    out[1] = fa.y;
    out[2] = fb.x;
    out[3] = fb.y;
}
__device__ __forceinline__ void load4(__nv_bfloat16 const* p, int64_t i, float (&out)[4])
{
    uint2 const raw = *reinterpret_cast<uint2 const*>(p + i);
    __nv_bfloat162 const a = *reinterpret_cast<__nv_bfloat162 const*>(&raw.x);
    __nv_bfloat162 const b = *reinterpret_cast<__nv_bfloat162 const*>(&raw.y);
    float2 const fa = __bfloat1622float2(a);
    float2 const fb = __bfloat1622float2(b);
    out[0] = fa.x;
    out[1] = fa.y;
    out[2] = fb.x;
    out[3] = fb.y;
}

__device__ __forceinline__ void store4(float* p, int64_t i, float const (&x)[4])
{
    *reinterpret_cast<float4*>(p + i) = make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ void store4(__half* p, int64_t i, float const (&x)[4])
{
    __half2 const a = __floats2half2_rn(x[0], x[1]);
    __half2 const b = __floats2half2_rn(x[2], x[3]);
    uint2 raw;
    raw.x = *reinterpret_cast<uint32_t const*>(&a);
    raw.y = *reinterpret_cast<uint32_t const*>(&b);
    *reinterpret_cast<uint2*>(p + i) = raw;
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, int64_t i, float const (&x)[4])
{
    __nv_bfloat162 const a = __floats2bfloat162_rn(x[0], x[1]);
    __nv_bfloat162 const b = __floats2bfloat162_rn(x[2], x[3]);
    uint2 raw;
    raw.x = *reinterpret_cast<uint32_t const*>(&a);
    raw.y = *reinterpret_cast<uint32_t const*>(&b);
    *reinterpret_cast<uint2*>(p + i) = raw;
}

// ---------------------------------------------------------------------------------------------
// gate math (float32), matching gdn_deploy.reference.prepare_inputs
// ---------------------------------------------------------------------------------------------
// torch.nn.functional.softplus with beta=1, threshold=20.
__device__ __forceinline__ float softplusF(float x)
{
    return x > 20.f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float sigmoidF(float x)
{
    return 1.f / (1.f + expf(-x));
}

// gateMode 0: (g, beta) as given. gateMode 1: g = -exp(A_log[h]) * softplus(a + dt_bias[h]), beta = sigmoid(b).
// `gIn`/`bIn` are the raw values read from the g/beta inputs at (token, h).
struct Gate
{
    float g;     // log decay (<= 0)
    float beta;  // in [0, 2] (OLMo-Hybrid doubles sigmoid(b))
};

__device__ __forceinline__ Gate computeGate(
    int gateMode, float gIn, float bIn, float const* ALog, float const* dtBias, int h)
{
    Gate r;
    if (gateMode == 1)
    {
        r.g = -expf(ALog[h]) * softplusF(gIn + dtBias[h]);
        r.beta = sigmoidF(bIn);
    }
    else
    {
        r.g = gIn;
        r.beta = bIn;
    }
    return r;
}

// Effective q scale: `scale` attribute, 0 -> 1/sqrt(K).
__host__ __device__ inline float effectiveScale(float scale, int K)
{
    return scale != 0.f ? scale : rsqrtf(static_cast<float>(K));
}

// ---------------------------------------------------------------------------------------------
// warp reductions (full warp, all 32 lanes active)
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float warpSum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warpMax(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Sum over the lanes that differ only in the bits of [FirstMask, 16]: e.g. FirstMask = 8 sums the
// 4 lanes {l, l^8, l^16, l^24} (lanes sharing l % 8).
template <int FirstMask>
__device__ __forceinline__ float warpSumStrided(float x)
{
#pragma unroll
    for (int o = 16; o >= FirstMask; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__host__ __device__ constexpr int ceilDiv(int a, int b)
{
    return (a + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------
// host: attribute A of the current device, queried once per device (a device query, not a stream
// operation: safe while a graph is being captured; atomics: safe from several host threads); `fallback`
// when the query fails
// ---------------------------------------------------------------------------------------------
template <cudaDeviceAttr A>
int cachedDeviceAttribute(int fallback)
{
    constexpr int kMaxDevices = 64;
    static std::atomic<int> value[kMaxDevices] = {};
    static std::atomic<bool> known[kMaxDevices] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices)
        return fallback;
    if (!known[dev].load(std::memory_order_acquire))
    {
        int v = 0;
        value[dev].store(cudaDeviceGetAttribute(&v, A, dev) == cudaSuccess ? v : fallback, std::memory_order_relaxed);
        known[dev].store(true, std::memory_order_release);  // (two threads may both query: same value)
    }
    return value[dev].load(std::memory_order_relaxed);
}

// Multiprocessor count of the current device (cached per device; capture-safe).
inline int smCount()
{
    int const n = cachedDeviceAttribute<cudaDevAttrMultiProcessorCount>(132);
    return n > 0 ? n : 132;
}

} // namespace detail
} // namespace gdn

// Host-side: return the cudaError_t of a failing CUDA call from the enclosing function.
#define GDN_CUDA_TRY(call)                                                                                             \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const gdnErr_ = (call);                                                                            \
        if (gdnErr_ != cudaSuccess)                                                                                    \
            return gdnErr_;                                                                                            \
    } while (0)
