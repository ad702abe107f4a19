// TensorRT IPluginV3 for the ONNX op gdn::GatedDeltaPrefill (packed variable-length prefill of the
// gated delta rule). Name, namespace, version, fields and input order: plugins_cpp/common/gdnOpSpec.h.
// The IPluginV3 boilerplate is in plugins_cpp/common/gdnPluginBase.h; this class holds only what is
// prefill-specific: inputs/outputs, shape rules, workspace and the GdnPrefillParams fill + launch.
#pragma once

#include "gdnPluginBase.h"

namespace gdn
{
namespace plugin
{

class GdnPrefillPlugin final : public GdnPluginBase<GdnPrefillPlugin, GdnPrefillParams>
{
public:
    static constexpr char const* kName = spec::kGatedDeltaPrefillName;
    static constexpr bool kHasStateMode = false; // GatedDeltaPrefill has no state_mode field
    static constexpr int32_t kNbOutputs = spec::kGatedDeltaPrefillNumOutputs;
    static constexpr char const* kLaunchName = "launchGdnPrefill";

    explicit GdnPrefillPlugin(GdnAttrs const& attrs)
        : GdnPluginBase(attrs)
    {
    }

private:
    friend class GdnPluginBase<GdnPrefillPlugin, GdnPrefillParams>;

    static InputLayout layoutFor(GdnAttrs const& attrs) noexcept
    {
        return prefillLayout(attrs);
    }
    static cudaError_t launch(GdnPrefillParams const& p, cudaStream_t stream)
    {
        return launchGdnPrefill(p, stream);
    }
    //! Shape rules of the spec on `dims` (one per input; negative extents are skipped). Throws GdnPluginError.
    void checkShapes(nvinfer1::Dims const* dims, int32_t nbInputs) const;
    //! Kernel params from input dims and dtypes (no pointers). Throws for unsupported dtypes.
    GdnPrefillParams makeParams(nvinfer1::Dims const* dims, nvinfer1::DataType ioType,
        nvinfer1::DataType gateType) const;
    //! o [T,Hv,V], final_state [N,Hv,K,V] with N = cu_seqlens.shape[0] - 1.
    void outputShapes(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs,
        nvinfer1::IExprBuilder& exprBuilder) const;
    size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const;
    int32_t aliasedInput(int32_t outputIndex) const noexcept;
    void bindOpBuffers(GdnPrefillParams& p, void const* const* inputs, void* const* outputs, void* workspace,
        cudaStream_t stream) const;
};

using GdnPrefillPluginCreator = GdnPluginCreator<GdnPrefillPlugin>;

} // namespace plugin
} // namespace gdn
