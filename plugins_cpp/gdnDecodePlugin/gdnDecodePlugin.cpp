#include "gdnDecodePlugin.h"

#include <exception>
#include <vector>

using namespace nvinfer1;

namespace gdn
{
namespace plugin
{
namespace
{
constexpr bool kHasStateMode = true; // GatedDeltaDecode has a state_mode field
constexpr int32_t kOutO = 0;
constexpr int32_t kOutState = 1;

template <typename Desc>
std::vector<Dims> collectDims(Desc const* desc, int32_t n)
{
    std::vector<Dims> dims(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
    {
        dims[i] = desc[i].desc.dims;
    }
    return dims;
}

std::vector<Dims> collectDims(PluginTensorDesc const* desc, int32_t n)
{
    std::vector<Dims> dims(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
    {
        dims[i] = desc[i].dims;
    }
    return dims;
}
} // namespace

GdnDecodePlugin::GdnDecodePlugin(GdnAttrs const& attrs)
    : mAttrs(attrs)
    , mLayout(decodeLayout(attrs))
{
    checkAttrs(mAttrs, kHasStateMode, spec::kGatedDeltaDecodeName);
    mSerialized.setValues(mAttrs, kHasStateMode);
}

void GdnDecodePlugin::fail(char const* method, std::string const& msg) const noexcept
{
    reportError(mRecorder, std::string(spec::kGatedDeltaDecodeName) + "::" + method + ": " + msg);
}

IPluginCapability* GdnDecodePlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    try
    {
        switch (type)
        {
        case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
        case PluginCapabilityType::kBUILD: return static_cast<PluginBuildBase*>(this);
        case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
        }
    }
    catch (std::exception const& e)
    {
        fail("getCapabilityInterface", e.what());
    }
    return nullptr;
}

IPluginV3* GdnDecodePlugin::clone() noexcept
{
    try
    {
        auto* p = new GdnDecodePlugin(mAttrs);
        p->mRecorder = mRecorder;
        return p;
    }
    catch (std::exception const& e)
    {
        fail("clone", e.what());
    }
    return nullptr;
}

char const* GdnDecodePlugin::getPluginName() const noexcept
{
    return spec::kGatedDeltaDecodeName;
}

char const* GdnDecodePlugin::getPluginVersion() const noexcept
{
    return spec::kPluginVersion;
}

char const* GdnDecodePlugin::getPluginNamespace() const noexcept
{
    return spec::kPluginNamespace;
}

int32_t GdnDecodePlugin::getNbOutputs() const noexcept
{
    return spec::kGatedDeltaDecodeNumOutputs;
}

void GdnDecodePlugin::checkShapes(Dims const* dims, int32_t nbInputs) const
{
    if (nbInputs != mLayout.nbInputs)
    {
        throw GdnPluginError("expected " + std::to_string(mLayout.nbInputs) + " inputs for gate_mode="
            + std::to_string(mAttrs.gateMode) + ", state_mode=" + std::to_string(mAttrs.stateMode) + ", got "
            + std::to_string(nbInputs));
    }
    checkCommonShapes(dims, mLayout, decodeInputName);
    Dims const& st = dims[mLayout.state];
    char const* stName = decodeInputName(mLayout.state);
    expectRank(stName, st, 4, "[S,Hv,K,V]");
    if (mAttrs.stateMode == spec::kStateDense)
    {
        expectDim(stName, st, 0, "S=B", dims[mLayout.q].d[0], "q (state_mode 0: one state row per sequence)");
    }
    else
    {
        char const* slotsName = decodeInputName(6); // spec input 6: slots
        expectRank(slotsName, dims[mLayout.slots], 1, "[B]");
        expectDim(slotsName, dims[mLayout.slots], 0, "B", dims[mLayout.q].d[0], "q");
    }
    expectDim(stName, st, 1, "Hv", dims[mLayout.v].d[1], "v");
    expectDim(stName, st, 2, "K", dims[mLayout.q].d[2], "q");
    expectDim(stName, st, 3, "V", dims[mLayout.v].d[2], "v");
}

GdnDecodeParams GdnDecodePlugin::makeParams(Dims const* dims, DataType ioType, DataType gateType) const
{
    GdnDecodeParams p;
    Dims const& q = dims[mLayout.q];
    Dims const& v = dims[mLayout.v];
    p.B = static_cast<int32_t>(q.d[0]);
    p.P = static_cast<int32_t>(dims[mLayout.state].d[0]);
    p.Hk = static_cast<int32_t>(q.d[1]);
    p.K = static_cast<int32_t>(q.d[2]);
    p.Hv = static_cast<int32_t>(v.d[1]);
    p.V = static_cast<int32_t>(v.d[2]);
    if (!toKernelType(ioType, p.ioType))
    {
        throw GdnPluginError(std::string("q: dtype ") + typeName(ioType)
            + " is not an I/O dtype (expected one of float32, float16, bfloat16)");
    }
    if (!toKernelType(gateType, p.gateType))
    {
        throw GdnPluginError(std::string("g: dtype ") + typeName(gateType) + " is not float32, float16 or bfloat16");
    }
    p.gateMode = mAttrs.gateMode;
    p.useQkL2norm = mAttrs.useQkL2norm;
    p.scale = mAttrs.scale;
    p.l2normEps = mAttrs.l2normEps;
    p.stateMode = mAttrs.stateMode;
    return p;
}

int32_t GdnDecodePlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        if (in == nullptr || (nbOutputs > 0 && out == nullptr) || nbOutputs != getNbOutputs())
        {
            throw GdnPluginError("invalid input/output descriptors");
        }
        std::vector<Dims> const dims = collectDims(in, nbInputs);
        checkShapes(dims.data(), nbInputs);
        std::vector<Dims> maxDims(static_cast<size_t>(nbInputs));
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            maxDims[i] = in[i].max;
        }
        GdnDecodeParams p = makeParams(maxDims.data(), in[mLayout.q].desc.type, in[mLayout.g].desc.type);
        fillPlaceholders(p);
        char const* why = gdnDecodeSupports(p);
        if (why != nullptr && why[0] != '\0')
        {
            throw GdnPluginError(std::string("unsupported by the kernels: ") + why);
        }
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("configurePlugin", e.what());
    }
    return 1;
}

int32_t GdnDecodePlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    try
    {
        if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != getNbOutputs()
            || nbInputs != mLayout.nbInputs)
        {
            throw GdnPluginError("expected " + std::to_string(mLayout.nbInputs) + " inputs and "
                + std::to_string(getNbOutputs()) + " outputs, got " + std::to_string(nbInputs) + " and "
                + std::to_string(nbOutputs));
        }
        outputTypes[kOutO] = inputTypes[mLayout.q];
        outputTypes[kOutState] = DataType::kFLOAT;
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("getOutputDataTypes", e.what());
    }
    return 1;
}

int32_t GdnDecodePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    try
    {
        if (inputs == nullptr || outputs == nullptr || nbInputs != mLayout.nbInputs || nbOutputs != getNbOutputs())
        {
            throw GdnPluginError("expected " + std::to_string(mLayout.nbInputs) + " inputs, got "
                + std::to_string(nbInputs));
        }
        DimsExprs const& v = inputs[mLayout.v];
        DimsExprs const& state = inputs[mLayout.state];
        if (v.nbDims != 3 || state.nbDims != 4)
        {
            throw GdnPluginError("v must be 3-D and state 4-D");
        }
        outputs[kOutO] = v;         // o [B,Hv,V]
        outputs[kOutState] = state; // new_state / updated pool [S,Hv,K,V]
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("getOutputShapes", e.what());
    }
    return 1;
}

bool GdnDecodePlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    try
    {
        if (inOut == nullptr || nbInputs != mLayout.nbInputs || nbOutputs != getNbOutputs() || pos < 0
            || pos >= nbInputs + nbOutputs)
        {
            return false;
        }
        PluginTensorDesc const& d = inOut[pos].desc;
        if (d.format != TensorFormat::kLINEAR)
        {
            return false;
        }
        DataType const t = d.type;
        if (pos >= nbInputs)
        {
            return pos - nbInputs == kOutO ? t == inOut[mLayout.q].desc.type : t == DataType::kFLOAT;
        }
        if (pos == mLayout.q || pos == mLayout.g)
        {
            return isIoType(t);
        }
        if (pos == mLayout.k || pos == mLayout.v)
        {
            return t == inOut[mLayout.q].desc.type;
        }
        if (pos == mLayout.beta)
        {
            return t == inOut[mLayout.g].desc.type;
        }
        if (pos == mLayout.slots)
        {
            return t == DataType::kINT32;
        }
        return t == DataType::kFLOAT; // state, A_log, dt_bias
    }
    catch (std::exception const& e)
    {
        fail("supportsFormatCombination", e.what());
    }
    return false;
}

size_t GdnDecodePlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return 0; // the decode kernel needs no scratch memory
}

#if GDN_TRT_HAS_BUILD_V2
int32_t GdnDecodePlugin::getAliasedInput(int32_t outputIndex) noexcept
{
    // state_mode 1: the pool is updated in place, output 1 is input 'state'.
    return (mAttrs.stateMode == spec::kStatePool && outputIndex == kOutState) ? mLayout.state : -1;
}
#endif

int32_t GdnDecodePlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        if (in == nullptr || (nbOutputs > 0 && out == nullptr) || nbOutputs != getNbOutputs())
        {
            throw GdnPluginError("invalid input/output descriptors");
        }
        std::vector<Dims> const dims = collectDims(in, nbInputs);
        checkShapes(dims.data(), nbInputs);
        GdnDecodeParams p = makeParams(dims.data(), in[mLayout.q].type, in[mLayout.g].type);
        fillPlaceholders(p);
        char const* why = gdnDecodeSupports(p);
        if (why != nullptr && why[0] != '\0')
        {
            throw GdnPluginError(std::string("unsupported by the kernels: ") + why);
        }
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("onShapeChange", e.what());
    }
    return 1;
}

int32_t GdnDecodePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    try
    {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            throw GdnPluginError("null descriptors or pointers");
        }
        std::vector<Dims> const dims = collectDims(inputDesc, mLayout.nbInputs);
        GdnDecodeParams p = makeParams(dims.data(), inputDesc[mLayout.q].type, inputDesc[mLayout.g].type);
        p.q = inputs[mLayout.q];
        p.k = inputs[mLayout.k];
        p.v = inputs[mLayout.v];
        p.g = inputs[mLayout.g];
        p.beta = inputs[mLayout.beta];
        if (mLayout.aLog >= 0)
        {
            p.ALog = static_cast<float const*>(inputs[mLayout.aLog]);
            p.dtBias = static_cast<float const*>(inputs[mLayout.dtBias]);
        }
        p.o = outputs[kOutO];
        auto* stateOut = static_cast<float*>(outputs[kOutState]);
        auto const* stateIn = static_cast<float const*>(inputs[mLayout.state]);
        if (mAttrs.stateMode == spec::kStatePool)
        {
            p.slots = static_cast<int32_t const*>(inputs[mLayout.slots]);
            if (static_cast<void const*>(stateOut) != static_cast<void const*>(stateIn))
            {
                // Not aliased (preview feature off): rows of skipped/unused slots must still reach output 1.
                size_t const bytes = static_cast<size_t>(p.P) * p.Hv * p.K * p.V * sizeof(float);
                cudaError_t const cp = cudaMemcpyAsync(stateOut, stateIn, bytes, cudaMemcpyDeviceToDevice, stream);
                if (cp != cudaSuccess)
                {
                    throw GdnPluginError(std::string("pool copy failed: ") + cudaGetErrorName(cp));
                }
            }
            p.stateIn = stateOut; // update in place
        }
        else
        {
            p.stateIn = stateIn;
        }
        p.stateOut = stateOut;
        char const* why = gdnDecodeSupports(p);
        if (why != nullptr && why[0] != '\0')
        {
            throw GdnPluginError(std::string("unsupported by the kernels: ") + why);
        }
        cudaError_t const err = launchGdnDecode(p, stream);
        if (err != cudaSuccess)
        {
            throw GdnPluginError(std::string("launchGdnDecode failed: ") + cudaGetErrorName(err) + " ("
                + cudaGetErrorString(err) + ")");
        }
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("enqueue", e.what());
    }
    return 1;
}

IPluginV3* GdnDecodePlugin::attachToContext(IPluginResourceContext* context) noexcept
{
    try
    {
        auto* p = new GdnDecodePlugin(mAttrs);
        p->mRecorder = context != nullptr ? context->getErrorRecorder() : nullptr;
        return p;
    }
    catch (std::exception const& e)
    {
        fail("attachToContext", e.what());
    }
    return nullptr;
}

PluginFieldCollection const* GdnDecodePlugin::getFieldsToSerialize() noexcept
{
    try
    {
        mSerialized.setValues(mAttrs, kHasStateMode);
        return mSerialized.collection();
    }
    catch (std::exception const& e)
    {
        fail("getFieldsToSerialize", e.what());
    }
    return nullptr;
}

// ---------------------------------------------------------------- creator
GdnDecodePluginCreator::GdnDecodePluginCreator()
{
    mFieldNames.setNames(kHasStateMode);
}

char const* GdnDecodePluginCreator::getPluginName() const noexcept
{
    return spec::kGatedDeltaDecodeName;
}

char const* GdnDecodePluginCreator::getPluginVersion() const noexcept
{
    return spec::kPluginVersion;
}

char const* GdnDecodePluginCreator::getPluginNamespace() const noexcept
{
    return spec::kPluginNamespace;
}

PluginFieldCollection const* GdnDecodePluginCreator::getFieldNames() noexcept
{
    return mFieldNames.collection();
}

IPluginV3* GdnDecodePluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        GdnAttrs const attrs = parseFields(fc, kHasStateMode, spec::kGatedDeltaDecodeName);
        return new GdnDecodePlugin(attrs);
    }
    catch (std::exception const& e)
    {
        reportError(nullptr,
            std::string(spec::kGatedDeltaDecodeName) + " createPlugin('" + (name ? name : "") + "'): " + e.what());
    }
    return nullptr;
}

} // namespace plugin
} // namespace gdn
