// GatedDeltaPrefill: launchGdnPrefill, gdnPrefillSupports, gdnPrefillWorkspaceSize (gdnKernels.h), and the
// configured launch of gdnPrefillConfig.h.
//
// 16-bit I/O (bf16, fp16): the chunked WY/UT form on tensor cores (gdnPrefillChunked.cuh): a prep
// kernel over all (chunk, key head) pairs, then a scan kernel per (sequence, head, V-tile): warpgroup
// wgmma (gdnPrefillScanWgmma.cuh) where the library holds sm_90a code and the device is sm_90 and
// K <= 128, else warp-level mma.sync.
// fp32 I/O: an exact fp32 token-by-token kernel (plain FMA; 1e-4 against fp64 rules out bf16/tf32
// tensor cores), one warp lane group per value column with its K-slice of S in registers.
// Nothing here reads cu_seqlens on the host, synchronises or allocates: CUDA-graph capturable. The kernels
// clamp cu_seqlens themselves (seqRange in gdnPrefillChunked.cuh).
#include "gdnCommon.cuh"
#include "gdnKernels.h"
#include "gdnPrefillChunked.cuh"
#include "gdnPrefillCp.cuh"
#include "gdnPrefillCpWgmma.cuh"
#include "gdnPrefillConfig.h"
#include "gdnPrefillPrep.cuh"
#include "gdnPrefillScanWgmma.cuh"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled (through the runtime's driver entry point: no -lcuda)

#include <algorithm>
#include <cstdint>

namespace gdn
{
namespace
{

using namespace detail;
using prefill_chunked::ChunkWs;
using prefill_chunked::kC;
namespace cfg = prefill_config;

// ---------------------------------------------------------------------------------------------
// fp32 I/O: recurrent kernel. 128 threads; LPV = K/64 lanes per value column, each holding 64 rows
// of S (rows interleaved in float4 groups so the LPV lanes read distinct banks).
// ---------------------------------------------------------------------------------------------
constexpr int kRecTT = cfg::kRecTokens;

template <int K>
struct RecTile
{
    static constexpr int LPV = K / 64, VPW = 32 / LPV, VB = 4 * VPW;
};

template <int K>
__global__ void __launch_bounds__(128) gdnPrefillRecurrentKernel(GdnPrefillParams const p)
{
    constexpr int LPV = RecTile<K>::LPV, VPW = RecTile<K>::VPW, VB = RecTile<K>::VB;
    __shared__ __align__(16) float qs[kRecTT][K];
    __shared__ __align__(16) float ks[kRecTT][K];
    __shared__ float vs[kRecTT][VB];
    __shared__ float gs[kRecTT], bs[kRecTT];
    int const n = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int const Hv = p.Hv, V = p.V, hk = h / (Hv / p.Hk);
    int const vloc = warp * VPW + lane / LPV, kp = lane % LPV;
    int const v = blockIdx.z * VB + vloc;
    bool const active = v < V;
    prefill_chunked::SeqRange const seq = prefill_chunked::seqRange(p.cuSeqlens, n, p.T);
    int const bos = seq.begin, L = seq.end - seq.begin;
    float const scale = effectiveScale(p.scale, K);
    float const* q = static_cast<float const*>(p.q);
    float const* k = static_cast<float const*>(p.k);
    float const* vin = static_cast<float const*>(p.v);
    float* o = static_cast<float*>(p.o);

    auto rowOf = [&](int r) { return ((r >> 2) * LPV + kp) * 4 + (r & 3); };
    float S[64];
    int64_t const sbase = ((int64_t)n * Hv + h) * K * V;
#pragma unroll
    for (int r = 0; r < 64; ++r)
        S[r] = (active && p.initialState) ? p.initialState[sbase + (int64_t)rowOf(r) * V + v] : 0.f;

    for (int t0 = 0; t0 < L; t0 += kRecTT)
    {
        int const nt = min(kRecTT, L - t0);
        __syncthreads();
        for (int i = tid; i < nt * K; i += 128)
        {
            int const r = i / K, cc = i % K;
            int64_t const off = ((int64_t)(bos + t0 + r) * p.Hk + hk) * K + cc;
            qs[r][cc] = q[off];
            ks[r][cc] = k[off];
        }
        for (int i = tid; i < nt * VB; i += 128)
        {
            int const r = i / VB, cc = i % VB, vv = blockIdx.z * VB + cc;
            vs[r][cc] = vv < V ? vin[((int64_t)(bos + t0 + r) * Hv + h) * V + vv] : 0.f;
        }
        if (tid < nt)
        {
            int64_t const gi = (int64_t)(bos + t0 + tid) * Hv + h;
            Gate const gt = computeGate(
                p.gateMode, loadAny(p.g, p.gateType, gi), loadAny(p.beta, p.gateType, gi), p.ALog, p.dtBias, h);
            gs[tid] = gt.g;
            bs[tid] = gt.beta;
        }
        __syncthreads();
        for (int r = warp; r < nt; r += 4)
        {
            float sq = 0.f, sk = 0.f;
            for (int cc = lane; cc < K; cc += 32)
            {
                sq += qs[r][cc] * qs[r][cc];
                sk += ks[r][cc] * ks[r][cc];
            }
            sq = warpSum(sq);
            sk = warpSum(sk);
            float const fq = scale * (p.useQkL2norm ? rsqrtf(sq + p.l2normEps) : 1.f);
            float const fk = p.useQkL2norm ? rsqrtf(sk + p.l2normEps) : 1.f;
            __syncwarp();
            for (int cc = lane; cc < K; cc += 32)
            {
                qs[r][cc] *= fq;
                ks[r][cc] *= fk;
            }
        }
        __syncthreads();
        for (int r = 0; r < nt; ++r)
        {
            float const a = expf(gs[r]);
            float kv = 0.f;
#pragma unroll
            for (int f = 0; f < 16; ++f)
            {
                float4 const kk = *reinterpret_cast<float4 const*>(&ks[r][(f * LPV + kp) * 4]);
                S[4 * f] *= a;
                S[4 * f + 1] *= a;
                S[4 * f + 2] *= a;
                S[4 * f + 3] *= a;
                kv = fmaf(S[4 * f], kk.x, kv);
                kv = fmaf(S[4 * f + 1], kk.y, kv);
                kv = fmaf(S[4 * f + 2], kk.z, kv);
                kv = fmaf(S[4 * f + 3], kk.w, kv);
            }
#pragma unroll
            for (int m = 1; m < LPV; m <<= 1)
                kv += __shfl_xor_sync(0xffffffffu, kv, m);
            float const delta = bs[r] * (vs[r][vloc] - kv);
            float ov = 0.f;
#pragma unroll
            for (int f = 0; f < 16; ++f)
            {
                float4 const kk = *reinterpret_cast<float4 const*>(&ks[r][(f * LPV + kp) * 4]);
                float4 const qq = *reinterpret_cast<float4 const*>(&qs[r][(f * LPV + kp) * 4]);
                S[4 * f] = fmaf(kk.x, delta, S[4 * f]);
                S[4 * f + 1] = fmaf(kk.y, delta, S[4 * f + 1]);
                S[4 * f + 2] = fmaf(kk.z, delta, S[4 * f + 2]);
                S[4 * f + 3] = fmaf(kk.w, delta, S[4 * f + 3]);
                ov = fmaf(S[4 * f], qq.x, ov);
                ov = fmaf(S[4 * f + 1], qq.y, ov);
                ov = fmaf(S[4 * f + 2], qq.z, ov);
                ov = fmaf(S[4 * f + 3], qq.w, ov);
            }
#pragma unroll
            for (int m = 1; m < LPV; m <<= 1)
                ov += __shfl_xor_sync(0xffffffffu, ov, m);
            if (active && kp == 0)
                o[((int64_t)(bos + t0 + r) * Hv + h) * V + v] = ov;
        }
    }
    if (active)
    {
#pragma unroll
        for (int r = 0; r < 64; ++r)
            p.finalState[sbase + (int64_t)rowOf(r) * V + v] = S[r];
    }
}

// ---------------------------------------------------------------------------------------------
// host side
// ---------------------------------------------------------------------------------------------
size_t alignUp(size_t x)
{
    return (x + 255) & ~size_t(255);
}

// Workspace slots: one per (chunk id, value head); chunk ids < T/64 + N
size_t wsSlots(GdnPrefillParams const& p)
{
    return size_t(prefill_chunked::chunkIds(p)) * size_t(p.Hv);
}

// The context-parallel scans (gdnPrefillCp.cuh)
bool isCpScan(PrefillScan s)
{
    return s == PrefillScan::kCp || s == PrefillScan::kCpMma || s == PrefillScan::kCpWg;
}

// Segments per sequence of the context-parallel scan on a device of `sms` SMs [Context-parallel prefill]: enough
// that N x G x Hv x V/64 scan CTAs fill the SMs once, segments of at least kCpMinChunks chunks on average, at most
// kCpMaxSegments; 1 (no context parallelism) below kCpMinSegments or where the one-pass scan's CTAs fill more than
// 1/cpCtaShare of the SMs. Shapes only (no read of cu_seqlens).
// Pass 1 of the automatic context-parallel scan runs on wgmma (from shapes only, as the workspace bound needs)
bool cpPass1Wgmma(GdnPrefillParams const& p)
{
    return cfg::kCpPass1Wg && p.K <= 128;
}

int cpCtaShare(GdnPrefillParams const& p)
{
    return cpPass1Wgmma(p) ? cfg::kCpCtaShareWg : cfg::kCpCtaShare;
}

int cpSegments(GdnPrefillParams const& p, int sms)
{
    if (p.ioType == DType::kFloat32 || p.N <= 0)
        return 1;
    int64_t const ctas = int64_t(p.N) * p.Hv * (p.V / 64);
    if (ctas * cpCtaShare(p) > sms)
        return 1;
    int64_t g = std::min<int64_t>(sms / std::max<int64_t>(ctas, 1), int64_t(p.T) / kC / p.N / cfg::kCpMinChunks);
    g = std::min<int64_t>(g, cfg::kCpMaxSegments);
    return g >= std::max(cfg::kCpMinSegments, 2) ? int(g) : 1;
}

// Segment slots (N x G) the workspace holds for the automatic choice on any device of up to kCpSmBound SMs: a bound
// of N x cpSegments non-decreasing in T and N, so that the workspace of a TensorRT profile's largest shapes holds
// the segments of every smaller runtime shape (N x floor(a / N) <= a).
int64_t cpAutoSlots(GdnPrefillParams const& p)
{
    int64_t const headCtas = int64_t(p.Hv) * (p.V / 64);  // scan CTAs per sequence
    if (p.ioType == DType::kFloat32 || p.N <= 0 || headCtas * cpCtaShare(p) > cfg::kCpSmBound)
        return 0;  // (no N gets context parallelism on any device up to kCpSmBound SMs)
    int64_t s = std::min<int64_t>(int64_t(p.N) * cfg::kCpMaxSegments, cfg::kCpSmBound / (int64_t(p.Hv) * (p.V / 64)));
    s = std::min<int64_t>(s, int64_t(p.T) / kC / cfg::kCpMinChunks);
    return s >= std::max(cfg::kCpMinSegments, 2) ? s : 0;
}

// Segments of a kCp launch with `config` on this device (at least 2)
int cpLaunchSegments(GdnPrefillParams const& p, PrefillConfig const& config)
{
    return std::max(2, config.segments > 0 ? int(config.segments) : cpSegments(p, smCount()));
}

struct WsLayout
{
    size_t aqk = 0, tm = 0, gq = 0, ctl = 0, cp = 0, total = 0;
};

// cpSlots: the segment slots (N x G) the context-parallel scan may use (0: none)
WsLayout wsLayout(GdnPrefillParams const& p, int64_t cpSlots)
{
    WsLayout w;
    if (p.ioType == DType::kFloat32)
        return w;  // the fp32 path needs no scratch
    size_t const slots = wsSlots(p);
    size_t const mat = alignUp(slots * kC * kC * 2);
    w.aqk = 0;
    w.tm = mat;
    w.gq = 2 * mat;
    w.ctl = 2 * mat + alignUp(slots * 4 * kC * sizeof(float));  // control block + ready counters
    w.cp = w.ctl + alignUp(size_t(prefill_chunked::ctlInts(p)) * sizeof(int));
    w.total = w.cp + alignUp(prefill_cp::cpWorkspaceBytes(p, cpSlots));
    return w;
}

// The workspace's segment slots: the automatic choice's bound, or a forced count's
int64_t wsSlots(GdnPrefillParams const& p, PrefillConfig const& config)
{
    int64_t const s = cpAutoSlots(p);
    return isCpScan(config.scan) ? std::max<int64_t>(s, int64_t(p.N) * cpLaunchSegments(p, config)) : s;
}

bool isWgmmaScan(PrefillScan s)
{
    return s == PrefillScan::kWgmma || s == PrefillScan::kWgmmaBeside;
}

using EncodeTiledFn = PFN_cuTensorMapEncodeTiled_v12000;

// cuTensorMapEncodeTiled from the driver, looked up once (nullptr: not available -> cp.async loads)
EncodeTiledFn tensorMapEncoder()
{
    static EncodeTiledFn const fn = []() -> EncodeTiledFn
    {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        cudaError_t const e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
        cudaError_t const e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess)
        {
            (void)cudaGetLastError();
            return nullptr;
        }
        return reinterpret_cast<EncodeTiledFn>(f);
    }();
    return fn;
}

// 3-D map of 16-bit elements: dims d (d[0] contiguous), strides s1, s2 in elements, box b, 128-byte
// swizzle (the wgmma tile layout; b[0] = 64 elements = 128 B), rows past the end read as zero.
bool encodeMap16(CUtensorMap* m, void const* base, uint64_t d0, uint64_t d1, uint64_t d2, uint64_t s1, uint64_t s2,
    uint32_t b0, uint32_t b1, uint32_t b2)
{
    EncodeTiledFn const enc = tensorMapEncoder();
    if (enc == nullptr || base == nullptr)
        return false;
    cuuint64_t const dims[3] = {d0, d1, d2};
    cuuint64_t const strides[2] = {s1 * 2, s2 * 2};
    cuuint32_t const box[3] = {b0, b1, b2};
    cuuint32_t const elemStrides[3] = {1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(base), dims, strides, box, elemStrides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        == CUDA_SUCCESS;
}

// The wgmma scan's tensor maps (host-only encoding: no sync, capture-safe); use = 0 where any fails
// (an address or stride the copy engine does not take) or T = 0.
prefill_chunked::ScanTmaMaps scanTmaMaps(GdnPrefillParams const& p, ChunkWs const& ws, int K)
{
    prefill_chunked::ScanTmaMaps m{};
    size_t const slots = wsSlots(p);
    if (p.T <= 0 || slots > 0x7fffffffu)  // (the slot is a 32-bit box coordinate)
        return m;
    uint64_t const T = uint64_t(p.T);
    m.use = encodeMap16(&m.q, p.q, K, p.Hk, T, K, uint64_t(p.Hk) * K, 64, 1, kC)
        && encodeMap16(&m.k, p.k, K, p.Hk, T, K, uint64_t(p.Hk) * K, 64, 1, kC)
        && encodeMap16(&m.v, p.v, p.V, p.Hv, T, p.V, uint64_t(p.Hv) * p.V, 64, 1, kC)
        && encodeMap16(&m.o, p.o, p.V, p.Hv, T, p.V, uint64_t(p.Hv) * p.V, 64, 1, kC)
        && encodeMap16(&m.tm, ws.tm, kC, kC, uint64_t(slots), kC, kC * kC, kC, kC, 1)
        && encodeMap16(&m.aqk, ws.aqk, kC, kC, uint64_t(slots), kC, kC * kC, kC, kC, 1);
    return m;
}

// True when this library holds sm_90a code (GDN_BUILT_SM90A, set by CMake when "90a" is among the
// architectures) and the current device is compute capability 9.0.
bool wgmmaUsable()
{
#if defined(GDN_BUILT_SM90A) && GDN_BUILT_SM90A
    return cachedDeviceAttribute<cudaDevAttrComputeCapabilityMajor>(0) == 9
        && cachedDeviceAttribute<cudaDevAttrComputeCapabilityMinor>(-1) == 0;
#else
    return false;
#endif
}

// Dynamic shared memory per block the kernels of concrete scan `scan` ask for with 16-bit I/O at head dim K (the
// two 16-bit types have the same layouts), with the wgmma passes where launchChunked runs them
template <int K>
size_t scanSmemBytesK(PrefillScan scan)
{
    using T = __nv_bfloat16;
    size_t b = sizeof(prefill_chunked::PrepSmem<T, K>);
    auto need = [&](size_t x) { b = std::max(b, x); };
    bool const wg2 = K <= 128 && scan != PrefillScan::kCpMma && wgmmaUsable();  // context-parallel pass 2 on wgmma
    switch (scan)
    {
    case PrefillScan::kMma2: need(sizeof(prefill_chunked::ScanSmem<T, K, 2>)); break;
    case PrefillScan::kMma4: need(sizeof(prefill_chunked::ScanSmem<T, K, 4>)); break;
    case PrefillScan::kCp:
    case PrefillScan::kCpMma:
    case PrefillScan::kCpWg:
        need(sizeof(prefill_cp::CpFixSmem<K>));
        if constexpr (K <= 128)
        {
            if (wg2)
            {
                need(sizeof(prefill_chunked::WgScanSmem<T, K>) + 1024);
                need(scan == PrefillScan::kCpWg ? sizeof(prefill_cp::CpWgSmem<T, K>) + 1024
                                                : sizeof(prefill_cp::CpSmem<T, K, false>));
                break;
            }
        }
        need(sizeof(prefill_cp::CpSmem<T, K, false>));
        need(sizeof(prefill_cp::CpSmem<T, K, true>));
        break;
    default:  // the wgmma scans (sm_90 only: 227 KB)
        if constexpr (K <= 128)
            need(sizeof(prefill_chunked::WgScanSmem<T, K>) + 1024);
        break;
    }
    return b;
}

// Whether the kernels of concrete scan `scan` fit this device's opt-in shared memory per block at head dim K with
// 16-bit I/O (not every sm_80+ part: A100 163 KB, sm_86 / sm_89 / sm_120 99 KB, Hopper 227 KB); true where the
// device cannot be queried
bool scanFits(PrefillScan scan, int32_t K)
{
    int const optin = cachedDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(0);
    if (optin <= 0)
        return true;
    size_t const need = K == 64 ? scanSmemBytesK<64>(scan) : K == 128 ? scanSmemBytesK<128>(scan) : scanSmemBytesK<256>(scan);
    return need <= size_t(optin);
}

// CTAs of the wgmma scan (V-tile 64)
int64_t wgScanCtas(GdnPrefillParams const& p)
{
    return int64_t(p.N) * p.Hv * (p.V / 64);
}

// scan: a concrete scan (not kAuto) that runs here for this K (prefillScanRuns)
template <typename T, int K>
cudaError_t launchChunked(
    GdnPrefillParams const& p, ChunkWs ws, PrefillScan scan, bool tma, prefill_cp::CpWs const& cw, cudaStream_t stream)
{
    int64_t const items = prefill_chunked::chunkIds(p) * p.Hk;
    if (items > 0x7fffffffLL)
        return cudaErrorInvalidConfiguration;
    bool const beside = scan == PrefillScan::kWgmmaBeside;
    ws.scanCluster = cfg::kScanPairsOnTpcs && beside && (p.V / 64) % 2 == 0 ? 2 : 1;
    if (beside)
    {
        GDN_CUDA_TRY(cudaMemsetAsync(ws.ctl, 0, size_t(prefill_chunked::ctlInts(p)) * sizeof(int), stream));
        // SMs kept for the scan: one per scan CTA, at most 1/kBesideSmShare of them (a forced beside launch of a
        // larger scan runs in waves on those), in whole clusters
        ws.scanCtas = int(std::min<int64_t>(wgScanCtas(p), smCount() / cfg::kBesideSmShare)) / ws.scanCluster
            * ws.scanCluster;
        // the prep keeps within kThrottleChunks of the scan (L2 reuse of q, k and the workspace slots), only
        // when every scan CTA has a kept SM (co-resident; the wait is bounded in any case)
        ws.throttle = wgScanCtas(p) <= ws.scanCtas ? cfg::kThrottleChunks : 0;
    }
    else
        ws.ctl = nullptr;
    {
        auto kern = prefill_chunked::gdnPrefillPrepKernel<T, K>;
        int const smem = sizeof(prefill_chunked::PrepSmem<T, K>);
        GDN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        // beside: all of the unified L1 as shared memory, so that a scan CTA fits on a kept SM
        GDN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
            beside ? int(cudaSharedmemCarveoutMaxShared) : int(cudaSharedmemCarveoutDefault)));
        int64_t grid = items;
        if (beside)  // persistent: as many CTAs as fit at once
        {
            int perSm = 0;
            GDN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kern, 128, smem));
            perSm = std::min(perSm, cfg::kPrepCtasPerSmBeside<K>);
            grid = std::min<int64_t>(items, int64_t(std::max(perSm, 1)) * smCount());
        }
        kern<<<unsigned(grid), 128, smem, stream>>>(p, ws, int(items));  // chunk-major (chunk, key head) items
        GDN_CUDA_TRY(cudaGetLastError());
    }
    if (isCpScan(scan))
    {
        // pass 2 on the wgmma scan where it runs (kCp, kCpWg), else on the mma.sync one; pass 1 on wgmma for kCpWg
        bool const wg = K <= 128 && scan != PrefillScan::kCpMma && wgmmaUsable();
        bool wg1 = false;
        if constexpr (K <= 128)
        {
            if (wg && scan == PrefillScan::kCpWg)
            {
                wg1 = true;
                prefill_chunked::ScanTmaMaps maps{};
                if (tma)
                    maps = scanTmaMaps(p, ws, K);
                GDN_CUDA_TRY((prefill_cp::launchCpPass1Wg<T, K>(p, ws, cw, maps, stream)));
            }
        }
        cudaError_t const e = prefill_cp::launchCp<T, K>(p, ws, cw, !wg1, !wg, stream);
        if (e != cudaSuccess)
            return e;
        if (!wg)
            return cudaSuccess;
        ws.segments = cw.segments;
        ws.segInit = cw.st;
        scan = PrefillScan::kWgmma;
    }
    // one math warp per 16 value columns (the wgmma scan adds a producer warp); beside: launched as the
    // programmatic dependent of the prep kernel (as soon as every prep CTA has started; it waits on the
    // ready counters, not on the grid)
    auto launchScan = [&](auto kern, int smem, int vt, int threads, auto const&... extra) -> cudaError_t
    {
        GDN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        attr[1].id = cudaLaunchAttributeClusterDimension;  // (1, 1, scanCluster): the V-tile pair of a value head
        attr[1].val.clusterDim.x = 1;
        attr[1].val.clusterDim.y = 1;
        attr[1].val.clusterDim.z = unsigned(ws.scanCluster);
        cudaLaunchConfig_t lc = {};
        lc.gridDim = dim3(unsigned(p.N * ws.segments), p.Hv, p.V / vt);
        lc.blockDim = dim3(threads);
        lc.dynamicSmemBytes = size_t(smem);
        lc.stream = stream;
        lc.attrs = attr;
        // (beside: the wgmma scan, V-tile 64; context-parallel pass 2: the dependent of the fix-up)
        lc.numAttrs = beside ? (ws.scanCluster > 1 ? 2 : 1) : (ws.segments > 1 && cfg::kCpProgrammaticLaunch ? 1 : 0);
        cudaError_t e = cudaLaunchKernelEx(&lc, kern, p, ws, extra...);
        if (e != cudaSuccess && lc.numAttrs == 2)
        {
            // clusters refused (e.g. an SM partition without whole TPCs): the same scan without them (the
            // kept TPCs still hold one CTA per SM; the pairing is placement only)
            (void)cudaGetLastError();
            lc.numAttrs = 1;
            e = cudaLaunchKernelEx(&lc, kern, p, ws, extra...);
        }
        return e;
    };
    if constexpr (K <= 128)
    {
        if (isWgmmaScan(scan))  // + 1 KB: alignment slack for the swizzled tiles
        {
            prefill_chunked::ScanTmaMaps maps{};
            if (tma)
                maps = scanTmaMaps(p, ws, K);
            return launchScan(prefill_chunked::gdnPrefillScanWgKernel<T, K>,
                int(sizeof(prefill_chunked::WgScanSmem<T, K>)) + 1024, 64, cfg::kScanThreads, maps);
        }
    }
    if (scan == PrefillScan::kMma2)
        return launchScan(prefill_chunked::gdnPrefillScanKernel<T, K, 2>, int(sizeof(prefill_chunked::ScanSmem<T, K, 2>)), 32, 64);
    return launchScan(prefill_chunked::gdnPrefillScanKernel<T, K, 4>, int(sizeof(prefill_chunked::ScanSmem<T, K, 4>)), 64, 128);
}

template <int K>
cudaError_t launchRecurrent(GdnPrefillParams const& p, cudaStream_t stream)
{
    constexpr int VB = RecTile<K>::VB;
    gdnPrefillRecurrentKernel<K><<<dim3(p.N, p.Hv, (p.V + VB - 1) / VB), 128, 0, stream>>>(p);
    return cudaGetLastError();
}

cudaError_t dispatchK(GdnPrefillParams const& p, ChunkWs const& ws, PrefillScan scan, bool tma,
    prefill_cp::CpWs const& cw, cudaStream_t stream)
{
#define GDN_PREFILL_K(KK)                                                                                              \
    if (p.K == KK)                                                                                                     \
    {                                                                                                                  \
        if (p.ioType == DType::kBFloat16)                                                                              \
            return launchChunked<__nv_bfloat16, KK>(p, ws, scan, tma, cw, stream);                                     \
        if (p.ioType == DType::kFloat16)                                                                               \
            return launchChunked<__half, KK>(p, ws, scan, tma, cw, stream);                                            \
        return launchRecurrent<KK>(p, stream);                                                                         \
    }
    GDN_PREFILL_K(64)
    GDN_PREFILL_K(128)
    GDN_PREFILL_K(256)
#undef GDN_PREFILL_K
    return cudaErrorInvalidValue;
}

// The automatic scan [Scan choice]: mma.sync with 4 warps per CTA where wgmma cannot run (4 beat 2 on every
// case measured); wgmma beside the prep kernel when the scan's CTAs fill at most 1/kBesideSmShare of the SMs
// (one short wave: a few long sequences; the prep keeps the other SMs), after it for batches of many sequences.
PrefillScan pickPrefillScan(GdnPrefillParams const& p)
{
    PrefillScan const cp = cfg::kCpPass1Wg ? PrefillScan::kCpWg : PrefillScan::kCp;
    if (cfg::kCpAuto && cpSegments(p, smCount()) >= 2 && scanFits(cp, p.K))
        return cp;
    if (p.K > 128 || !wgmmaUsable())  // (mma2 where mma4's shared memory does not fit)
        return scanFits(PrefillScan::kMma4, p.K) ? PrefillScan::kMma4 : PrefillScan::kMma2;
    return cfg::kBesideSmShare * wgScanCtas(p) <= smCount() ? PrefillScan::kWgmmaBeside : PrefillScan::kWgmma;
}

} // namespace

bool prefillScanRuns(PrefillScan scan, int32_t K)
{
    if (!spec::isKernelHeadDim(K) || prefillScanName(int32_t(scan)) == nullptr)
        return false;
    if (isWgmmaScan(scan) && !(K <= 128 && wgmmaUsable()))
        return false;
    return scanFits(scan == PrefillScan::kAuto ? PrefillScan::kMma2 : scan, K);  // (auto: at least mma2 runs)
}

char const* gdnPrefillSupports(GdnPrefillParams const& p)
{
    if (!isValidDType(p.ioType))
        return "prefill: ioType must be float32, float16 or bfloat16";
    if (!isValidDType(p.gateType))
        return "prefill: gateType must be float32, float16 or bfloat16";
    if (!spec::isKernelHeadDim(p.K))
        return "prefill: the CUDA kernel supports head dim K in {64, 128, 256} only";
    if (!spec::isKernelHeadDim(p.V))
        return "prefill: the CUDA kernel supports head dim V in {64, 128, 256} only";
    if (p.Hk <= 0 || p.Hv <= 0 || p.Hv % p.Hk != 0)
        return "prefill: heads need Hk > 0 and Hv a multiple of Hk (grouped value attention)";
    if (p.T < 0 || p.N < 0)
        return "prefill: T and N must be >= 0";
    if (p.gateMode != 0 && p.gateMode != 1)
        return "prefill: gateMode must be 0 (precomputed g, beta) or 1 (raw a, b)";
    if (p.gateMode == 1 && (p.ALog == nullptr || p.dtBias == nullptr))
        return "prefill: gateMode 1 needs ALog and dtBias";
    if (p.N > 0 && (p.cuSeqlens == nullptr || p.finalState == nullptr))
        return "prefill: cuSeqlens and finalState are required";
    if (p.ioType != DType::kFloat32 && !scanFits(PrefillScan::kMma2, p.K))
        return "prefill: 16-bit I/O at this head dim needs more shared memory per block than this GPU allows (the "
               "chunked kernels: 90 KB at K = 64, 122 KB at K = 128, 186 KB at K = 256); float32 I/O runs on any GPU";
    if (p.T > 0 && (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.g == nullptr || p.beta == nullptr
                       || p.o == nullptr))
        return "prefill: q, k, v, g, beta and o are required when T > 0";
    return "";
}

size_t gdnPrefillWorkspaceSize(GdnPrefillParams const& p)
{
    return wsLayout(p, wsSlots(p, PrefillConfig{})).total;
}

size_t gdnPrefillWorkspaceSizeConfigured(GdnPrefillParams const& p, PrefillConfig config)
{
    return wsLayout(p, wsSlots(p, config)).total;
}

cudaError_t launchGdnPrefillSupported(GdnPrefillParams const& p, cudaStream_t stream, PrefillConfig config)
{
    if (config.scan != PrefillScan::kAuto && !prefillScanRuns(config.scan, p.K))
        return cudaErrorNotSupported;
    if (p.N == 0)
        return cudaSuccess;
    PrefillScan const scan = config.scan == PrefillScan::kAuto ? pickPrefillScan(p) : config.scan;
    int const segs = isCpScan(scan) ? cpLaunchSegments(p, config) : 1;
    WsLayout const w = wsLayout(p, segs > 1 ? int64_t(p.N) * segs : 0);
    if (w.total > 0 && (p.workspace == nullptr || p.workspaceBytes < w.total))
        return cudaErrorInvalidValue;
    char* base = static_cast<char*>(p.workspace);
    ChunkWs const ws{base + w.aqk, base + w.tm, reinterpret_cast<float*>(base + w.gq),
        reinterpret_cast<int*>(base + w.ctl), 0, 1, 0};
    float* const cpBase = reinterpret_cast<float*>(base + w.cp);
    size_t const hmFloats = size_t(p.N) * p.Hv * p.K * size_t(std::max(segs - 1, 0)) * (p.V + p.K);
    prefill_cp::CpWs const cw{cpBase, cpBase + hmFloats, segs};
    return dispatchK(p, ws, scan, config.tma, cw, stream);
}

cudaError_t launchGdnPrefillConfigured(GdnPrefillParams const& p, cudaStream_t stream, PrefillConfig config)
{
    if (gdnPrefillSupports(p)[0] != '\0')
        return cudaErrorInvalidValue;
    return launchGdnPrefillSupported(p, stream, config);
}

cudaError_t launchGdnPrefill(GdnPrefillParams const& p, cudaStream_t stream)
{
    return launchGdnPrefillConfigured(p, stream, PrefillConfig{});
}

} // namespace gdn
