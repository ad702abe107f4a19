// TensorRT IPluginV3 for the ONNX op gdn::GatedDeltaCommit (speculative decoding): replays the first accepted[n]
// rank-1 factors that GatedDeltaVerify (gdnVerifyPlugin) returned into each sequence's state,
// S <- exp(g_t) S + k_t delta_t^T. Its inputs are the state and the factors, not q/k/v, so it does not go through
// GdnPluginBase; it reuses the same field, dtype and shape helpers (gdnPluginUtils.h), the same creator
// (GdnPluginCreator, gdnPluginCreator.h) and the same error handling (every noexcept method catches and reports).
// state_mode 1 (pool): output 0 aliases input 'state' through getAliasedInput (TensorRT >= 10.3, preview feature
// kALIASED_PLUGIN_IO_10_03); without it, and in state_mode 0, enqueue copies the state into output 0 first and
// updates the copy.
#pragma once

#include "gdnPluginCreator.h"
#include "gdnPluginUtils.h"

#include <string>

namespace gdn
{
namespace plugin
{

class GdnCommitPlugin final : public nvinfer1::IPluginV3,
                              public GdnPluginNamed<nvinfer1::IPluginV3OneCore, GdnCommitPlugin>, // IPluginV3OneCore
                              public PluginBuildBase,
                              public nvinfer1::IPluginV3OneRuntime
{
public:
    static constexpr char const* kName = spec::kGatedDeltaCommitName;

    explicit GdnCommitPlugin(int32_t stateMode);
    ~GdnCommitPlugin() override = default;

    //! For GdnPluginCreator<GdnCommitPlugin>: the state_mode field and a plugin made from it.
    static void fieldNames(FieldList& names)
    {
        names.setStateModeNames();
    }
    static GdnCommitPlugin* fromFields(nvinfer1::PluginFieldCollection const* fc);

    int32_t stateMode() const noexcept
    {
        return mStateMode;
    }

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneBuild(V2)
    int32_t getNbOutputs() const noexcept override
    {
        return spec::kGatedDeltaCommitNumOutputs;
    }
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;
#if GDN_TRT_HAS_BUILD_V2
    int32_t getAliasedInput(int32_t outputIndex) noexcept override;
#endif

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    int32_t nbInputs() const noexcept
    {
        return spec::kGatedDeltaCommitNumFixedInputs + (mStateMode == spec::kStatePool ? 1 : 0);
    }
    //! Shape rules of the spec (negative extents are skipped). Throws GdnPluginError.
    void checkShapes(nvinfer1::Dims const* dims, int32_t nbInputs) const;
    GdnCommitParams makeParams(nvinfer1::Dims const* dims) const;
    void check(nvinfer1::Dims const* dims, int32_t nbInputs, int32_t nbOutputs) const;
    void fail(char const* method, std::string const& msg) const noexcept;
    nvinfer1::IPluginV3* copyWithRecorder(char const* method, nvinfer1::IErrorRecorder* recorder) noexcept;

    int32_t mStateMode;
    FieldList mSerialized;
    nvinfer1::IErrorRecorder* mRecorder = nullptr;
};

using GdnCommitPluginCreator = GdnPluginCreator<GdnCommitPlugin>; // field: state_mode

} // namespace plugin
} // namespace gdn
