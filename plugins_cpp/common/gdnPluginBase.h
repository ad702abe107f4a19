// What the gdn TensorRT plugins of the q/k/v ops (prefill, decode, verify) share, written once:
// GdnPluginBase<Derived, Params> implements the IPluginV3 boilerplate (capability interfaces, name/namespace/version
// through GdnPluginNamed, clone/attachToContext, field serialisation, output dtypes, format combinations,
// configure/onShapeChange checks, enqueue) with every noexcept method catching and reporting, and what
// GdnPluginCreator<Plugin> (gdnPluginCreator.h) needs to create one from its fields. A plugin class only says what
// differs:
//
//   static constexpr char const* kName;            // spec op name = plugin name
//   static constexpr bool kHasStateMode;           // the op has the state_mode field
//   static constexpr int32_t kNbOutputs;
//   static InputLayout layoutFor(GdnAttrs const&) noexcept;
//   void checkShapes(Dims const* dims, int32_t nbInputs) const;            // throws GdnPluginError
//   Params makeParams(Dims const* dims, DataType io, DataType gate) const; // via commonParams(); no pointers
//   void outputShapes(DimsExprs const* in, DimsExprs* out, IExprBuilder&) const; // throws
//   size_t workspaceSize(DynamicPluginTensorDesc const* in, int32_t nbInputs) const; // throws
//   int32_t aliasedInput(int32_t outputIndex) const noexcept;
//   void bindOpBuffers(Params&, void const* const* in, void* const* out, void* ws, cudaStream_t) const; // throws
//   static cudaError_t launch(Params const&, cudaStream_t); static constexpr char const* kLaunchName;
//
// Inputs q, k, v, g, beta, A_log, dt_bias and output 0 (o) are bound here; the op binds its state buffers.
#pragma once

#include "gdnPluginCreator.h"
#include "gdnPluginUtils.h"

#include <exception>
#include <string>
#include <vector>

namespace gdn
{
namespace plugin
{

constexpr int32_t kOutO = 0;     // output 0: o
constexpr int32_t kOutState = 1; // output 1: final_state / new_state / updated pool / commit_k (float32)

template <typename Derived, typename Params>
class GdnPluginBase : public nvinfer1::IPluginV3,
                      public GdnPluginNamed<nvinfer1::IPluginV3OneCore, Derived>, // IPluginV3OneCore
                      public PluginBuildBase,
                      public nvinfer1::IPluginV3OneRuntime
{
public:
    explicit GdnPluginBase(GdnAttrs const& attrs)
        : mAttrs(attrs)
        , mLayout(Derived::layoutFor(attrs))
    {
        checkAttrs(mAttrs, Derived::kHasStateMode, Derived::kName);
        mSerialized.setValues(mAttrs, Derived::kHasStateMode);
    }
    ~GdnPluginBase() override = default;

    //! For GdnPluginCreator<Derived>: the op's fields (state_mode where it has one) and a plugin made from them.
    static void fieldNames(FieldList& names)
    {
        names.setNames(Derived::kHasStateMode);
    }
    static Derived* fromFields(nvinfer1::PluginFieldCollection const* fc)
    {
        return new Derived(parseFields(fc, Derived::kHasStateMode, Derived::kName));
    }

    GdnAttrs const& attrs() const noexcept
    {
        return mAttrs;
    }

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override
    {
        try
        {
            switch (type)
            {
            case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
            case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<PluginBuildBase*>(this);
            case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
            }
        }
        catch (std::exception const& e)
        {
            fail("getCapabilityInterface", e.what());
        }
        return nullptr;
    }

    nvinfer1::IPluginV3* clone() noexcept override
    {
        return copyWithRecorder("clone", mRecorder);
    }

    // IPluginV3OneBuild(V2)
    int32_t getNbOutputs() const noexcept override
    {
        return Derived::kNbOutputs;
    }

    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override
    {
        try
        {
            checkDescriptors(in, out, nbOutputs);
            derived().checkShapes(descDims(in, nbInputs).data(), nbInputs);
            checkKernelSupport(maxDims(in, nbInputs).data(), in[mLayout.q].desc.type, in[mLayout.g].desc.type);
            return 0;
        }
        catch (std::exception const& e)
        {
            fail("configurePlugin", e.what());
        }
        return 1;
    }

    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override
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
            for (int32_t i = kOutState; i < nbOutputs; ++i)
            {
                outputTypes[i] = nvinfer1::DataType::kFLOAT; // states and verify's commit factors
            }
            return 0;
        }
        catch (std::exception const& e)
        {
            fail("getOutputDataTypes", e.what());
        }
        return 1;
    }

    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override
    {
        try
        {
            if (inputs == nullptr || outputs == nullptr || nbInputs != mLayout.nbInputs
                || nbOutputs != getNbOutputs())
            {
                throw GdnPluginError(
                    "expected " + std::to_string(mLayout.nbInputs) + " inputs, got " + std::to_string(nbInputs));
            }
            derived().outputShapes(inputs, outputs, exprBuilder);
            return 0;
        }
        catch (std::exception const& e)
        {
            fail("getOutputShapes", e.what());
        }
        return 1;
    }

    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override
    {
        using nvinfer1::DataType;
        try
        {
            if (inOut == nullptr || nbInputs != mLayout.nbInputs || nbOutputs != getNbOutputs() || pos < 0
                || pos >= nbInputs + nbOutputs)
            {
                return false;
            }
            nvinfer1::PluginTensorDesc const& d = inOut[pos].desc;
            if (d.format != nvinfer1::TensorFormat::kLINEAR)
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
            if (pos == mLayout.cuSeqlens || pos == mLayout.slots) // -1 when the op has no such input
            {
                return t == DataType::kINT32;
            }
            return t == DataType::kFLOAT; // initial_state / state, A_log, dt_bias
        }
        catch (std::exception const& e)
        {
            fail("supportsFormatCombination", e.what());
        }
        return false;
    }

    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept override
    {
        try
        {
            return derived().workspaceSize(inputs, nbInputs);
        }
        catch (std::exception const& e)
        {
            fail("getWorkspaceSize", e.what());
        }
        return 0;
    }

#if GDN_TRT_HAS_BUILD_V2
    int32_t getAliasedInput(int32_t outputIndex) noexcept override
    {
        return derived().aliasedInput(outputIndex);
    }
#endif

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override
    {
        try
        {
            checkDescriptors(in, out, nbOutputs);
            std::vector<nvinfer1::Dims> const dims = descDims(in, nbInputs);
            derived().checkShapes(dims.data(), nbInputs);
            checkKernelSupport(dims.data(), in[mLayout.q].type, in[mLayout.g].type);
            return 0;
        }
        catch (std::exception const& e)
        {
            fail("onShapeChange", e.what());
        }
        return 1;
    }

    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* /*outputDesc*/,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override
    {
        try
        {
            if (inputDesc == nullptr || inputs == nullptr || outputs == nullptr)
            {
                throw GdnPluginError("null descriptors or pointers");
            }
            std::vector<nvinfer1::Dims> const dims = descDims(inputDesc, mLayout.nbInputs);
            Params p = derived().makeParams(dims.data(), inputDesc[mLayout.q].type, inputDesc[mLayout.g].type);
            p.q = inputs[mLayout.q];
            p.k = inputs[mLayout.k];
            p.v = inputs[mLayout.v];
            p.g = inputs[mLayout.g];
            p.beta = inputs[mLayout.beta];
            if (mLayout.aLog >= 0)
            {
                p.ALog = static_cast<float const*>(inputs[mLayout.aLog]);
                p.dtBias = static_cast<float const*>(inputs[mLayout.dtBias]);
            }
            p.o = outputs[kOutO];
            derived().bindOpBuffers(p, inputs, outputs, workspace, stream);
            requireSupported(kernelSupports(p));
            requireLaunched(Derived::launch(p, stream), Derived::kLaunchName);
            return 0;
        }
        catch (std::exception const& e)
        {
            fail("enqueue", e.what());
        }
        return 1;
    }

    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override
    {
        return copyWithRecorder("attachToContext", context != nullptr ? context->getErrorRecorder() : nullptr);
    }

    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override
    {
        try
        {
            mSerialized.setValues(mAttrs, Derived::kHasStateMode);
            return mSerialized.collection();
        }
        catch (std::exception const& e)
        {
            fail("getFieldsToSerialize", e.what());
        }
        return nullptr;
    }

protected:
    //! Params with the fields both ops share: Hk, K (from q), Hv, V (from v), dtypes and attributes.
    Params commonParams(nvinfer1::Dims const* dims, nvinfer1::DataType ioType, nvinfer1::DataType gateType) const
    {
        Params p;
        nvinfer1::Dims const& q = dims[mLayout.q];
        nvinfer1::Dims const& v = dims[mLayout.v];
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
            throw GdnPluginError(
                std::string("g: dtype ") + typeName(gateType) + " is not float32, float16 or bfloat16");
        }
        p.gateMode = mAttrs.gateMode;
        p.useQkL2norm = mAttrs.useQkL2norm;
        p.scale = mAttrs.scale;
        p.l2normEps = mAttrs.l2normEps;
        return p;
    }

    GdnAttrs mAttrs;
    InputLayout mLayout;

private:
    Derived& derived() noexcept
    {
        return static_cast<Derived&>(*this);
    }
    Derived const& derived() const noexcept
    {
        return static_cast<Derived const&>(*this);
    }

    void fail(char const* method, std::string const& msg) const noexcept
    {
        reportError(mRecorder, std::string(Derived::kName) + "::" + method + ": " + msg);
    }

    nvinfer1::IPluginV3* copyWithRecorder(char const* method, nvinfer1::IErrorRecorder* recorder) noexcept
    {
        try
        {
            auto* p = new Derived(mAttrs);
            p->mRecorder = recorder;
            return p;
        }
        catch (std::exception const& e)
        {
            fail(method, e.what());
        }
        return nullptr;
    }

    template <typename Desc>
    void checkDescriptors(Desc const* in, Desc const* out, int32_t nbOutputs) const
    {
        if (in == nullptr || (nbOutputs > 0 && out == nullptr) || nbOutputs != getNbOutputs())
        {
            throw GdnPluginError("invalid input/output descriptors");
        }
    }

    //! Shapes and dtypes against gdn*Supports (no buffers yet: placeholder pointers).
    void checkKernelSupport(nvinfer1::Dims const* dims, nvinfer1::DataType ioType, nvinfer1::DataType gateType) const
    {
        Params p = derived().makeParams(dims, ioType, gateType);
        fillPlaceholders(p);
        requireSupported(kernelSupports(p));
    }

    FieldList mSerialized;
    nvinfer1::IErrorRecorder* mRecorder = nullptr;
};

} // namespace plugin
} // namespace gdn
