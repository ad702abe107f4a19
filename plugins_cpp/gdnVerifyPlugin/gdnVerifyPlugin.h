// TensorRT IPluginV3 for the ONNX op gdn::GatedDeltaVerify (speculative decoding: up to kMaxDraftTokens tokens per
// sequence scored from a state that is only read). Outputs: o (q's dtype) and the float32 per-step factors
// commit_k, commit_delta, commit_g that gdn::GatedDeltaCommit (gdnCommitPlugin) replays for the accepted prefix.
// Name, namespace, version, fields and input order: plugins_cpp/common/gdnOpSpec.h. The IPluginV3 boilerplate is
// in plugins_cpp/common/gdnPluginBase.h; this class holds only what is verify-specific.
#pragma once

#include "gdnPluginBase.h"

namespace gdn
{
namespace plugin
{

class GdnVerifyPlugin final : public GdnPluginBase<GdnVerifyPlugin, GdnVerifyParams>
{
public:
    static constexpr char const* kName = spec::kGatedDeltaVerifyName;
    static constexpr bool kHasStateMode = true; // GatedDeltaVerify has a state_mode field
    static constexpr int32_t kNbOutputs = spec::kGatedDeltaVerifyNumOutputs;
    static constexpr char const* kLaunchName = "launchGdnVerify";

    explicit GdnVerifyPlugin(GdnAttrs const& attrs)
        : GdnPluginBase(attrs)
    {
    }

private:
    friend class GdnPluginBase<GdnVerifyPlugin, GdnVerifyParams>;

    static InputLayout layoutFor(GdnAttrs const& attrs) noexcept
    {
        return verifyLayout(attrs);
    }
    static cudaError_t launch(GdnVerifyParams const& p, cudaStream_t stream)
    {
        return launchGdnVerify(p, stream);
    }
    //! Shape rules of the spec on `dims` (one per input; negative extents are skipped). Throws GdnPluginError.
    void checkShapes(nvinfer1::Dims const* dims, int32_t nbInputs) const;
    //! Kernel params from input dims and dtypes (no pointers). Throws for unsupported dtypes.
    GdnVerifyParams makeParams(nvinfer1::Dims const* dims, nvinfer1::DataType ioType,
        nvinfer1::DataType gateType) const;
    //! o [T,Hv,V], commit_k [T,Hk,K], commit_delta [T,Hv,V], commit_g [T,Hv].
    void outputShapes(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs,
        nvinfer1::IExprBuilder& exprBuilder) const;
    size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const noexcept;
    int32_t aliasedInput(int32_t outputIndex) const noexcept;
    void bindOpBuffers(GdnVerifyParams& p, void const* const* inputs, void* const* outputs, void* workspace,
        cudaStream_t stream) const;
};

using GdnVerifyPluginCreator = GdnPluginCreator<GdnVerifyPlugin>;

} // namespace plugin
} // namespace gdn
