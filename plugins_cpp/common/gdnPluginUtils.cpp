#include "gdnPluginUtils.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>

using namespace nvinfer1;

namespace gdn
{
namespace plugin
{
namespace
{
std::mutex gLoggerMutex;
ILoggerFinder* gLoggerFinder = nullptr;
std::atomic<int32_t> gErrorCount{0};

enum class FieldKind
{
    kInt,
    kFloat
};

struct FieldInfo
{
    char const* name;
    FieldKind kind;
    bool decodeOnly;
};

// The plugin fields, in the spec's attribute order; names and defaults from gdnOpSpec.h.
constexpr FieldInfo kFields[] = {
    {spec::kGateModeName, FieldKind::kInt, false},
    {spec::kUseQkL2normName, FieldKind::kInt, false},
    {spec::kScaleName, FieldKind::kFloat, false},
    {spec::kL2normEpsName, FieldKind::kFloat, false},
    {spec::kStateModeName, FieldKind::kInt, true},
};

// Read element 0 of a numeric field as double; throws for non-numeric types.
double readNumber(PluginField const& f, char const* opName)
{
    if (f.data == nullptr || f.length != 1)
    {
        throw GdnPluginError(std::string(opName) + ": plugin field '" + f.name + "' must hold exactly one value (got "
            + std::to_string(f.length) + ")");
    }
    switch (f.type)
    {
    case PluginFieldType::kINT32: return static_cast<double>(*static_cast<int32_t const*>(f.data));
    case PluginFieldType::kINT64: return static_cast<double>(*static_cast<int64_t const*>(f.data));
    case PluginFieldType::kINT16: return static_cast<double>(*static_cast<int16_t const*>(f.data));
    case PluginFieldType::kINT8: return static_cast<double>(*static_cast<int8_t const*>(f.data));
    case PluginFieldType::kFLOAT32: return static_cast<double>(*static_cast<float const*>(f.data));
    case PluginFieldType::kFLOAT64: return *static_cast<double const*>(f.data);
    default: break;
    }
    throw GdnPluginError(std::string(opName) + ": plugin field '" + f.name
        + "' has an unsupported type (expected kINT32/kINT64 for int fields, kFLOAT32/kFLOAT64 for float fields)");
}

int32_t toInt(double v, char const* name, char const* opName)
{
    if (!(v == std::floor(v)) || std::fabs(v) > 1e9)
    {
        throw GdnPluginError(std::string(opName) + ": plugin field '" + name + "' must be an integer");
    }
    return static_cast<int32_t>(v);
}

void checkFlag(int32_t v, char const* name, char const* opName)
{
    if (v != 0 && v != 1)
    {
        throw GdnPluginError(std::string(opName) + ": " + name + ": must be 0 or 1, got " + std::to_string(v));
    }
}
} // namespace

// ---------------------------------------------------------------- logging
void setLoggerFinder(ILoggerFinder* finder) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    if (gLoggerFinder == nullptr && finder != nullptr)
    {
        gLoggerFinder = finder;
    }
}

ILogger* getLogger() noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    try
    {
        return gLoggerFinder != nullptr ? gLoggerFinder->findLogger() : nullptr;
    }
    catch (...)
    {
        return nullptr;
    }
}

void logMessage(ILogger::Severity severity, std::string const& msg) noexcept
{
    try
    {
        std::string const line = "[gdn plugin] " + msg;
        if (ILogger* logger = getLogger())
        {
            logger->log(severity, line.c_str());
        }
        else if (severity <= ILogger::Severity::kWARNING)
        {
            std::fprintf(stderr, "%s\n", line.c_str());
        }
    }
    catch (...)
    {
    }
}

void reportError(IErrorRecorder* recorder, std::string const& msg) noexcept
{
    ++gErrorCount;
    try
    {
        if (recorder != nullptr)
        {
            std::string const line = "[gdn plugin] " + msg;
            recorder->reportError(ErrorCode::kINTERNAL_ERROR, line.c_str());
        }
    }
    catch (...)
    {
    }
    logMessage(ILogger::Severity::kERROR, msg);
}

int32_t reportedErrorCount() noexcept
{
    return gErrorCount.load();
}

// ---------------------------------------------------------------- attributes
GdnAttrs parseFields(PluginFieldCollection const* fc, bool hasStateMode, char const* opName)
{
    GdnAttrs a;
    if (fc == nullptr)
    {
        return a;
    }
    if (fc->nbFields < 0 || (fc->nbFields > 0 && fc->fields == nullptr))
    {
        throw GdnPluginError(std::string(opName) + ": invalid PluginFieldCollection");
    }
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        PluginField const& f = fc->fields[i];
        if (f.name == nullptr)
        {
            throw GdnPluginError(std::string(opName) + ": plugin field " + std::to_string(i) + " has no name");
        }
        std::string const name(f.name);
        if (name == spec::kGateModeName)
        {
            a.gateMode = toInt(readNumber(f, opName), f.name, opName);
        }
        else if (name == spec::kUseQkL2normName)
        {
            a.useQkL2norm = toInt(readNumber(f, opName), f.name, opName);
        }
        else if (name == spec::kScaleName)
        {
            a.scale = static_cast<float>(readNumber(f, opName));
        }
        else if (name == spec::kL2normEpsName)
        {
            a.l2normEps = static_cast<float>(readNumber(f, opName));
        }
        else if (name == spec::kStateModeName && hasStateMode)
        {
            a.stateMode = toInt(readNumber(f, opName), f.name, opName);
        }
        else
        {
            std::string known;
            for (auto const& k : kFields)
            {
                if (!k.decodeOnly || hasStateMode)
                {
                    known += (known.empty() ? "" : ", ") + std::string(k.name);
                }
            }
            // Like TensorRT's own plugins: a field this op does not know is ignored (a newer exporter's attribute,
            // or one the ONNX parser forwards), with a warning that names it.
            logMessage(ILogger::Severity::kWARNING,
                std::string(opName) + ": ignoring unknown plugin field '" + name + "' (known: " + known + ")");
        }
    }
    checkAttrs(a, hasStateMode, opName);
    return a;
}

void checkAttrs(GdnAttrs const& a, bool hasStateMode, char const* opName)
{
    checkFlag(a.gateMode, spec::kGateModeName, opName);
    checkFlag(a.useQkL2norm, spec::kUseQkL2normName, opName);
    if (hasStateMode)
    {
        checkFlag(a.stateMode, spec::kStateModeName, opName);
    }
    if (!(std::isfinite(a.scale) && a.scale >= 0.f))
    {
        throw GdnPluginError(std::string(opName) + ": " + spec::kScaleName + ": must be finite and >= 0 (0 means 1/sqrt(K))");
    }
    if (!(std::isfinite(a.l2normEps) && a.l2normEps > 0.f))
    {
        throw GdnPluginError(std::string(opName) + ": " + spec::kL2normEpsName + ": must be finite and > 0");
    }
}

void FieldList::setNames(bool hasStateMode)
{
    build(false, hasStateMode);
}

void FieldList::setValues(GdnAttrs const& attrs, bool hasStateMode)
{
    mValues = attrs;
    build(true, hasStateMode);
}

void FieldList::setStateModeNames()
{
    build(false, true, true);
}

void FieldList::setStateModeValue(int32_t stateMode)
{
    mValues = GdnAttrs{};
    mValues.stateMode = stateMode;
    build(true, true, true);
}

void FieldList::build(bool withData, bool hasStateMode, bool stateModeOnly)
{
    mFields.clear();
    for (auto const& k : kFields)
    {
        if ((k.decodeOnly && !hasStateMode) || (stateModeOnly && !k.decodeOnly))
        {
            continue;
        }
        void const* data = nullptr;
        if (withData)
        {
            std::string const name(k.name);
            if (name == spec::kGateModeName)
                data = &mValues.gateMode;
            else if (name == spec::kUseQkL2normName)
                data = &mValues.useQkL2norm;
            else if (name == spec::kScaleName)
                data = &mValues.scale;
            else if (name == spec::kL2normEpsName)
                data = &mValues.l2normEps;
            else
                data = &mValues.stateMode;
        }
        mFields.emplace_back(k.name, data,
            k.kind == FieldKind::kInt ? PluginFieldType::kINT32 : PluginFieldType::kFLOAT32, 1);
    }
    mCollection.nbFields = static_cast<int32_t>(mFields.size());
    mCollection.fields = mFields.data();
}

// ---------------------------------------------------------------- dtypes
bool isIoType(DataType t) noexcept
{
    return t == DataType::kFLOAT || t == DataType::kHALF || t == DataType::kBF16;
}

bool toKernelType(DataType t, DType& out) noexcept
{
    switch (t)
    {
    case DataType::kFLOAT: out = DType::kFloat32; return true;
    case DataType::kHALF: out = DType::kFloat16; return true;
    case DataType::kBF16: out = DType::kBFloat16; return true;
    default: return false;
    }
}

char const* typeName(DataType t) noexcept
{
    switch (t)
    {
    case DataType::kFLOAT: return "float32";
    case DataType::kHALF: return "float16";
    case DataType::kBF16: return "bfloat16";
    case DataType::kINT32: return "int32";
    case DataType::kINT64: return "int64";
    default: return "other";
    }
}

std::string dimsString(Dims const& d)
{
    std::ostringstream os;
    os << "[";
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        os << (i ? "," : "") << d.d[i];
    }
    os << "]";
    return os.str();
}

void* placeholderPointer() noexcept
{
    alignas(256) static char sPlaceholder[256];
    return sPlaceholder;
}

void fillPlaceholders(GdnPrefillParams& p)
{
    void* const x = placeholderPointer();
    auto* const f = static_cast<float*>(x);
    p.q = p.k = p.v = p.g = p.beta = x;
    p.o = x;
    p.cuSeqlens = static_cast<int32_t const*>(x);
    p.initialState = p.finalState = f;
    p.ALog = p.dtBias = f;
    p.workspace = x;
    p.workspaceBytes = gdnPrefillWorkspaceSize(p);
}

void fillPlaceholders(GdnDecodeParams& p)
{
    void* const x = placeholderPointer();
    auto* const f = static_cast<float*>(x);
    p.q = p.k = p.v = p.g = p.beta = x;
    p.o = x;
    p.stateIn = p.stateOut = f;
    p.slots = static_cast<int32_t const*>(x);
    p.ALog = p.dtBias = f;
}

void fillPlaceholders(GdnVerifyParams& p)
{
    void* const x = placeholderPointer();
    auto* const f = static_cast<float*>(x);
    p.q = p.k = p.v = p.g = p.beta = x;
    p.o = x;
    p.cuSeqlens = p.slots = static_cast<int32_t const*>(x);
    p.state = f;
    p.ALog = p.dtBias = f;
    p.commitK = p.commitDelta = p.commitG = f;
}

void fillPlaceholders(GdnCommitParams& p)
{
    void* const x = placeholderPointer();
    auto* const f = static_cast<float*>(x);
    p.commitK = p.commitDelta = p.commitG = f;
    p.cuSeqlens = p.accepted = p.slots = static_cast<int32_t const*>(x);
    p.state = f;
}

// ---------------------------------------------------------------- descriptors and kernel checks
std::vector<Dims> descDims(DynamicPluginTensorDesc const* desc, int32_t n)
{
    std::vector<Dims> dims(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
    {
        dims[i] = desc[i].desc.dims;
    }
    return dims;
}

std::vector<Dims> descDims(PluginTensorDesc const* desc, int32_t n)
{
    std::vector<Dims> dims(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
    {
        dims[i] = desc[i].dims;
    }
    return dims;
}

std::vector<Dims> maxDims(DynamicPluginTensorDesc const* desc, int32_t n)
{
    std::vector<Dims> dims(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
    {
        dims[i] = desc[i].max;
    }
    return dims;
}

void requireSupported(char const* why)
{
    if (why != nullptr && why[0] != '\0')
    {
        throw GdnPluginError(std::string("unsupported by the kernels: ") + why);
    }
}

void requireLaunched(cudaError_t err, char const* launcher)
{
    if (err != cudaSuccess)
    {
        throw GdnPluginError(std::string(launcher) + " failed: " + cudaGetErrorName(err) + " ("
            + cudaGetErrorString(err) + ")");
    }
}

// ---------------------------------------------------------------- inputs
namespace
{
// The inputs after an op's fixed ones, in the contract's order: the pool's slots (ops with a slot input, pool mode),
// then A_log and dt_bias (raw gates).
InputLayout withOptionalInputs(InputLayout L, GdnAttrs const& a, bool poolSlots) noexcept
{
    if (poolSlots && a.stateMode == spec::kStatePool)
    {
        L.slots = L.nbInputs++;
    }
    if (a.gateMode == spec::kGateRaw)
    {
        L.aLog = L.nbInputs++;
        L.dtBias = L.nbInputs++;
    }
    return L;
}
} // namespace

InputLayout prefillLayout(GdnAttrs const& a) noexcept
{
    InputLayout L;
    L.cuSeqlens = 5;
    L.state = 6;
    L.nbInputs = spec::kGatedDeltaPrefillNumFixedInputs;
    return withOptionalInputs(L, a, /*poolSlots=*/false);
}

InputLayout decodeLayout(GdnAttrs const& a) noexcept
{
    InputLayout L;
    L.state = 5;
    L.nbInputs = spec::kGatedDeltaDecodeNumFixedInputs;
    return withOptionalInputs(L, a, /*poolSlots=*/true);
}

InputLayout verifyLayout(GdnAttrs const& a) noexcept
{
    InputLayout L;
    L.cuSeqlens = 5;
    L.state = 6;
    L.nbInputs = spec::kGatedDeltaVerifyNumFixedInputs;
    return withOptionalInputs(L, a, /*poolSlots=*/true);
}

char const* prefillInputName(int32_t i) noexcept
{
    static char const* const kNames[] = {spec::kGatedDeltaPrefillInput0, spec::kGatedDeltaPrefillInput1,
        spec::kGatedDeltaPrefillInput2, spec::kGatedDeltaPrefillInput3, spec::kGatedDeltaPrefillInput4,
        spec::kGatedDeltaPrefillInput5, spec::kGatedDeltaPrefillInput6, spec::kGatedDeltaPrefillInput7,
        spec::kGatedDeltaPrefillInput8};
    return (i >= 0 && i < 9) ? kNames[i] : "?";
}

char const* decodeInputName(int32_t i) noexcept
{
    // Positions 6.. depend on the attributes; callers pass the spec index of the named input.
    static char const* const kNames[] = {spec::kGatedDeltaDecodeInput0, spec::kGatedDeltaDecodeInput1,
        spec::kGatedDeltaDecodeInput2, spec::kGatedDeltaDecodeInput3, spec::kGatedDeltaDecodeInput4,
        spec::kGatedDeltaDecodeInput5, spec::kGatedDeltaDecodeInput6, spec::kGatedDeltaDecodeInput7,
        spec::kGatedDeltaDecodeInput8};
    return (i >= 0 && i < 9) ? kNames[i] : "?";
}

char const* verifyInputName(int32_t i) noexcept
{
    // Positions 7.. depend on the attributes; callers pass the spec index of the named input.
    static char const* const kNames[] = {spec::kGatedDeltaVerifyInput0, spec::kGatedDeltaVerifyInput1,
        spec::kGatedDeltaVerifyInput2, spec::kGatedDeltaVerifyInput3, spec::kGatedDeltaVerifyInput4,
        spec::kGatedDeltaVerifyInput5, spec::kGatedDeltaVerifyInput6, spec::kGatedDeltaVerifyInput7,
        spec::kGatedDeltaVerifyInput8, spec::kGatedDeltaVerifyInput9};
    return (i >= 0 && i < 10) ? kNames[i] : "?";
}

char const* commitInputName(int32_t i) noexcept
{
    static char const* const kNames[] = {spec::kGatedDeltaCommitInput0, spec::kGatedDeltaCommitInput1,
        spec::kGatedDeltaCommitInput2, spec::kGatedDeltaCommitInput3, spec::kGatedDeltaCommitInput4,
        spec::kGatedDeltaCommitInput5, spec::kGatedDeltaCommitInput6};
    return (i >= 0 && i < 7) ? kNames[i] : "?";
}

// ---------------------------------------------------------------- shapes
void expectRank(char const* name, Dims const& d, int32_t rank, char const* shape)
{
    if (d.nbDims != rank)
    {
        throw GdnPluginError(std::string(name) + ": expected a " + std::to_string(rank) + "-D tensor of shape "
            + shape + ", got shape " + dimsString(d));
    }
}

void expectDim(char const* name, Dims const& d, int32_t i, char const* symbol, int64_t want, char const* source)
{
    if (i >= d.nbDims || want < 0 || d.d[i] < 0)
    {
        return; // unknown at this point (build time wildcard)
    }
    if (d.d[i] != want)
    {
        throw GdnPluginError(std::string(name) + ": dimension " + std::to_string(i) + " (" + symbol + ") is "
            + std::to_string(d.d[i]) + ", expected " + std::to_string(want) + " (from " + source + ")");
    }
}

void checkCommonShapes(Dims const* dims, InputLayout const& L, char const* (*nameOf)(int32_t), int32_t aLogSpecIndex)
{
    Dims const& q = dims[L.q];
    Dims const& k = dims[L.k];
    Dims const& v = dims[L.v];
    expectRank(nameOf(L.q), q, 3, "[X,Hk,K]");
    expectRank(nameOf(L.k), k, 3, "[X,Hk,K]");
    expectRank(nameOf(L.v), v, 3, "[X,Hv,V]");
    for (int32_t i = 0; i < 3; ++i)
    {
        expectDim(nameOf(L.k), k, i, i == 0 ? "X" : (i == 1 ? "Hk" : "K"), q.d[i], "q");
    }
    expectDim(nameOf(L.v), v, 0, "X", q.d[0], "q");
    int64_t const Hk = q.d[1];
    int64_t const Hv = v.d[1];
    if (Hk > 0 && Hv >= 0 && Hv % Hk != 0)
    {
        throw GdnPluginError("heads: Hv=" + std::to_string(Hv) + " is not a multiple of Hk=" + std::to_string(Hk)
            + " (q/k heads); grouped value attention needs Hv % Hk == 0");
    }
    for (int32_t idx : {L.g, L.beta})
    {
        expectRank(nameOf(idx), dims[idx], 2, "[X,Hv]");
        expectDim(nameOf(idx), dims[idx], 0, "X", q.d[0], "q");
        expectDim(nameOf(idx), dims[idx], 1, "Hv", Hv, "v");
    }
    // A_log / dt_bias are always the last two spec inputs (spec indices aLogSpecIndex and aLogSpecIndex + 1).
    if (L.aLog >= 0)
    {
        char const* aLog = nameOf(aLogSpecIndex);
        char const* dtBias = nameOf(aLogSpecIndex + 1);
        expectRank(aLog, dims[L.aLog], 1, "[Hv]");
        expectDim(aLog, dims[L.aLog], 0, "Hv", Hv, "v");
        expectRank(dtBias, dims[L.dtBias], 1, "[Hv]");
        expectDim(dtBias, dims[L.dtBias], 0, "Hv", Hv, "v");
    }
}

} // namespace plugin
} // namespace gdn
