// extern "C" wrappers of gdnKernels.h for ctypes callers (gdn_deploy/kernels), plus a few helpers
// the binding uses: CUDA error names, whether the prefill kernel was built, the byte layout of
// the params structs (so the Python ctypes mirrors can be checked against the compiler's layout), and the
// forced configurations tests and benchmarks launch (decode V-tile; prefill scan by name, gdnPrefillConfig.h).
// Every launch checks its params once (gdn*Supports), then launches without checking again.
// The Python side declares these signatures in one place: gdn_deploy/kernels/library.py.
#include "gdnKernels.h"
#include "gdnPrefillConfig.h"

#include <cstddef>
#include <cuda_runtime.h>

#ifndef GDN_HAVE_PREFILL
#define GDN_HAVE_PREFILL 0
#endif

namespace gdn
{
// gdnDecode.cu: launch of checked params with an explicit V-tile (8/16/32/64; <= 0 picks one).
cudaError_t launchGdnDecodeSupported(GdnDecodeParams const& p, cudaStream_t stream, int bv);
} // namespace gdn

namespace
{
constexpr int kUnsupported = -1;   // params rejected by gdn*Supports
constexpr int kNotBuilt = -2;      // the kernel was not compiled into this library
char const* const kPrefillMissing
    = "prefill: the CUDA prefill kernel is not built into this library (gdnPrefill.cu absent at build time, or GDN_SKIP_PREFILL=ON)";
} // namespace

extern "C"
{
    int gdnDecodeLaunchC(gdn::GdnDecodeParams const* p, void* stream)
    {
        if (p == nullptr || gdn::gdnDecodeSupports(*p)[0] != '\0')
            return kUnsupported;
        return static_cast<int>(gdn::launchGdnDecodeSupported(*p, static_cast<cudaStream_t>(stream), 0));
    }

    char const* gdnDecodeSupportsC(gdn::GdnDecodeParams const* p)
    {
        return p == nullptr ? "decode: null params" : gdn::gdnDecodeSupports(*p);
    }

    int gdnDecodeLaunchTiledC(gdn::GdnDecodeParams const* p, void* stream, int bv)
    {
        if (p == nullptr || gdn::gdnDecodeSupports(*p)[0] != '\0')
            return kUnsupported;
        return static_cast<int>(gdn::launchGdnDecodeSupported(*p, static_cast<cudaStream_t>(stream), bv));
    }

    int gdnVerifyLaunchC(gdn::GdnVerifyParams const* p, void* stream)
    {
        if (p == nullptr || gdn::gdnVerifySupports(*p)[0] != '\0')
            return kUnsupported;
        return static_cast<int>(gdn::launchGdnVerify(*p, static_cast<cudaStream_t>(stream)));
    }

    char const* gdnVerifySupportsC(gdn::GdnVerifyParams const* p)
    {
        return p == nullptr ? "verify: null params" : gdn::gdnVerifySupports(*p);
    }

    int gdnCommitLaunchC(gdn::GdnCommitParams const* p, void* stream)
    {
        if (p == nullptr || gdn::gdnCommitSupports(*p)[0] != '\0')
            return kUnsupported;
        return static_cast<int>(gdn::launchGdnCommit(*p, static_cast<cudaStream_t>(stream)));
    }

    char const* gdnCommitSupportsC(gdn::GdnCommitParams const* p)
    {
        return p == nullptr ? "commit: null params" : gdn::gdnCommitSupports(*p);
    }

    int gdnKernelsHasPrefillC()
    {
        return GDN_HAVE_PREFILL;
    }

    // Name of prefill scan code `scan` (gdn::PrefillScan): "auto", "wgmma", ...; nullptr past the last.
    char const* gdnPrefillScanNameC(int scan)
    {
        return gdn::prefillScanName(scan);
    }

#if GDN_HAVE_PREFILL
    int gdnPrefillLaunchC(gdn::GdnPrefillParams const* p, void* stream)
    {
        if (p == nullptr || gdn::gdnPrefillSupports(*p)[0] != '\0')
            return kUnsupported;
        return static_cast<int>(gdn::launchGdnPrefillSupported(*p, static_cast<cudaStream_t>(stream), {}));
    }

    // launchGdnPrefill with scan code `scan` and tma 0/1 (gdnPrefillConfig.h); a scan that cannot run here
    // returns cudaErrorNotSupported.
    int gdnPrefillLaunchTunedC(gdn::GdnPrefillParams const* p, void* stream, int scan, int tma)
    {
        if (p == nullptr || gdn::gdnPrefillSupports(*p)[0] != '\0')
            return kUnsupported;
        if (gdn::prefillScanName(scan) == nullptr)
            return static_cast<int>(cudaErrorInvalidValue);
        gdn::PrefillConfig const config{static_cast<gdn::PrefillScan>(scan), tma != 0};
        return static_cast<int>(gdn::launchGdnPrefillSupported(*p, static_cast<cudaStream_t>(stream), config));
    }

    // Context-parallel scan code `scan` ("cp", "cp_mma", "cp_wg") with `segments` segments per sequence (0: automatic;
    // at least 2).
    int gdnPrefillLaunchSegmentsC(gdn::GdnPrefillParams const* p, void* stream, int scan, int segments)
    {
        if (p == nullptr || gdn::gdnPrefillSupports(*p)[0] != '\0')
            return kUnsupported;
        if (segments < 0
            || (scan != int(gdn::PrefillScan::kCp) && scan != int(gdn::PrefillScan::kCpMma)
                && scan != int(gdn::PrefillScan::kCpWg)))
            return static_cast<int>(cudaErrorInvalidValue);
        gdn::PrefillConfig const config{static_cast<gdn::PrefillScan>(scan), true, segments};
        return static_cast<int>(gdn::launchGdnPrefillSupported(*p, static_cast<cudaStream_t>(stream), config));
    }

    // Workspace bytes of gdnPrefillLaunchSegmentsC with `segments`.
    size_t gdnPrefillWorkspaceSizeSegmentsC(gdn::GdnPrefillParams const* p, int segments)
    {
        if (p == nullptr || segments < 0)
            return 0;
        return gdn::gdnPrefillWorkspaceSizeConfigured(*p, gdn::PrefillConfig{gdn::PrefillScan::kCp, true, segments});
    }

    // 1 when scan code `scan` runs for head dim K on the current device with this library.
    int gdnPrefillScanRunsC(int scan, int K)
    {
        return gdn::prefillScanName(scan) != nullptr && gdn::prefillScanRuns(static_cast<gdn::PrefillScan>(scan), K);
    }

    size_t gdnPrefillWorkspaceSizeC(gdn::GdnPrefillParams const* p)
    {
        return p == nullptr ? 0 : gdn::gdnPrefillWorkspaceSize(*p);
    }

    char const* gdnPrefillSupportsC(gdn::GdnPrefillParams const* p)
    {
        return p == nullptr ? "prefill: null params" : gdn::gdnPrefillSupports(*p);
    }
#else
    int gdnPrefillLaunchC(gdn::GdnPrefillParams const*, void*)
    {
        return kNotBuilt;
    }

    int gdnPrefillLaunchTunedC(gdn::GdnPrefillParams const*, void*, int, int)
    {
        return kNotBuilt;
    }

    int gdnPrefillScanRunsC(int, int)
    {
        return 0;
    }

    int gdnPrefillLaunchSegmentsC(gdn::GdnPrefillParams const*, void*, int, int)
    {
        return kNotBuilt;
    }

    size_t gdnPrefillWorkspaceSizeSegmentsC(gdn::GdnPrefillParams const*, int)
    {
        return 0;
    }

    size_t gdnPrefillWorkspaceSizeC(gdn::GdnPrefillParams const*)
    {
        return 0;
    }

    char const* gdnPrefillSupportsC(gdn::GdnPrefillParams const*)
    {
        return kPrefillMissing;
    }
#endif

    char const* gdnCudaErrorNameC(int err)
    {
        return cudaGetErrorName(static_cast<cudaError_t>(err));
    }

    char const* gdnCudaErrorStringC(int err)
    {
        return cudaGetErrorString(static_cast<cudaError_t>(err));
    }

    // Byte layout of a params struct: out[0] = sizeof, out[1..] = offsetof of each field in
    // declaration order. which: 0 = GdnPrefillParams, 1 = GdnDecodeParams, 2 = GdnVerifyParams,
    // 3 = GdnCommitParams. Returns the entries
    // written (or needed when cap is too small), -1 for an unknown `which`.
    int gdnParamsLayoutC(int which, size_t* out, int cap)
    {
#define GDN_OFF(S, f) offsetof(S, f)
        using P = gdn::GdnPrefillParams;
        using D = gdn::GdnDecodeParams;
        size_t const prefill[] = {sizeof(P), GDN_OFF(P, T), GDN_OFF(P, N), GDN_OFF(P, Hk), GDN_OFF(P, Hv),
            GDN_OFF(P, K), GDN_OFF(P, V), GDN_OFF(P, ioType), GDN_OFF(P, gateType), GDN_OFF(P, gateMode),
            GDN_OFF(P, useQkL2norm), GDN_OFF(P, scale), GDN_OFF(P, l2normEps), GDN_OFF(P, q), GDN_OFF(P, k),
            GDN_OFF(P, v), GDN_OFF(P, g), GDN_OFF(P, beta), GDN_OFF(P, cuSeqlens), GDN_OFF(P, initialState),
            GDN_OFF(P, ALog), GDN_OFF(P, dtBias), GDN_OFF(P, o), GDN_OFF(P, finalState), GDN_OFF(P, workspace),
            GDN_OFF(P, workspaceBytes)};
        size_t const decode[] = {sizeof(D), GDN_OFF(D, B), GDN_OFF(D, P), GDN_OFF(D, Hk), GDN_OFF(D, Hv),
            GDN_OFF(D, K), GDN_OFF(D, V), GDN_OFF(D, ioType), GDN_OFF(D, gateType), GDN_OFF(D, gateMode),
            GDN_OFF(D, useQkL2norm), GDN_OFF(D, stateMode), GDN_OFF(D, scale), GDN_OFF(D, l2normEps),
            GDN_OFF(D, q), GDN_OFF(D, k), GDN_OFF(D, v), GDN_OFF(D, g), GDN_OFF(D, beta), GDN_OFF(D, stateIn),
            GDN_OFF(D, stateOut), GDN_OFF(D, slots), GDN_OFF(D, ALog), GDN_OFF(D, dtBias), GDN_OFF(D, o)};
        using Vp = gdn::GdnVerifyParams;
        using Cp = gdn::GdnCommitParams;
        size_t const verify[] = {sizeof(Vp), GDN_OFF(Vp, T), GDN_OFF(Vp, N), GDN_OFF(Vp, P), GDN_OFF(Vp, Hk),
            GDN_OFF(Vp, Hv), GDN_OFF(Vp, K), GDN_OFF(Vp, V), GDN_OFF(Vp, ioType), GDN_OFF(Vp, gateType),
            GDN_OFF(Vp, gateMode), GDN_OFF(Vp, useQkL2norm), GDN_OFF(Vp, stateMode), GDN_OFF(Vp, scale),
            GDN_OFF(Vp, l2normEps), GDN_OFF(Vp, q), GDN_OFF(Vp, k), GDN_OFF(Vp, v), GDN_OFF(Vp, g), GDN_OFF(Vp, beta),
            GDN_OFF(Vp, cuSeqlens), GDN_OFF(Vp, state), GDN_OFF(Vp, slots), GDN_OFF(Vp, ALog), GDN_OFF(Vp, dtBias),
            GDN_OFF(Vp, o), GDN_OFF(Vp, commitK), GDN_OFF(Vp, commitDelta), GDN_OFF(Vp, commitG)};
        size_t const commit[] = {sizeof(Cp), GDN_OFF(Cp, T), GDN_OFF(Cp, N), GDN_OFF(Cp, P), GDN_OFF(Cp, Hk),
            GDN_OFF(Cp, Hv), GDN_OFF(Cp, K), GDN_OFF(Cp, V), GDN_OFF(Cp, stateMode), GDN_OFF(Cp, commitK),
            GDN_OFF(Cp, commitDelta), GDN_OFF(Cp, commitG), GDN_OFF(Cp, cuSeqlens), GDN_OFF(Cp, accepted),
            GDN_OFF(Cp, slots), GDN_OFF(Cp, state)};
#undef GDN_OFF
        size_t const* const tables[] = {prefill, decode, verify, commit};
        int const sizes[] = {static_cast<int>(sizeof(prefill) / sizeof(size_t)),
            static_cast<int>(sizeof(decode) / sizeof(size_t)), static_cast<int>(sizeof(verify) / sizeof(size_t)),
            static_cast<int>(sizeof(commit) / sizeof(size_t))};
        size_t const* src = which >= 0 && which < 4 ? tables[which] : nullptr;
        int const n = src == nullptr ? 0 : sizes[which];
        if (src == nullptr)
            return -1;
        for (int i = 0; i < n && i < cap && out != nullptr; ++i)
            out[i] = src[i];
        return n;
    }
}
