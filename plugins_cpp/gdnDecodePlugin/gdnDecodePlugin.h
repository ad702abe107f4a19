// TensorRT IPluginV3 for the ONNX op gdn::GatedDeltaDecode (one-token recurrent step of the
// gated delta rule). Name, namespace, version, fields and input order: plugins_cpp/common/gdnOpSpec.h.
// state_mode 1 (pool): output 1 aliases input 'state' through getAliasedInput (TensorRT >= 10.3, builder
// preview feature kALIASED_PLUGIN_IO_10_03); without it enqueue copies the pool into output 1 first.
// The IPluginV3 boilerplate is in plugins_cpp/common/gdnPluginBase.h; this class holds only what is
// decode-specific: inputs/outputs, shape rules, aliasing and the GdnDecodeParams fill + launch.
#pragma once

#include "gdnPluginBase.h"

namespace gdn
{
namespace plugin
{

class GdnDecodePlugin final : public GdnPluginBase<GdnDecodePlugin, GdnDecodeParams>
{
public:
    static constexpr char const* kName = spec::kGatedDeltaDecodeName;
    static constexpr bool kHasStateMode = true; // GatedDeltaDecode has a state_mode field
    static constexpr int32_t kNbOutputs = spec::kGatedDeltaDecodeNumOutputs;
    static constexpr char const* kLaunchName = "launchGdnDecode";

    explicit GdnDecodePlugin(GdnAttrs const& attrs)
        : GdnPluginBase(attrs)
    {
    }

private:
    friend class GdnPluginBase<GdnDecodePlugin, GdnDecodeParams>;

    static InputLayout layoutFor(GdnAttrs const& attrs) noexcept
    {
        return decodeLayout(attrs);
    }
    static cudaError_t launch(GdnDecodeParams const& p, cudaStream_t stream)
    {
        return launchGdnDecode(p, stream);
    }
    //! Shape rules of the spec on `dims` (one per input; negative extents are skipped). Throws GdnPluginError.
    void checkShapes(nvinfer1::Dims const* dims, int32_t nbInputs) const;
    //! Kernel params from input dims and dtypes (no pointers). Throws for unsupported dtypes.
    GdnDecodeParams makeParams(nvinfer1::Dims const* dims, nvinfer1::DataType ioType,
        nvinfer1::DataType gateType) const;
    //! o [B,Hv,V], new_state / updated pool with the shape of input 'state'.
    void outputShapes(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs* outputs,
        nvinfer1::IExprBuilder& exprBuilder) const;
    size_t workspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs) const noexcept;
    int32_t aliasedInput(int32_t outputIndex) const noexcept;
    void bindOpBuffers(GdnDecodeParams& p, void const* const* inputs, void* const* outputs, void* workspace,
        cudaStream_t stream) const;
};

using GdnDecodePluginCreator = GdnPluginCreator<GdnDecodePlugin>;

} // namespace plugin
} // namespace gdn
