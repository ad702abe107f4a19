// Small-M GEMV (gemvSmallM.h): bandwidth-bound y[M, N] = x[M, K] @ W[N, K]^T (+ residual) for M <= 16.
//
// A block has 8 warps: S warps split one row group's K range (S = splitK: 1, 2, 4, 8) and 8 / S row groups of R rows
// each. A warp streams its rows' K slice with 16-byte loads (U per row in flight per lane, evict-first), reads the
// matching x vectors through the read-only cache (each x vector serves R rows), accumulates M x R sums in fp32,
// reduces them with a shuffle butterfly and leaves them in shared memory; the block then sums the S partials of every
// output in a fixed order and writes y once. No atomics, no second launch: results do not depend on timing.
// Rows past N are clamped to row N - 1 for loading and not stored; K tails end each warp's loop; unaligned pointers,
// strides or K take the same kernel with element-wide loads. fp16 / bf16 with M >= 2 and 16-byte aligned rows run the
// tensor-core form (gemvMmaKernel, below) with the same split and reduction.
#include "gemvSmallM.h"

#include <atomic>
#include <type_traits>
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn
{
namespace
{

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// Element-wise (VEC = false) or 16-byte (VEC = true) loads of T, converted to float pairs by `dot`.
template <typename T, bool VEC>
struct Lanes;

template <typename T>
struct Lanes<T, true>
{
    using V = uint4;
    static constexpr int kElems = 16 / sizeof(T);
    __device__ static V loadW(T const* p) { return __ldcs(reinterpret_cast<uint4 const*>(p)); }
    __device__ static V loadX(T const* p) { return __ldg(reinterpret_cast<uint4 const*>(p)); }
    __device__ static V zero() { return make_uint4(0u, 0u, 0u, 0u); }
};

template <typename T>
struct Lanes<T, false>
{
    using V = T;
    static constexpr int kElems = 1;
    __device__ static V loadW(T const* p) { return *p; }
    __device__ static V loadX(T const* p) { return *p; }
    __device__ static V zero() { return T(0.f); }
};

__device__ __forceinline__ float2 pairOf(uint32_t u, __nv_bfloat16 const*)
{
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

__device__ __forceinline__ float2 pairOf(uint32_t u, __half const*)
{
    __half2 h;
    static_assert(sizeof(h) == sizeof(u), "half2 size");
    memcpy(&h, &u, sizeof(u));
    return __half22float2(h);
}

template <typename T>
__device__ __forceinline__ float dot(uint4 w, uint4 x, float acc)
{
    uint32_t const wv[4] = {w.x, w.y, w.z, w.w};
    uint32_t const xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        if constexpr (sizeof(T) == 4)
        {
            acc = fmaf(__uint_as_float(wv[i]), __uint_as_float(xv[i]), acc);
        }
        else
        {
            float2 const a = pairOf(wv[i], static_cast<T const*>(nullptr));
            float2 const b = pairOf(xv[i], static_cast<T const*>(nullptr));
            acc = fmaf(a.x, b.x, acc);
            acc = fmaf(a.y, b.y, acc);
        }
    }
    return acc;
}

__device__ __forceinline__ float toF(float v) { return v; }
__device__ __forceinline__ float toF(__half v) { return __half2float(v); }
__device__ __forceinline__ float toF(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ float dot(T w, T x, float acc)
{
    return fmaf(toF(w), toF(x), acc);
}

template <typename T>
__device__ __forceinline__ T fromF(float v);
template <>
__device__ __forceinline__ float fromF<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half fromF<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 fromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T, int MT, int R, int U, bool VEC>
__global__ void __launch_bounds__(kThreads) gemvKernel(GemvParams p, int S)
{
    using L = Lanes<T, VEC>;
    using V = typename L::V;
    __shared__ float partial[kWarps][R * MT];

    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const G = kWarps / S;          // row groups per block
    int const rg = warp % G;
    int const s = warp / G;
    int64_t const row0 = (static_cast<int64_t>(blockIdx.x) * G + rg) * R;

    T const* x = static_cast<T const*>(p.x);
    T const* wrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
    {
        int64_t const n = row0 + r < p.N ? row0 + r : p.N - 1;
        wrow[r] = static_cast<T const*>(p.w) + n * p.ldw;
    }
    int const nvec = p.K / L::kElems;
    int const per = (nvec + S - 1) / S;
    int const vb = s * per;
    int const ve = min(nvec, vb + per);

    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m)
            acc[r][m] = 0.f;

    for (int v = vb + lane; v < ve; v += 32 * U)
    {
        V wv[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
        {
            int const idx = v + 32 * u;
#pragma unroll
            for (int r = 0; r < R; ++r)
                wv[u][r] = idx < ve ? L::loadW(wrow[r] + static_cast<int64_t>(idx) * L::kElems) : L::zero();
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
        {
            int const idx = v + 32 * u;
            if (idx < ve)
            {
#pragma unroll
                for (int m = 0; m < MT; ++m)
                {
                    if (m < p.M)
                    {
                        V const xv = L::loadX(x + static_cast<int64_t>(m) * p.ldx + static_cast<int64_t>(idx) * L::kElems);
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            acc[r][m] = dot<T>(wv[u][r], xv, acc[r][m]);
                    }
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m)
        {
            float a = acc[r][m];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                a += __shfl_xor_sync(0xffffffffu, a, off);
            if (lane == 0)
                partial[warp][r * MT + m] = a;
        }
    __syncthreads();

    T* y = static_cast<T*>(p.y);
    T const* res = static_cast<T const*>(p.residual);
    for (int o = threadIdx.x; o < G * R * MT; o += kThreads)
    {
        int const g = o / (R * MT);
        int const rem = o - g * (R * MT);
        int const r = rem / MT;
        int const m = rem - r * MT;
        int64_t const n = (static_cast<int64_t>(blockIdx.x) * G + g) * R + r;
        if (m >= p.M || n >= p.N)
            continue;
        float sum = 0.f;
        for (int k = 0; k < S; ++k)
            sum += partial[k * G + g][rem];
        if (res != nullptr)
            sum += toF(res[static_cast<int64_t>(m) * p.ldr + n]);
        y[static_cast<int64_t>(m) * p.ldy + n] = fromF<T>(sum);
    }
}

int multiprocessors()
{
    static std::atomic<int> cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0)
        return 132;
    if (dev < 64 && cache[dev].load(std::memory_order_relaxed) > 0)
        return cache[dev].load(std::memory_order_relaxed);
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
        sms = 132;
    if (dev < 64)
        cache[dev].store(sms, std::memory_order_relaxed);
    return sms;
}

int elementBytes(DType t)
{
    return t == DType::kFloat32 ? 4 : 2;
}

bool aligned16(void const* ptr)
{
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <typename T, int MT, int R, int U>
cudaError_t launchShape(GemvParams const& p, cudaStream_t stream)
{
    constexpr int kElems = 16 / sizeof(T);
    bool const vec = p.K % kElems == 0 && p.ldx % kElems == 0 && p.ldw % kElems == 0 && aligned16(p.x)
        && aligned16(p.w);
    int const nvec = vec ? p.K / kElems : p.K;
    int S = p.splitK;
    auto blocks = [&](int s) { return (static_cast<int64_t>(p.N) + (kWarps / s) * R - 1) / ((kWarps / s) * R); };
    if (S == 0)
    {
        int const want = 2 * multiprocessors();
        S = 1;
        while (S < kWarps && blocks(S) < want && nvec / (2 * S) >= 32)
            S *= 2;
    }
    int64_t const grid = blocks(S);
    if (grid > 0x7fffffff)
        return cudaErrorInvalidValue;
    if (vec)
        gemvKernel<T, MT, R, U, true><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p, S);
    else
        gemvKernel<T, MT, R, U, false><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p, S);
    return cudaGetLastError();
}


// Tensor-core form for 16-bit types and M >= 2 (the CUDA-core form above spends ~24 M instructions per 16 bytes of W
// and is issue-bound from M ~ 4): a warp owns 16 rows of W and one K slice; per 32 K elements each lane loads one
// 16-byte vector of its two rows (lane / 4 and lane / 4 + 8, at K offset 8 * (lane % 4)) and one of x rows lane / 4
// (+ 8), and feeds them to two mma.m16n8k16 with fp32 accumulators. Any permutation of K that A and B share leaves
// the sum unchanged: fragment K slots (2q, 2q+1, 2q+8, 2q+9) of lane q = lane % 4 hold elements 8q + 0..3 of the
// block (first mma) and 8q + 4..7 (second), so the loads stay 16 bytes wide.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
    uint32_t b0, uint32_t b1)
{
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <typename T, int NT, int U>
__global__ void __launch_bounds__(kThreads) gemvMmaKernel(GemvParams p, int S)
{
    constexpr int kOut = 16 * 8 * NT;  // outputs of one warp: 16 rows x 8 NT x rows
    __shared__ float partial[kWarps][kOut];
    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const g = lane >> 2;
    int const q = lane & 3;
    int const G = kWarps / S;
    int const rg = warp % G;
    int const s = warp / G;
    int64_t const row0 = (static_cast<int64_t>(blockIdx.x) * G + rg) * 16;
    T const* w0 = static_cast<T const*>(p.w) + min(row0 + g, static_cast<int64_t>(p.N) - 1) * p.ldw;
    T const* w1 = static_cast<T const*>(p.w) + min(row0 + g + 8, static_cast<int64_t>(p.N) - 1) * p.ldw;
    T const* xr[NT];
    bool xok[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t)
    {
        xok[t] = g + 8 * t < p.M;
        xr[t] = static_cast<T const*>(p.x) + static_cast<int64_t>(xok[t] ? g + 8 * t : 0) * p.ldx;
    }
    int const nvec = p.K / 8;
    int const nblk = (nvec + 3) / 4;
    int const per = (nblk + S - 1) / S;
    int const bb = s * per;
    int const be = min(nblk, bb + per);

    float c[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
        c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;

    for (int b = bb; b < be; b += U)
    {
        uint4 wa[U], wb[U], xv[U][NT];
#pragma unroll
        for (int u = 0; u < U; ++u)
        {
            int const idx = 4 * (b + u) + q;
            bool const ok = b + u < be && idx < nvec;
            wa[u] = ok ? __ldcs(reinterpret_cast<uint4 const*>(w0 + static_cast<int64_t>(idx) * 8)) : make_uint4(0, 0, 0, 0);
            wb[u] = ok ? __ldcs(reinterpret_cast<uint4 const*>(w1 + static_cast<int64_t>(idx) * 8)) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int t = 0; t < NT; ++t)
                xv[u][t] = ok && xok[t] ? __ldg(reinterpret_cast<uint4 const*>(xr[t] + static_cast<int64_t>(idx) * 8))
                                        : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int t = 0; t < NT; ++t)
            {
                mma16816<T>(c[t], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv[u][t].x, xv[u][t].y);
                mma16816<T>(c[t], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv[u][t].z, xv[u][t].w);
            }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t)
    {
        float* d = partial[warp] + t * 128;
        d[g * 8 + 2 * q] = c[t][0];
        d[g * 8 + 2 * q + 1] = c[t][1];
        d[(g + 8) * 8 + 2 * q] = c[t][2];
        d[(g + 8) * 8 + 2 * q + 1] = c[t][3];
    }
    __syncthreads();

    T* y = static_cast<T*>(p.y);
    T const* res = static_cast<T const*>(p.residual);
    for (int o = threadIdx.x; o < G * kOut; o += kThreads)
    {
        int const gg = o / kOut;
        int const rem = o - gg * kOut;
        int const t = rem / 128;
        int const rr = (rem % 128) / 8;
        int const m = t * 8 + rem % 8;
        int64_t const n = (static_cast<int64_t>(blockIdx.x) * G + gg) * 16 + rr;
        if (m >= p.M || n >= p.N)
            continue;
        float sum = 0.f;
        for (int k = 0; k < S; ++k)
            sum += partial[k * G + gg][rem];
        if (res != nullptr)
            sum += toF(res[static_cast<int64_t>(m) * p.ldr + n]);
        y[static_cast<int64_t>(m) * p.ldy + n] = fromF<T>(sum);
    }
}

template <typename T, int NT>
cudaError_t launchMma(GemvParams const& p, cudaStream_t stream)
{
    int const nblk = (p.K / 8 + 3) / 4;
    auto blocks = [&](int s) { return (static_cast<int64_t>(p.N) + (kWarps / s) * 16 - 1) / ((kWarps / s) * 16); };
    int S = p.splitK;
    if (S == 0)
    {
        int const want = 2 * multiprocessors();
        S = 1;
        while (S < kWarps && blocks(S) < want && nblk / (2 * S) >= 4)
            S *= 2;
    }
    int64_t const grid = blocks(S);
    if (grid > 0x7fffffff)
        return cudaErrorInvalidValue;
    gemvMmaKernel<T, NT, 4><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p, S);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launchTyped(GemvParams const& p, cudaStream_t stream)
{
    if constexpr (sizeof(T) == 2)
    {
        bool const vec = p.K % 8 == 0 && p.ldx % 8 == 0 && p.ldw % 8 == 0 && aligned16(p.x) && aligned16(p.w);

        if (vec && p.M >= 2)
            return p.M <= 8 ? launchMma<T, 1>(p, stream) : launchMma<T, 2>(p, stream);
    }
    if (p.M <= 1)
        return launchShape<T, 1, 2, 4>(p, stream);
    if (p.M <= 2)
        return launchShape<T, 2, 2, 4>(p, stream);
    if (p.M <= 4)
        return launchShape<T, 4, 2, 4>(p, stream);
    if (p.M <= 8)
        return launchShape<T, 8, 4, 2>(p, stream);
    return launchShape<T, 16, 4, 2>(p, stream);
}

} // namespace

char const* gemvSmallMSupports(GemvParams const& p)
{
    if (p.M < 1 || p.M > kGemvMaxM)
        return "gemv: M must be in 1..16";
    if (p.N < 1 || p.K < 0)
        return "gemv: N must be >= 1 and K >= 0";
    if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
        return "gemv: dtype must be float32, float16 or bfloat16";
    if (p.ldx < p.K || p.ldw < p.K || p.ldy < p.N || (p.residual != nullptr && p.ldr < p.N))
        return "gemv: a row stride is shorter than its row";
    if (p.x == nullptr || p.w == nullptr || p.y == nullptr)
        return "gemv: null x, w or y";
    if (p.splitK != 0 && p.splitK != 1 && p.splitK != 2 && p.splitK != 4 && p.splitK != 8)
        return "gemv: splitK must be 0, 1, 2, 4 or 8";
    int const eb = elementBytes(p.dtype);
    if (reinterpret_cast<uintptr_t>(p.x) % eb || reinterpret_cast<uintptr_t>(p.w) % eb
        || reinterpret_cast<uintptr_t>(p.y) % eb || reinterpret_cast<uintptr_t>(p.residual) % eb)
        return "gemv: a pointer is not aligned to its element size";
    return "";
}

cudaError_t launchGemvSmallM(GemvParams const& p, cudaStream_t stream)
{
    if (gemvSmallMSupports(p)[0] != '\0')
        return cudaErrorInvalidValue;
    switch (p.dtype)
    {
    case DType::kFloat32: return launchTyped<float>(p, stream);
    case DType::kFloat16: return launchTyped<__half>(p, stream);
    case DType::kBFloat16: return launchTyped<__nv_bfloat16>(p, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace gdn

extern "C"
{
    int gdnGemvLaunchC(gdn::GemvParams const* p, void* stream)
    {
        if (p == nullptr || gdn::gemvSmallMSupports(*p)[0] != '\0')
            return -1;
        return static_cast<int>(gdn::launchGemvSmallM(*p, static_cast<cudaStream_t>(stream)));
    }

    char const* gdnGemvSupportsC(gdn::GemvParams const* p)
    {
        return p == nullptr ? "gemv: null params" : gdn::gemvSmallMSupports(*p);
    }

    int gdnGemvLayoutC(size_t* out, int cap)
    {
        using P = gdn::GemvParams;
        size_t const layout[] = {sizeof(P), offsetof(P, M), offsetof(P, N), offsetof(P, K), offsetof(P, dtype),
            offsetof(P, ldx), offsetof(P, ldw), offsetof(P, ldy), offsetof(P, ldr), offsetof(P, splitK),
            offsetof(P, x), offsetof(P, w), offsetof(P, residual), offsetof(P, y)};
        int const n = static_cast<int>(sizeof(layout) / sizeof(size_t));
        for (int i = 0; i < n && i < cap && out != nullptr; ++i)
            out[i] = layout[i];
        return n;
    }
}
