#include "gdnPrefillPlugin.h"

#include <exception>
#include <vector>

using namespace nvinfer1;

namespace gdn
{
namespace plugin
{
namespace
{
constexpr bool kHasStateMode = false; // GatedDeltaPrefill has no state_mode field
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

GdnPrefillPlugin::GdnPrefillPlugin(GdnAttrs const& attrs)
    : mAttrs(attrs)
    , mLayout(prefillLayout(attrs))
{
    checkAttrs(mAttrs, kHasStateMode, spec::kGatedDeltaPrefillName);
    mSerialized.setValues(mAttrs, kHasStateMode);
}

void GdnPrefillPlugin::fail(char const* method, std::string const& msg) const noexcept
{
    reportError(mRecorder, std::string(spec::kGatedDeltaPrefillName) + "::" + method + ": " + msg);
}

IPluginCapability* GdnPrefillPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
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

IPluginV3* GdnPrefillPlugin::clone() noexcept
{
    try
    {
        auto* p = new GdnPrefillPlugin(mAttrs);
        p->mRecorder = mRecorder;
        return p;
    }
    catch (std::exception const& e)
    {
        fail("clone", e.what());
    }
    return nullptr;
}

char const* GdnPrefillPlugin::getPluginName() const noexcept
{
    return spec::kGatedDeltaPrefillName;
}

char const* GdnPrefillPlugin::getPluginVersion() const noexcept
{
    return spec::kPluginVersion;
}

char const* GdnPrefillPlugin::getPluginNamespace() const noexcept
{
    return spec::kPluginNamespace;
}

int32_t GdnPrefillPlugin::getNbOutputs() const noexcept
{
    return spec::kGatedDeltaPrefillNumOutputs;
}

void GdnPrefillPlugin::checkShapes(Dims const* dims, int32_t nbInputs) const
{
    if (nbInputs != mLayout.nbInputs)
    {
        throw GdnPluginError("expected " + std::to_string(mLayout.nbInputs) + " inputs for gate_mode="
            + std::to_string(mAttrs.gateMode) + ", got " + std::to_string(nbInputs));
    }
    checkCommonShapes(dims, mLayout, prefillInputName);
    Dims const& cu = dims[mLayout.cuSeqlens];
    Dims const& st = dims[mLayout.state];
    expectRank(prefillInputName(mLayout.cuSeqlens), cu, 1, "[N+1]");
    expectRank(prefillInputName(mLayout.state), st, 4, "[N,Hv,K,V]");
    if (cu.d[0] == 0)
    {
        throw GdnPluginError("cu_seqlens: has no entries; expected int32 [N+1] offsets starting at 0");
    }
    char const* stName = prefillInputName(mLayout.state);
    expectDim(stName, st, 0, "N", cu.d[0] < 0 ? -1 : cu.d[0] - 1, "cu_seqlens");
    expectDim(stName, st, 1, "Hv", dims[mLayout.v].d[1], "v");
    expectDim(stName, st, 2, "K", dims[mLayout.q].d[2], "q");
    expectDim(stName, st, 3, "V", dims[mLayout.v].d[2], "v");
}

GdnPrefillParams GdnPrefillPlugin::makeParams(Dims const* dims, DataType ioType, DataType gateType) const
{
    GdnPrefillParams p;
    Dims const& q = dims[mLayout.q];
    Dims const& v = dims[mLayout.v];
    p.T = static_cast<int32_t>(q.d[0]);
    p.N = static_cast<int32_t>(dims[mLayout.cuSeqlens].d[0] - 1);
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
    return p;
}

int32_t GdnPrefillPlugin::configurePlugin(
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
        GdnPrefillParams p = makeParams(maxDims.data(), in[mLayout.q].desc.type, in[mLayout.g].desc.type);
        fillPlaceholders(p);
        char const* why = gdnPrefillSupports(p);
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

int32_t GdnPrefillPlugin::getOutputDataTypes(
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

int32_t GdnPrefillPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    try
    {
        if (inputs == nullptr || outputs == nullptr || nbInputs != mLayout.nbInputs || nbOutputs != getNbOutputs())
        {
            throw GdnPluginError("expected " + std::to_string(mLayout.nbInputs) + " inputs, got "
                + std::to_string(nbInputs));
        }
        DimsExprs const& q = inputs[mLayout.q];
        DimsExprs const& v = inputs[mLayout.v];
        DimsExprs const& cu = inputs[mLayout.cuSeqlens];
        if (q.nbDims != 3 || v.nbDims != 3 || cu.nbDims != 1)
        {
            throw GdnPluginError("q and v must be 3-D and cu_seqlens 1-D");
        }
        outputs[kOutO] = v; // o [T,Hv,V]
        IDimensionExpr const* n = exprBuilder.operation(DimensionOperation::kSUB, *cu.d[0], *exprBuilder.constant(1));
        if (n == nullptr)
        {
            throw GdnPluginError("could not build N = cu_seqlens.shape[0] - 1");
        }
        DimsExprs& st = outputs[kOutState]; // final_state [N,Hv,K,V]
        st.nbDims = 4;
        st.d[0] = n;
        st.d[1] = v.d[1];
        st.d[2] = q.d[2];
        st.d[3] = v.d[2];
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("getOutputShapes", e.what());
    }
    return 1;
}

bool GdnPrefillPlugin::supportsFormatCombination(
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
        if (pos == mLayout.cuSeqlens)
        {
            return t == DataType::kINT32;
        }
        return t == DataType::kFLOAT; // initial_state, A_log, dt_bias
    }
    catch (std::exception const& e)
    {
        fail("supportsFormatCombination", e.what());
    }
    return false;
}

size_t GdnPrefillPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    try
    {
        if (inputs == nullptr || nbInputs != mLayout.nbInputs)
        {
            throw GdnPluginError("unexpected number of inputs");
        }
        std::vector<Dims> maxDims(static_cast<size_t>(nbInputs));
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            maxDims[i] = inputs[i].max;
        }
        GdnPrefillParams const p
            = makeParams(maxDims.data(), inputs[mLayout.q].desc.type, inputs[mLayout.g].desc.type);
        return gdnPrefillWorkspaceSize(p);
    }
    catch (std::exception const& e)
    {
        fail("getWorkspaceSize", e.what());
    }
    return 0;
}

#if GDN_TRT_HAS_BUILD_V2
int32_t GdnPrefillPlugin::getAliasedInput(int32_t /*outputIndex*/) noexcept
{
    return -1; // final_state is written to its own buffer (the kernels allow it to alias initial_state)
}
#endif

int32_t GdnPrefillPlugin::onShapeChange(
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
        GdnPrefillParams p = makeParams(dims.data(), in[mLayout.q].type, in[mLayout.g].type);
        fillPlaceholders(p);
        char const* why = gdnPrefillSupports(p);
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

int32_t GdnPrefillPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    try
    {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            throw GdnPluginError("null descriptors or pointers");
        }
        std::vector<Dims> const dims = collectDims(inputDesc, mLayout.nbInputs);
        GdnPrefillParams p = makeParams(dims.data(), inputDesc[mLayout.q].type, inputDesc[mLayout.g].type);
        p.q = inputs[mLayout.q];
        p.k = inputs[mLayout.k];
        p.v = inputs[mLayout.v];
        p.g = inputs[mLayout.g];
        p.beta = inputs[mLayout.beta];
        p.cuSeqlens = static_cast<int32_t const*>(inputs[mLayout.cuSeqlens]);
        p.initialState = static_cast<float const*>(inputs[mLayout.state]);
        if (mLayout.aLog >= 0)
        {
            p.ALog = static_cast<float const*>(inputs[mLayout.aLog]);
            p.dtBias = static_cast<float const*>(inputs[mLayout.dtBias]);
        }
        p.o = outputs[kOutO];
        p.finalState = static_cast<float*>(outputs[kOutState]);
        p.workspace = workspace;
        p.workspaceBytes = gdnPrefillWorkspaceSize(p);
        char const* why = gdnPrefillSupports(p);
        if (why != nullptr && why[0] != '\0')
        {
            throw GdnPluginError(std::string("unsupported by the kernels: ") + why);
        }
        cudaError_t const err = launchGdnPrefill(p, stream);
        if (err != cudaSuccess)
        {
            throw GdnPluginError(std::string("launchGdnPrefill failed: ") + cudaGetErrorName(err) + " ("
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

IPluginV3* GdnPrefillPlugin::attachToContext(IPluginResourceContext* context) noexcept
{
    try
    {
        auto* p = new GdnPrefillPlugin(mAttrs);
        p->mRecorder = context != nullptr ? context->getErrorRecorder() : nullptr;
        return p;
    }
    catch (std::exception const& e)
    {
        fail("attachToContext", e.what());
    }
    return nullptr;
}

PluginFieldCollection const* GdnPrefillPlugin::getFieldsToSerialize() noexcept
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
GdnPrefillPluginCreator::GdnPrefillPluginCreator()
{
    mFieldNames.setNames(kHasStateMode);
}

char const* GdnPrefillPluginCreator::getPluginName() const noexcept
{
    return spec::kGatedDeltaPrefillName;
}

char const* GdnPrefillPluginCreator::getPluginVersion() const noexcept
{
    return spec::kPluginVersion;
}

char const* GdnPrefillPluginCreator::getPluginNamespace() const noexcept
{
    return spec::kPluginNamespace;
}

PluginFieldCollection const* GdnPrefillPluginCreator::getFieldNames() noexcept
{
    return mFieldNames.collection();
}

IPluginV3* GdnPrefillPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        GdnAttrs const attrs = parseFields(fc, kHasStateMode, spec::kGatedDeltaPrefillName);
        return new GdnPrefillPlugin(attrs);
    }
    catch (std::exception const& e)
    {
        reportError(nullptr,
            std::string(spec::kGatedDeltaPrefillName) + " createPlugin('" + (name ? name : "") + "'): " + e.what());
    }
    return nullptr;
}

} // namespace plugin
} // namespace gdn
