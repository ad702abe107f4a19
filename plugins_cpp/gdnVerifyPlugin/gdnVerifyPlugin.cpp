#include "gdnVerifyPlugin.h"

using namespace nvinfer1;

namespace gdn
{
namespace plugin
{
namespace
{
constexpr int32_t kOutCommitK = 1;
constexpr int32_t kOutCommitDelta = 2;
constexpr int32_t kOutCommitG = 3;
constexpr int32_t kSlotsSpecIndex = 7;
constexpr int32_t kALogSpecIndex = 8;
} // namespace

void GdnVerifyPlugin::checkShapes(Dims const* dims, int32_t nbInputs) const
{
    if (nbInputs != mLayout.nbInputs)
    {
        throw GdnPluginError("expected " + std::to_string(mLayout.nbInputs) + " inputs for gate_mode="
            + std::to_string(mAttrs.gateMode) + ", state_mode=" + std::to_string(mAttrs.stateMode) + ", got "
            + std::to_string(nbInputs));
    }
    checkCommonShapes(dims, mLayout, verifyInputName, kALogSpecIndex);
    Dims const& cu = dims[mLayout.cuSeqlens];
    Dims const& st = dims[mLayout.state];
    char const* cuName = verifyInputName(mLayout.cuSeqlens);
    char const* stName = verifyInputName(mLayout.state);
    expectRank(cuName, cu, 1, "[N+1]");
    expectRank(stName, st, 4, "[S,Hv,K,V]");
    if (cu.d[0] == 0)
    {
        throw GdnPluginError(std::string(cuName) + ": has no entries; expected int32 [N+1] offsets starting at 0");
    }
    int64_t const n = cu.d[0] < 0 ? -1 : cu.d[0] - 1;
    if (mAttrs.stateMode == spec::kStateDense)
    {
        expectDim(stName, st, 0, "S=N", n, "cu_seqlens (state_mode 0: one state row per sequence)");
    }
    else
    {
        char const* slotsName = verifyInputName(kSlotsSpecIndex);
        expectRank(slotsName, dims[mLayout.slots], 1, "[N]");
        expectDim(slotsName, dims[mLayout.slots], 0, "N", n, "cu_seqlens");
    }
    expectDim(stName, st, 1, "Hv", dims[mLayout.v].d[1], "v");
    expectDim(stName, st, 2, "K", dims[mLayout.q].d[2], "q");
    expectDim(stName, st, 3, "V", dims[mLayout.v].d[2], "v");
}

GdnVerifyParams GdnVerifyPlugin::makeParams(Dims const* dims, DataType ioType, DataType gateType) const
{
    GdnVerifyParams p = commonParams(dims, ioType, gateType);
    p.T = static_cast<int32_t>(dims[mLayout.q].d[0]);
    p.N = static_cast<int32_t>(dims[mLayout.cuSeqlens].d[0] - 1);
    p.P = static_cast<int32_t>(dims[mLayout.state].d[0]);
    p.stateMode = mAttrs.stateMode;
    return p;
}

void GdnVerifyPlugin::outputShapes(DimsExprs const* inputs, DimsExprs* outputs, IExprBuilder& /*exprBuilder*/) const
{
    DimsExprs const& k = inputs[mLayout.k];
    DimsExprs const& v = inputs[mLayout.v];
    DimsExprs const& g = inputs[mLayout.g];
    if (k.nbDims != 3 || v.nbDims != 3 || g.nbDims != 2)
    {
        throw GdnPluginError("k and v must be 3-D and g 2-D");
    }
    outputs[kOutO] = v;            // o [T,Hv,V]
    outputs[kOutCommitK] = k;      // commit_k [T,Hk,K]
    outputs[kOutCommitDelta] = v;  // commit_delta [T,Hv,V]
    outputs[kOutCommitG] = g;      // commit_g [T,Hv]
}

size_t GdnVerifyPlugin::workspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/) const noexcept
{
    return 0; // the verify kernel needs no scratch memory
}

int32_t GdnVerifyPlugin::aliasedInput(int32_t /*outputIndex*/) const noexcept
{
    return -1; // the state is only read; the commit plugin updates it
}

void GdnVerifyPlugin::bindOpBuffers(GdnVerifyParams& p, void const* const* inputs, void* const* outputs,
    void* /*workspace*/, cudaStream_t /*stream*/) const
{
    p.cuSeqlens = static_cast<int32_t const*>(inputs[mLayout.cuSeqlens]);
    p.state = static_cast<float const*>(inputs[mLayout.state]);
    if (mAttrs.stateMode == spec::kStatePool)
    {
        p.slots = static_cast<int32_t const*>(inputs[mLayout.slots]);
    }
    p.commitK = static_cast<float*>(outputs[kOutCommitK]);
    p.commitDelta = static_cast<float*>(outputs[kOutCommitDelta]);
    p.commitG = static_cast<float*>(outputs[kOutCommitG]);
}

} // namespace plugin
} // namespace gdn
