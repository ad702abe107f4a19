// Shared glue of the gdn TensorRT plugins: plugin-field parsing, dtype mapping, shape checks and
// error reporting. Every name, default and input position comes from the generated gdnOpSpec.h.
#pragma once

#include "NvInferRuntime.h"
#include "NvInferVersion.h"
#include "gdnKernels.h"
#include "gdnOpSpec.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// IPluginV3OneBuildV2 (getAliasedInput, in-place pool update of GatedDeltaDecode) exists since TensorRT 10.3.
#if NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 3)
#define GDN_TRT_HAS_BUILD_V2 1
#else
#define GDN_TRT_HAS_BUILD_V2 0
#endif

namespace gdn
{
namespace plugin
{
#if GDN_TRT_HAS_BUILD_V2
using PluginBuildBase = nvinfer1::IPluginV3OneBuildV2;
#else
using PluginBuildBase = nvinfer1::IPluginV3OneBuild;
#endif

//! `Interface` (IPluginV3OneCore or IPluginCreatorV3One) answering the name, version and namespace of `Plugin`
//! (Plugin::kName, the spec's version and namespace): what a plugin and its creator both say.
template <typename Interface, typename Plugin>
class GdnPluginNamed : public Interface
{
public:
    char const* getPluginName() const noexcept override
    {
        return Plugin::kName;
    }
    char const* getPluginVersion() const noexcept override
    {
        return spec::kPluginVersion;
    }
    char const* getPluginNamespace() const noexcept override
    {
        return spec::kPluginNamespace;
    }
};

//! Thrown inside plugin methods; always caught before a noexcept boundary and reported.
class GdnPluginError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- logging and error reporting
//! Called by the library entry point setLoggerFinder (TensorRT passes its finder on loadLibrary).
void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;
//! The logger of the engine/context that called the plugin, or nullptr when no finder was set.
nvinfer1::ILogger* getLogger() noexcept;
void logMessage(nvinfer1::ILogger::Severity severity, std::string const& msg) noexcept;
//! Report an error through `recorder` (when given) and the logger (stderr when there is none).
void reportError(nvinfer1::IErrorRecorder* recorder, std::string const& msg) noexcept;
//! Number of errors reported so far in this process (used by the host selftest).
int32_t reportedErrorCount() noexcept;

// ---------------------------------------------------------------- attributes
struct GdnAttrs
{
    int32_t gateMode = spec::kGateModeDefault;
    int32_t useQkL2norm = spec::kUseQkL2normDefault;
    float scale = spec::kScaleDefault;
    float l2normEps = spec::kL2normEpsDefault;
    int32_t stateMode = spec::kStateModeDefault; // GatedDeltaDecode, GatedDeltaVerify, GatedDeltaCommit
};

//! Parse a field collection over the spec defaults (absent fields keep them). Unknown names are ignored with a
//! warning; wrong lengths, non-numeric types and out-of-range values of known fields throw GdnPluginError naming
//! the field. `hasStateMode`: the op has a state_mode field.
GdnAttrs parseFields(nvinfer1::PluginFieldCollection const* fc, bool hasStateMode, char const* opName);
//! Range checks of the attribute values (gate_mode, use_qk_l2norm, state_mode in {0,1}; eps > 0; scale >= 0).
void checkAttrs(GdnAttrs const& attrs, bool hasStateMode, char const* opName);

//! Owns a PluginField array: either the creator's field names (no data) or a plugin's values to serialize.
class FieldList
{
public:
    void setNames(bool hasStateMode);
    void setValues(GdnAttrs const& attrs, bool hasStateMode);
    //! GatedDeltaCommit: the state_mode field only.
    void setStateModeNames();
    void setStateModeValue(int32_t stateMode);
    nvinfer1::PluginFieldCollection const* collection() noexcept
    {
        return &mCollection;
    }

private:
    void build(bool withData, bool hasStateMode, bool stateModeOnly = false);
    GdnAttrs mValues{};
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{};
};

// ---------------------------------------------------------------- dtypes
bool isIoType(nvinfer1::DataType t) noexcept; // float32, float16, bfloat16 (q, k, v, o and g, beta)
bool toKernelType(nvinfer1::DataType t, DType& out) noexcept;
char const* typeName(nvinfer1::DataType t) noexcept;
std::string dimsString(nvinfer1::Dims const& d);

//! A 256-byte aligned, never dereferenced address. gdn*Supports also checks that pointers are set and aligned;
//! configurePlugin/onShapeChange have no buffers yet, so they check shapes/dtypes with this placeholder.
void* placeholderPointer() noexcept;
void fillPlaceholders(GdnPrefillParams& p);
void fillPlaceholders(GdnDecodeParams& p);
void fillPlaceholders(GdnVerifyParams& p);
void fillPlaceholders(GdnCommitParams& p);

// ---------------------------------------------------------------- input positions
//! Positions of the inputs of one op instance (-1 = absent); order as in the spec.
struct InputLayout
{
    int32_t q = 0, k = 1, v = 2, g = 3, beta = 4;
    int32_t state = -1;      // prefill: initial_state; decode: state
    int32_t cuSeqlens = -1;  // prefill, verify
    int32_t slots = -1;      // decode / verify, state_mode 1
    int32_t aLog = -1, dtBias = -1; // gate_mode 1
    int32_t nbInputs = 0;
};
InputLayout prefillLayout(GdnAttrs const& attrs) noexcept;
InputLayout decodeLayout(GdnAttrs const& attrs) noexcept;
InputLayout verifyLayout(GdnAttrs const& attrs) noexcept;
//! Name of input `index` of the op (from the spec header), for messages.
char const* prefillInputName(int32_t index) noexcept;
char const* decodeInputName(int32_t index) noexcept;
char const* verifyInputName(int32_t index) noexcept;
char const* commitInputName(int32_t index) noexcept;

// ---------------------------------------------------------------- shape checks (dims < 0 are unknown: skipped)
void expectRank(char const* name, nvinfer1::Dims const& d, int32_t rank, char const* shape);
void expectDim(char const* name, nvinfer1::Dims const& d, int32_t i, char const* symbol, int64_t want,
    char const* source);

//! Checks the shapes shared by the q/k/v ops: q,k [X,Hk,K], v [X,Hv,V], g,beta [X,Hv], Hv % Hk == 0,
//! and A_log/dt_bias [Hv] when present. `nameOf` gives the spec name of an input position; `aLogSpecIndex` is
//! the spec index of A_log (dt_bias follows it): 7 for prefill and decode, 8 for verify.
void checkCommonShapes(nvinfer1::Dims const* dims, InputLayout const& L, char const* (*nameOf)(int32_t),
    int32_t aLogSpecIndex = 7);

// ---------------------------------------------------------------- descriptor helpers
//! desc[i].desc.dims / desc[i].dims / desc[i].max for i < n.
std::vector<nvinfer1::Dims> descDims(nvinfer1::DynamicPluginTensorDesc const* desc, int32_t n);
std::vector<nvinfer1::Dims> descDims(nvinfer1::PluginTensorDesc const* desc, int32_t n);
std::vector<nvinfer1::Dims> maxDims(nvinfer1::DynamicPluginTensorDesc const* desc, int32_t n);

// ---------------------------------------------------------------- kernel entry points by params type
inline char const* kernelSupports(GdnPrefillParams const& p)
{
    return gdnPrefillSupports(p);
}
inline char const* kernelSupports(GdnDecodeParams const& p)
{
    return gdnDecodeSupports(p);
}
inline char const* kernelSupports(GdnVerifyParams const& p)
{
    return gdnVerifySupports(p);
}
inline char const* kernelSupports(GdnCommitParams const& p)
{
    return gdnCommitSupports(p);
}
//! Throws "unsupported by the kernels: <why>" unless `why` (from gdn*Supports) is null or empty.
void requireSupported(char const* why);
//! Throws "<launcher> failed: <error name> (<error string>)" unless err == cudaSuccess.
void requireLaunched(cudaError_t err, char const* launcher);

} // namespace plugin
} // namespace gdn
