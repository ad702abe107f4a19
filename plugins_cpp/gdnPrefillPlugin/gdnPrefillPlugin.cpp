#include "gdnPrefillPlugin.h"

using namespace nvinfer1;

namespace gdn
{
namespace plugin
{

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
    GdnPrefillParams p = commonParams(dims, ioType, gateType);
    p.T = static_cast<int32_t>(dims[mLayout.q].d[0]);
    p.N = static_cast<int32_t>(dims[mLayout.cuSeqlens].d[0] - 1);
    return p;
}

void GdnPrefillPlugin::outputShapes(DimsExprs const* inputs, DimsExprs* outputs, IExprBuilder& exprBuilder) const
{
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
}

size_t GdnPrefillPlugin::workspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const
{
    if (inputs == nullptr || nbInputs != mLayout.nbInputs)
    {
        throw GdnPluginError("unexpected number of inputs");
    }
    GdnPrefillParams const p
        = makeParams(maxDims(inputs, nbInputs).data(), inputs[mLayout.q].desc.type, inputs[mLayout.g].desc.type);
    return gdnPrefillWorkspaceSize(p);
}

int32_t GdnPrefillPlugin::aliasedInput(int32_t /*outputIndex*/) const noexcept
{
    return -1; // final_state is written to its own buffer (the kernels allow it to alias initial_state)
}

void GdnPrefillPlugin::bindOpBuffers(GdnPrefillParams& p, void const* const* inputs, void* const* outputs,
    void* workspace, cudaStream_t /*stream*/) const
{
    p.cuSeqlens = static_cast<int32_t const*>(inputs[mLayout.cuSeqlens]);
    p.initialState = static_cast<float const*>(inputs[mLayout.state]);
    p.finalState = static_cast<float*>(outputs[kOutState]);
    p.workspace = workspace;
    p.workspaceBytes = gdnPrefillWorkspaceSize(p);
}

} // namespace plugin
} // namespace gdn
