// TensorRT IPluginV3 for the ONNX op gdn::GatedDeltaDecode (one-token recurrent step of the
// gated delta rule). Name, namespace, version, fields and input order: plugins_cpp/common/gdnOpSpec.h.
// state_mode 1 (pool): output 1 aliases input 'state' through getAliasedInput (TensorRT >= 10.3, builder
// preview feature kALIASED_PLUGIN_IO_10_03); without it enqueue copies the pool into output 1 first.
#pragma once

#include "gdnPluginUtils.h"

namespace gdn
{
namespace plugin
{

class GdnDecodePlugin : public nvinfer1::IPluginV3,
                         public nvinfer1::IPluginV3OneCore,
                         public PluginBuildBase,
                         public nvinfer1::IPluginV3OneRuntime
{
public:
    explicit GdnDecodePlugin(GdnAttrs const& attrs);
    ~GdnDecodePlugin() override = default;

    GdnAttrs const& attrs() const noexcept
    {
        return mAttrs;
    }

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild(V2)
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;
#if GDN_TRT_HAS_BUILD_V2
    int32_t getAliasedInput(int32_t outputIndex) noexcept override;
#endif

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    //! Shape rules of the spec on `dims` (one per input; negative extents are skipped). Throws GdnPluginError.
    void checkShapes(nvinfer1::Dims const* dims, int32_t nbInputs) const;
    //! Kernel params from input dims and dtypes (no pointers). Throws for unsupported dtypes.
    GdnDecodeParams makeParams(
        nvinfer1::Dims const* dims, nvinfer1::DataType ioType, nvinfer1::DataType gateType) const;
    void fail(char const* method, std::string const& msg) const noexcept;

    GdnAttrs mAttrs;
    InputLayout mLayout;
    FieldList mSerialized;
    nvinfer1::IErrorRecorder* mRecorder = nullptr;
};

class GdnDecodePluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    GdnDecodePluginCreator();
    ~GdnDecodePluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    FieldList mFieldNames;
};

} // namespace plugin
} // namespace gdn
