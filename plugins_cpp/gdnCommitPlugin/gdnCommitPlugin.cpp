#include "gdnCommitPlugin.h"

#include <exception>
#include <vector>

using namespace nvinfer1;

namespace gdn
{
namespace plugin
{
namespace
{
// Input positions (spec order); slots only in state_mode 1.
constexpr int32_t kState = 0;
constexpr int32_t kCommitK = 1;
constexpr int32_t kCommitDelta = 2;
constexpr int32_t kCommitG = 3;
constexpr int32_t kCuSeqlens = 4;
constexpr int32_t kAccepted = 5;
constexpr int32_t kSlots = 6;
constexpr int32_t kOutNewState = 0;

bool isIndexInput(int32_t pos) noexcept
{
    return pos == kCuSeqlens || pos == kAccepted || pos == kSlots;
}
} // namespace

GdnCommitPlugin::GdnCommitPlugin(int32_t stateMode)
    : mStateMode(stateMode)
{
    GdnAttrs a;
    a.stateMode = stateMode;
    checkAttrs(a, true, kName);
    mSerialized.setStateModeValue(mStateMode);
}

IPluginCapability* GdnCommitPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<PluginBuildBase*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* GdnCommitPlugin::clone() noexcept
{
    return copyWithRecorder("clone", mRecorder);
}

IPluginV3* GdnCommitPlugin::attachToContext(IPluginResourceContext* context) noexcept
{
    return copyWithRecorder("attachToContext", context != nullptr ? context->getErrorRecorder() : nullptr);
}

IPluginV3* GdnCommitPlugin::copyWithRecorder(char const* method, IErrorRecorder* recorder) noexcept
{
    try
    {
        auto* p = new GdnCommitPlugin(mStateMode);
        p->mRecorder = recorder;
        return p;
    }
    catch (std::exception const& e)
    {
        fail(method, e.what());
    }
    return nullptr;
}

void GdnCommitPlugin::fail(char const* method, std::string const& msg) const noexcept
{
    reportError(mRecorder, std::string(kName) + "::" + method + ": " + msg);
}

void GdnCommitPlugin::checkShapes(Dims const* dims, int32_t nbIn) const
{
    if (nbIn != nbInputs())
    {
        throw GdnPluginError("expected " + std::to_string(nbInputs()) + " inputs for state_mode="
            + std::to_string(mStateMode) + ", got " + std::to_string(nbIn));
    }
    Dims const& st = dims[kState];
    Dims const& ck = dims[kCommitK];
    Dims const& cd = dims[kCommitDelta];
    Dims const& cg = dims[kCommitG];
    Dims const& cu = dims[kCuSeqlens];
    Dims const& acc = dims[kAccepted];
    expectRank(commitInputName(kState), st, 4, "[S,Hv,K,V]");
    expectRank(commitInputName(kCommitK), ck, 3, "[T,Hk,K]");
    expectRank(commitInputName(kCommitDelta), cd, 3, "[T,Hv,V]");
    expectRank(commitInputName(kCommitG), cg, 2, "[T,Hv]");
    expectRank(commitInputName(kCuSeqlens), cu, 1, "[N+1]");
    expectRank(commitInputName(kAccepted), acc, 1, "[N]");
    if (cu.d[0] == 0)
    {
        throw GdnPluginError("cu_seqlens: has no entries; expected int32 [N+1] offsets starting at 0");
    }
    int64_t const n = cu.d[0] < 0 ? -1 : cu.d[0] - 1;
    char const* stName = commitInputName(kState);
    expectDim(commitInputName(kAccepted), acc, 0, "N", n, "cu_seqlens");
    expectDim(commitInputName(kCommitDelta), cd, 0, "T", ck.d[0], "commit_k");
    expectDim(commitInputName(kCommitG), cg, 0, "T", ck.d[0], "commit_k");
    expectDim(commitInputName(kCommitDelta), cd, 1, "Hv", st.d[1], "state");
    expectDim(commitInputName(kCommitG), cg, 1, "Hv", st.d[1], "state");
    expectDim(commitInputName(kCommitK), ck, 2, "K", st.d[2], "state");
    expectDim(commitInputName(kCommitDelta), cd, 2, "V", st.d[3], "state");
    int64_t const Hk = ck.d[1];
    int64_t const Hv = st.d[1];
    if (Hk > 0 && Hv >= 0 && Hv % Hk != 0)
    {
        throw GdnPluginError("heads: Hv=" + std::to_string(Hv) + " (state) is not a multiple of Hk="
            + std::to_string(Hk) + " (commit_k); grouped value attention needs Hv % Hk == 0");
    }
    if (mStateMode == spec::kStateDense)
    {
        expectDim(stName, st, 0, "S=N", n, "cu_seqlens (state_mode 0: one state row per sequence)");
    }
    else
    {
        expectRank(commitInputName(kSlots), dims[kSlots], 1, "[N]");
        expectDim(commitInputName(kSlots), dims[kSlots], 0, "N", n, "cu_seqlens");
    }
}

GdnCommitParams GdnCommitPlugin::makeParams(Dims const* dims) const
{
    GdnCommitParams p;
    p.T = static_cast<int32_t>(dims[kCommitK].d[0]);
    p.N = static_cast<int32_t>(dims[kCuSeqlens].d[0] - 1);
    p.P = static_cast<int32_t>(dims[kState].d[0]);
    p.Hk = static_cast<int32_t>(dims[kCommitK].d[1]);
    p.Hv = static_cast<int32_t>(dims[kState].d[1]);
    p.K = static_cast<int32_t>(dims[kState].d[2]);
    p.V = static_cast<int32_t>(dims[kState].d[3]);
    p.stateMode = mStateMode;
    return p;
}

//! Shapes, then the kernels' own checks with placeholder pointers (no buffers at build time).
void GdnCommitPlugin::check(Dims const* dims, int32_t nbIn, int32_t nbOutputs) const
{
    if (nbOutputs != getNbOutputs())
    {
        throw GdnPluginError("expected " + std::to_string(getNbOutputs()) + " output, got "
            + std::to_string(nbOutputs));
    }
    checkShapes(dims, nbIn);
    GdnCommitParams p = makeParams(dims);
    fillPlaceholders(p);
    requireSupported(gdnCommitSupports(p));
}

int32_t GdnCommitPlugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbIn,
    DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        if (in == nullptr || (nbOutputs > 0 && out == nullptr))
        {
            throw GdnPluginError("invalid input/output descriptors");
        }
        checkShapes(descDims(in, nbIn).data(), nbIn);
        check(maxDims(in, nbIn).data(), nbIn, nbOutputs);
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("configurePlugin", e.what());
    }
    return 1;
}

int32_t GdnCommitPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbIn) const noexcept
{
    try
    {
        if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != getNbOutputs() || nbIn != nbInputs())
        {
            throw GdnPluginError("expected " + std::to_string(nbInputs()) + " inputs and 1 output, got "
                + std::to_string(nbIn) + " and " + std::to_string(nbOutputs));
        }
        outputTypes[kOutNewState] = DataType::kFLOAT;
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("getOutputDataTypes", e.what());
    }
    return 1;
}

int32_t GdnCommitPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbIn, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    try
    {
        if (inputs == nullptr || outputs == nullptr || nbIn != nbInputs() || nbOutputs != getNbOutputs())
        {
            throw GdnPluginError("expected " + std::to_string(nbInputs()) + " inputs, got " + std::to_string(nbIn));
        }
        if (inputs[kState].nbDims != 4)
        {
            throw GdnPluginError("state must be 4-D");
        }
        outputs[kOutNewState] = inputs[kState]; // new_state / updated pool [S,Hv,K,V]
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("getOutputShapes", e.what());
    }
    return 1;
}

bool GdnCommitPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbIn, int32_t nbOutputs) noexcept
{
    if (inOut == nullptr || nbIn != nbInputs() || nbOutputs != getNbOutputs() || pos < 0 || pos >= nbIn + nbOutputs)
    {
        return false;
    }
    PluginTensorDesc const& d = inOut[pos].desc;
    if (d.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    // state, the factors and new_state float32; offsets, counts and slots int32
    return d.type == (pos < nbIn && isIndexInput(pos) ? DataType::kINT32 : DataType::kFLOAT);
}

size_t GdnCommitPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return 0; // the commit kernel needs no scratch memory
}

#if GDN_TRT_HAS_BUILD_V2
int32_t GdnCommitPlugin::getAliasedInput(int32_t outputIndex) noexcept
{
    // state_mode 1: the pool is updated in place, output 0 is input 'state'.
    return (mStateMode == spec::kStatePool && outputIndex == kOutNewState) ? kState : -1;
}
#endif

int32_t GdnCommitPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbIn, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    try
    {
        if (in == nullptr || (nbOutputs > 0 && out == nullptr))
        {
            throw GdnPluginError("invalid input/output descriptors");
        }
        check(descDims(in, nbIn).data(), nbIn, nbOutputs);
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("onShapeChange", e.what());
    }
    return 1;
}

int32_t GdnCommitPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    try
    {
        if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
        {
            throw GdnPluginError("null descriptors or pointers");
        }
        std::vector<Dims> const dims = descDims(inputDesc, nbInputs());
        GdnCommitParams p = makeParams(dims.data());
        auto* stateOut = static_cast<float*>(outputs[kOutNewState]);
        auto const* stateIn = static_cast<float const*>(inputs[kState]);
        if (static_cast<void const*>(stateOut) != static_cast<void const*>(stateIn))
        {
            // state_mode 0, or a pool without aliasing: rows the commit does not touch must still reach output 0.
            size_t const bytes = static_cast<size_t>(p.P) * p.Hv * p.K * p.V * sizeof(float);
            cudaError_t const cp = cudaMemcpyAsync(stateOut, stateIn, bytes, cudaMemcpyDeviceToDevice, stream);
            if (cp != cudaSuccess)
            {
                throw GdnPluginError(std::string("state copy failed: ") + cudaGetErrorName(cp));
            }
        }
        p.state = stateOut; // updated in place
        p.commitK = static_cast<float const*>(inputs[kCommitK]);
        p.commitDelta = static_cast<float const*>(inputs[kCommitDelta]);
        p.commitG = static_cast<float const*>(inputs[kCommitG]);
        p.cuSeqlens = static_cast<int32_t const*>(inputs[kCuSeqlens]);
        p.accepted = static_cast<int32_t const*>(inputs[kAccepted]);
        if (mStateMode == spec::kStatePool)
        {
            p.slots = static_cast<int32_t const*>(inputs[kSlots]);
        }
        requireSupported(gdnCommitSupports(p));
        requireLaunched(launchGdnCommit(p, stream), "launchGdnCommit");
        return 0;
    }
    catch (std::exception const& e)
    {
        fail("enqueue", e.what());
    }
    return 1;
}

PluginFieldCollection const* GdnCommitPlugin::getFieldsToSerialize() noexcept
{
    try
    {
        mSerialized.setStateModeValue(mStateMode);
        return mSerialized.collection();
    }
    catch (std::exception const& e)
    {
        fail("getFieldsToSerialize", e.what());
    }
    return nullptr;
}

GdnCommitPlugin* GdnCommitPlugin::fromFields(PluginFieldCollection const* fc)
{
    return new GdnCommitPlugin(parseFields(fc, true, kName).stateMode);
}

} // namespace plugin
} // namespace gdn
