// The prefill's named configuration: the scan variants, the TMA flag, and every tuning constant of the
// chunked prefill kernels, each with a one-line reason; the measurements behind them are in
// docs/performance.md (section names in brackets). Chunk size and head dims come from the op contract
// (gdnOpSpec.h, generated from gdn_deploy/spec/gdn_ops.json).
#pragma once

#include "gdnKernels.h"
#include "gdnOpSpec.h"

#include <cstdint>

namespace gdn
{

// Scan kernel of the chunked prefill (16-bit I/O). The C API names them (gdnPrefillScanNameC), and tests and
// benchmarks pass those names; the codes are only the ABI.
enum class PrefillScan : int32_t
{
    kAuto = 0,         // pickPrefillScan (gdnPrefill.cu): what launchGdnPrefill runs
    kWgmma = 1,        // warpgroup wgmma scan (sm_90a build on an sm_90 device, K <= 128), after the prep kernel
    kWgmmaBeside = 2,  // the same scan beside a persistent prep kernel (programmatic dependent launch)
    kMma2 = 3,         // warp-level mma.sync scan, 2 warps per CTA (V-tile 32)
    kMma4 = 4,         // warp-level mma.sync scan, 4 warps per CTA (V-tile 64)
    kCp = 5,           // context parallel: sequences cut into segments scanned at once (gdnPrefillCp.cuh); its
                       // output pass on the wgmma scan where that runs, else on mma.sync
    kCpMma = 6,        // the same with the output pass on mma.sync everywhere
    kCpWg = 7,         // kCp with pass 1 (segment end states and transitions) on wgmma too where that runs
};
constexpr int32_t kPrefillScanCount = 8;

struct PrefillConfig
{
    PrefillScan scan = PrefillScan::kAuto;
    // wgmma scans: tiles loaded and o stored by bulk tensor copies (TMA) where the tensor maps encode; false forces
    // the cp.async loads and 16-byte o stores that the last, partial chunk of a sequence always uses.
    bool tma = true;
    // kCp, kCpMma, kCpWg: segments per sequence (0: the automatic count; at least 2)
    int32_t segments = 0;
};

// The scan's name ("auto", "wgmma", "wgmma_beside", "mma2", "mma4", "cp", "cp_mma", "cp_wg"); nullptr for a code out of range.
inline char const* prefillScanName(int32_t code)
{
    constexpr char const* kNames[kPrefillScanCount] = {"auto", "wgmma", "wgmma_beside", "mma2", "mma4", "cp", "cp_mma",
        "cp_wg"};
    return code >= 0 && code < kPrefillScanCount ? kNames[code] : nullptr;
}
// Whether `scan` can run for head dim K on the current device with this build (kAuto: always).
bool prefillScanRuns(PrefillScan scan, int32_t K);
// launchGdnPrefill with a forced configuration (tests, benchmarks). A scan that cannot run here returns
// cudaErrorNotSupported.
cudaError_t launchGdnPrefillConfigured(GdnPrefillParams const& p, cudaStream_t stream, PrefillConfig cfg);
// The same for params gdnPrefillSupports has just accepted (the C API checks them once per launch).
cudaError_t launchGdnPrefillSupported(GdnPrefillParams const& p, cudaStream_t stream, PrefillConfig cfg);
// Workspace bytes of a launch with `cfg` (gdnPrefillWorkspaceSize: the automatic configuration).
size_t gdnPrefillWorkspaceSizeConfigured(GdnPrefillParams const& p, PrefillConfig cfg);

namespace prefill_config
{

// ---- the op contract
constexpr int kChunk = spec::kChunkSize;
static_assert(kChunk == 64, "the chunked kernels are written for 64-token chunks (tiles, fragment layouts)");

// ---- choice of scan [Scan choice]
// The wgmma scan runs beside the prep when its CTAs fill at most 1/kBesideSmShare of the SMs (a few long
// sequences: the prep keeps the other SMs); batches of many sequences have CTAs enough to run after the prep.
constexpr int kBesideSmShare = 2;

// ---- context-parallel prefill [Context-parallel prefill]
// Segments per sequence: as many as make N x G x Hv x V/64 scan CTAs fill the SMs once, each segment at least
// kCpMinChunks chunks long (on average over the batch), at most kCpMaxSegments; the automatic scan is kCp where
// this gives G >= kCpMinSegments and kCpAuto
constexpr int kCpMaxSegments = 16;
constexpr int kCpMinSegments = 4;
// ... and only where the one-pass scan's CTAs fill at most 1/kCpCtaShare of the SMs. With pass 1 on wgmma (K <= 128)
// 1/4: Hk=4 Hv=16 (32 CTAs) at 4 segments took 0.820 against 1.038 ms at 1x64K and 0.130 against 0.148 at 1x8K on an
// H200, while Qwen3-Next's 64 CTAs lost at every G (1x64K 1.658 at G = 2 against 1.119). With pass 1 on mma.sync
// (K = 256) 1/8: Hk=4 Hv=16 at 4 segments was slower there (1x64K 1.183 against 1.029 ms on an H100).
constexpr int kCpCtaShareWg = 4;
constexpr int kCpCtaShare = 8;
// Segments of at least kCpMinChunks chunks: with the fix-up's steps on tensor cores (~2.4 us at K = 128, ~8 us at
// K = 256 on an H200), 1x8K at G = 8 beat G = 4: Hk=2 Hv=8 0.089 against 0.095 ms, K = V = 64 Hk=4 Hv=8 0.053
// against 0.070, K = V = 256 Hk=2 Hv=4 0.210 against 0.248 (span); Hk=2 Hv=8 1x4K at G = 4-8 about 0.075 against
// 0.10 without.
constexpr int kCpMinChunks = 16;
constexpr bool kCpAuto = true;
// The automatic context-parallel scan runs pass 1 on wgmma (kCpWg) where that runs [Pass 1 on wgmma].
constexpr bool kCpPass1Wg = true;
// The workspace holds the segments of a device of up to kCpSmBound SMs (the segment count grows with the SMs).
constexpr int kCpSmBound = 256;
// Whether the kernels after the prep (pass 1 on wgmma, the fix-up, pass 2 on wgmma) launch as programmatic
// dependents of the kernel before them: no, 1x64K took 0.499-0.505 ms with them against 0.489-0.490 in stream order,
// and 1x8K gained only the host's launch gaps [Where the time goes; the fix-up as a pipeline].
constexpr bool kCpProgrammaticLaunch = false;

// ---- fp32 I/O: token-by-token kernel [fp32 prefill]
constexpr int kRecTokens = 16;  // tokens staged in shared memory per step (one barrier pair per 16 tokens)

// ---- prep kernel [Prep kernel]
// Prep CTAs per SM: 4 at <= 128 registers for K <= 128 (3 at K = 256, whose Gram tiles need more registers).
template <int K>
constexpr int kPrepCtasPerSm = K <= 128 ? 4 : 3;
// Beside the scan, the persistent prep grid runs at most 3 CTAs per SM: the scan runs faster beside fewer prep
// CTAs while 3 still keep up with it [Prep occupancy beside the scan].
template <int K>
constexpr int kPrepCtasPerSmBeside = kPrepCtasPerSm<K> < 3 ? kPrepCtasPerSm<K> : 3;
// Beside the scan, prep CTA slot s on an SM takes its first item s x kStaggerNs late, so that the first chunks'
// items share their SMs with fewer others [Staggered prep start].
constexpr unsigned long long kStaggerNs = 2000;

// ---- the scan beside the prep [Scan beside the prep]
// Chunks per ready counter: the scan's producer waits once per block of 4 chunks [Ready blocks].
constexpr int kReadyBlock = 4;
// A prep item stays within 20 chunks of the slowest scan CTA of its key head, so the scan reads q, k and the
// workspace slot from L2 [Throttle window].
constexpr int kThrottleChunks = 20;
// The throttle wait is bounded: a prep item waits at most 50 us (no dependency of the prep on the scan).
constexpr unsigned long long kThrottleNs = 50000;
// The two V-tile CTAs of a value head run as a cluster of 2, which lands on one TPC [V-tile pairs on one TPC].
constexpr bool kScanPairsOnTpcs = true;
// The control block's per-SM role slots (%smid beyond them: a worker SM).
constexpr int kCtlSmIds = 1024;

// ---- wgmma scan [wgmma scan]
constexpr int kWgStages = 3;  // shared-memory stages: chunk c + 2 streams in while chunk c runs [Bulk tensor copies]
// Beside the prep the producer prefetches v of chunk c + 4 into L2 when it loads chunk c [v prefetch into L2].
constexpr int kL2Ahead = 4;
// The math warpgroup, then a producer warp, a store warp and two warps that complete the second warpgroup.
constexpr int kScanThreads = 256;
// Launched at 168 registers per thread; the math warpgroup takes 240 and the other 96 [Register reconfiguration].
constexpr int kScanLaunchRegs = 168, kScanMathRegs = 240, kScanAuxRegs = 96;
static_assert(4 * kScanMathRegs + 4 * kScanAuxRegs <= 8 * kScanLaunchRegs, "setmaxnreg: the CTA's register pool");

} // namespace prefill_config
} // namespace gdn
