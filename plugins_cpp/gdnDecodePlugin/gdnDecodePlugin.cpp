#include "gdnDecodePlugin.h"

using namespace nvinfer1;

namespace gdn
{
namespace plugin
{

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
    GdnDecodeParams p = commonParams(dims, ioType, gateType);
    p.B = static_cast<int32_t>(dims[mLayout.q].d[0]);
    p.P = static_cast<int32_t>(dims[mLayout.state].d[0]);
    p.stateMode = mAttrs.stateMode;
    return p;
}

void GdnDecodePlugin::outputShapes(DimsExprs const* inputs, DimsExprs* outputs, IExprBuilder& /*exprBuilder*/) const
{
    DimsExprs const& v = inputs[mLayout.v];
    DimsExprs const& state = inputs[mLayout.state];
    if (v.nbDims != 3 || state.nbDims != 4)
    {
        throw GdnPluginError("v must be 3-D and state 4-D");
    }
    outputs[kOutO] = v;         // o [B,Hv,V]
    outputs[kOutState] = state; // new_state / updated pool [S,Hv,K,V]
}

size_t GdnDecodePlugin::workspaceSize(
    DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/) const noexcept
{
    return 0; // the decode kernel needs no scratch memory
}

int32_t GdnDecodePlugin::aliasedInput(int32_t outputIndex) const noexcept
{
    // state_mode 1: the pool is updated in place, output 1 is input 'state'.
    return (mAttrs.stateMode == spec::kStatePool && outputIndex == kOutState) ? mLayout.state : -1;
}

void GdnDecodePlugin::bindOpBuffers(GdnDecodeParams& p, void const* const* inputs, void* const* outputs,
    void* /*workspace*/, cudaStream_t stream) const
{
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
}

} // namespace plugin
} // namespace gdn
