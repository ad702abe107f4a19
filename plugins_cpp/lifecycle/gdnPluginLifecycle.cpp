// gdn_plugin_lifecycle [--host-only] CASE_DIR...
//
// Drives each gdn plugin through the calls TensorRT makes, in TensorRT's order, with no TensorRT library:
//   getCreators / setLoggerFinder (as loadLibrary) -> createPlugin(kBUILD) with the fields the ONNX parser builds
//   (node attributes as kINT32 / kFLOAT32 of length 1, absent ones defaulted, plus an unknown one to be ignored) ->
//   capability interfaces -> getOutputDataTypes -> getOutputShapes through a symbolic IExprBuilder (T, N, B, P
//   dynamic) -> supportsFormatCombination at every position, searched like the builder -> configurePlugin with
//   dynamic DynamicPluginTensorDescs (min/opt/max) -> getWorkspaceSize -> clone -> onShapeChange + enqueue on a
//   non-default stream with real device buffers (phase "build") -> getFieldsToSerialize -> createPlugin(kRUNTIME)
//   from a copy of those fields -> attachToContext -> onShapeChange -> enqueue (phase "runtime") -> the same enqueue
//   captured into a CUDA graph (global capture mode: a host sync or allocation inside enqueue breaks it) and
//   launched (phase "graph").
// Every output buffer is NaN-poisoned before each phase and written to CASE_DIR/got_<phase>_<output>.bin; the
// norm-relative error against CASE_DIR's float64 reference is printed (tests/plugins/test_plugin_lifecycle.py
// asserts it). --host-only stops before the first device call (CPU machines).
// Exit code 0 when every check passes; one line per failed check.
#include "gdnLifecycleCase.h"
#include "gdnOpSpec.h"
#include "gdnPluginUtils.h"
#include "testing/gdnTestDoubles.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace nvinfer1;
using gdn::lifecycle::Level;
using gdn::lifecycle::LifecycleCase;
using gdn::lifecycle::TensorSpec;

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
extern "C" void setLoggerFinder(ILoggerFinder* finder);

namespace
{
gdn::testing::CheckCounter gCounter;
gdn::testing::CaptureFinder gFinder;
#define CHECK(cond) GDN_CHECK(gCounter, cond)
#define CUDA_CHECK(call)                                                                                               \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t const e_ = (call);                                                                                 \
        if (e_ != cudaSuccess)                                                                                         \
        {                                                                                                              \
            std::printf("CUDA error %s (%s) in %s\n", cudaGetErrorName(e_), cudaGetErrorString(e_), #call);          \
        }                                                                                                              \
        CHECK(e_ == cudaSuccess);                                                                                      \
    } while (0)

IPluginV3OneBuild* buildOf(IPluginV3* p)
{
    return static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
}
IPluginV3OneRuntime* runtimeOf(IPluginV3* p)
{
    return static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
}
IPluginV3OneCore* coreOf(IPluginV3* p)
{
    return static_cast<IPluginV3OneCore*>(p->getCapabilityInterface(PluginCapabilityType::kCORE));
}

IPluginCreatorV3One* findCreator(std::string const& op)
{
    int32_t nb = 0;
    IPluginCreatorInterface* const* list = getCreators(nb);
    for (int32_t i = 0; i < nb; ++i)
    {
        if (std::strcmp(list[i]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0)
        {
            auto* c = static_cast<IPluginCreatorV3One*>(list[i]);
            if (op == c->getPluginName())
            {
                return c;
            }
        }
    }
    return nullptr;
}

//! A deep copy of a PluginFieldCollection, as TensorRT keeps the serialized fields in the engine.
class FieldCopy
{
public:
    explicit FieldCopy(PluginFieldCollection const* fc)
    {
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
        {
            PluginField const& f = fc->fields[i];
            size_t const bytes = static_cast<size_t>(f.length) * (f.type == PluginFieldType::kCHAR ? 1 : 4);
            mNames.emplace_back(f.name != nullptr ? f.name : "");
            mData.emplace_back(static_cast<char const*>(f.data), static_cast<char const*>(f.data) + bytes);
            mTypes.push_back(f.type);
            mLengths.push_back(f.length);
        }
        for (size_t i = 0; i < mNames.size(); ++i)
        {
            mFields.emplace_back(mNames[i].c_str(), mData[i].data(), mTypes[i], mLengths[i]);
        }
        mCollection.nbFields = static_cast<int32_t>(mFields.size());
        mCollection.fields = mFields.data();
    }
    PluginFieldCollection const* get() const
    {
        return &mCollection;
    }

private:
    std::vector<std::string> mNames;
    std::vector<std::vector<char>> mData;
    std::vector<PluginFieldType> mTypes;
    std::vector<int32_t> mLengths;
    std::vector<PluginField> mFields;
    PluginFieldCollection mCollection{};
};

struct Descs
{
    std::vector<DynamicPluginTensorDesc> dynamic; // build time: -1 for dynamic extents, min/opt/max
    std::vector<PluginTensorDesc> actual;         // run time: the real shapes
};

Descs makeDescs(LifecycleCase const& c)
{
    Descs d;
    auto add = [&](TensorSpec const& t) {
        DynamicPluginTensorDesc dd{};
        dd.desc.dims = c.buildDimsOf(t);
        dd.desc.type = t.type;
        dd.desc.format = TensorFormat::kLINEAR;
        dd.desc.scale = -1.f;
        dd.min = c.dimsOf(t, Level::kMin);
        dd.opt = c.dimsOf(t, Level::kValue);
        dd.max = c.dimsOf(t, Level::kMax);
        d.dynamic.push_back(dd);
        PluginTensorDesc a = dd.desc;
        a.dims = c.dimsOf(t, Level::kValue);
        d.actual.push_back(a);
    };
    for (auto const& t : c.inputs)
        add(t);
    for (auto const& t : c.outputs)
        add(t);
    return d;
}

int32_t inputIndex(LifecycleCase const& c, char const* name)
{
    for (size_t i = 0; i < c.inputs.size(); ++i)
    {
        if (c.inputs[i].name == name)
        {
            return static_cast<int32_t>(i);
        }
    }
    return -1;
}

bool isPool(LifecycleCase const& c)
{
    for (auto const& f : c.intFields)
    {
        if (f.first == gdn::spec::kStateModeName && f.second == gdn::spec::kStatePool)
        {
            return true;
        }
    }
    return false;
}

//! The output that is the updated pool in state_mode 1 (decode, commit: 'new_state'; TensorRT aliases it to input
//! 'state' with the aliased-I/O preview feature); -1 for ops that leave the state alone or write a new one.
int32_t poolOutput(LifecycleCase const& c)
{
    for (size_t o = 0; isPool(c) && o < c.outputs.size(); ++o)
    {
        if (c.outputs[o].name == "new_state")
        {
            return static_cast<int32_t>(o);
        }
    }
    return -1;
}

// ---------------------------------------------------------------- build-time calls
void checkShapes(LifecycleCase const& c, IPluginV3* plugin)
{
    gdn::testing::SymbolicExprBuilder eb;
    std::vector<DimsExprs> in;
    for (auto const& t : c.inputs)
    {
        DimsExprs e{};
        e.nbDims = static_cast<int32_t>(t.shape.size());
        for (int32_t i = 0; i < e.nbDims; ++i)
        {
            auto const& tok = t.shape[static_cast<size_t>(i)];
            e.d[i] = eb.symbol(tok.symbol, tok.value);
        }
        in.push_back(e);
    }
    std::vector<DimsExprs> out(c.outputs.size());
    int32_t const nbIn = static_cast<int32_t>(in.size());
    int32_t const nbOut = static_cast<int32_t>(out.size());
    CHECK(buildOf(plugin)->getOutputShapes(in.data(), nbIn, nullptr, 0, out.data(), nbOut, eb) == 0);
    for (Level level : {Level::kMin, Level::kValue, Level::kMax})
    {
        std::map<std::string, int64_t> sizes;
        for (auto const& kv : c.dims)
        {
            sizes[kv.first] = level == Level::kMin ? kv.second.min : level == Level::kMax ? kv.second.max
                                                                                          : kv.second.value;
        }
        for (size_t o = 0; o < c.outputs.size(); ++o)
        {
            Dims const want = c.dimsOf(c.outputs[o], level);
            CHECK(out[o].nbDims == want.nbDims);
            for (int32_t i = 0; i < want.nbDims && i < out[o].nbDims; ++i)
            {
                CHECK(gdn::testing::evaluate(out[o].d[i], sizes) == want.d[i]);
                // An extent that is a constant of the case stays a build-time constant.
                CHECK(!c.outputs[o].shape[static_cast<size_t>(i)].symbol.empty() || out[o].d[i]->isConstant());
            }
        }
    }
}

//! The builder's search: position by position, every dtype tried with the earlier positions already chosen.
void checkFormats(LifecycleCase const& c, IPluginV3* plugin, Descs const& d)
{
    int32_t const nbIn = static_cast<int32_t>(c.inputs.size());
    int32_t const nbOut = static_cast<int32_t>(c.outputs.size());
    std::vector<DynamicPluginTensorDesc> io = d.dynamic;
    // q and g take any I/O dtype, the rest follow them (ops without q/g, like commit: every dtype is fixed)
    std::set<int32_t> const free = {inputIndex(c, "q"), inputIndex(c, "g")};
    std::set<DataType> const ioTypes = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16};
    for (int32_t pos = 0; pos < nbIn + nbOut; ++pos)
    {
        std::set<DataType> accepted;
        for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kINT32, DataType::kINT64,
                 DataType::kINT8, DataType::kBOOL})
        {
            io[static_cast<size_t>(pos)].desc.type = t;
            if (buildOf(plugin)->supportsFormatCombination(pos, io.data(), nbIn, nbOut))
            {
                accepted.insert(t);
            }
        }
        DataType const want = d.dynamic[static_cast<size_t>(pos)].desc.type;
        io[static_cast<size_t>(pos)].desc.type = want;
        if (free.count(pos) != 0)
        {
            CHECK(accepted == ioTypes);
        }
        else
        {
            // e.g. beta only with g's dtype (the contract's gate type G), k/v/o only with q's
            CHECK(accepted.size() == 1 && *accepted.begin() == want);
        }
        io[static_cast<size_t>(pos)].desc.format = TensorFormat::kCHW32;
        CHECK(!buildOf(plugin)->supportsFormatCombination(pos, io.data(), nbIn, nbOut));
        io[static_cast<size_t>(pos)].desc.format = TensorFormat::kLINEAR;
    }
    // beta with another dtype than g, once g is chosen, is refused
    int32_t const beta = inputIndex(c, "beta");
    if (beta < 0 || inputIndex(c, "g") < 0)
    {
        return;
    }
    DataType const g = d.dynamic[static_cast<size_t>(inputIndex(c, "g"))].desc.type;
    io[static_cast<size_t>(beta)].desc.type = g == DataType::kFLOAT ? DataType::kBF16 : DataType::kFLOAT;
    CHECK(!buildOf(plugin)->supportsFormatCombination(beta, io.data(), nbIn, nbOut));
}

void checkSerializedFields(LifecycleCase const& c, IPluginCreatorV3One* creator, PluginFieldCollection const* fc)
{
    PluginFieldCollection const* names = creator->getFieldNames();
    CHECK(fc != nullptr && names != nullptr && fc->nbFields == names->nbFields);
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        PluginField const& f = fc->fields[i];
        CHECK(f.length == 1 && f.data != nullptr
            && (f.type == PluginFieldType::kINT32 || f.type == PluginFieldType::kFLOAT32));
        for (auto const& kv : c.intFields)
        {
            if (kv.first == f.name)
            {
                CHECK(f.type == PluginFieldType::kINT32 && *static_cast<int32_t const*>(f.data) == kv.second);
            }
        }
        for (auto const& kv : c.floatFields)
        {
            if (kv.first == f.name)
            {
                CHECK(f.type == PluginFieldType::kFLOAT32 && *static_cast<float const*>(f.data) == kv.second);
            }
        }
    }
}

// ---------------------------------------------------------------- device side
class Device
{
public:
    Device(LifecycleCase const& c, size_t workspaceBytes)
        : mCase(c)
    {
        CUDA_CHECK(cudaStreamCreateWithFlags(&mStream, cudaStreamNonBlocking));
        for (auto const& t : c.inputs)
        {
            size_t const bytes = static_cast<size_t>(gdn::lifecycle::volume(c.dimsOf(t, Level::kValue)))
                * gdn::lifecycle::elementSize(t.type);
            mHostIn.push_back(gdn::lifecycle::readBytes(c.dir + "/" + t.file));
            CHECK(mHostIn.back().size() == bytes);
            mIn.push_back(alloc(bytes));
            mInBytes.push_back(bytes);
        }
        int32_t const state = inputIndex(c, "state");
        for (size_t o = 0; o < c.outputs.size(); ++o)
        {
            auto const& t = c.outputs[o];
            size_t const bytes = static_cast<size_t>(gdn::lifecycle::volume(c.dimsOf(t, Level::kValue)))
                * gdn::lifecycle::elementSize(t.type);
            bool const aliased = c.aliasState && static_cast<int32_t>(o) == poolOutput(c) && state >= 0;
            // TensorRT with the aliased-I/O preview feature binds the pool output to input 'state' (getAliasedInput)
            mOut.push_back(aliased ? mIn[static_cast<size_t>(state)] : alloc(bytes));
            mOutAliased.push_back(aliased);
            mOutBytes.push_back(bytes);
            std::vector<char> raw = gdn::lifecycle::readBytes(c.dir + "/" + t.file);
            std::vector<double> want(raw.size() / sizeof(double));
            std::memcpy(want.data(), raw.data(), want.size() * sizeof(double));
            CHECK(want.size() * gdn::lifecycle::elementSize(t.type) == bytes);
            mWant.push_back(want);
        }
        mWorkspaceBytes = workspaceBytes;
        mWorkspace = workspaceBytes > 0 ? alloc(workspaceBytes) : nullptr;
    }
    ~Device()
    {
        for (void* p : mOwned)
        {
            cudaFree(p);
        }
        if (mStream != nullptr)
        {
            cudaStreamDestroy(mStream);
        }
    }

    //! Inputs restored (the aliased pool is updated in place), outputs and workspace poisoned with NaN bytes.
    void reset()
    {
        for (size_t i = 0; i < mIn.size(); ++i)
        {
            CUDA_CHECK(cudaMemcpy(mIn[i], mHostIn[i].data(), mInBytes[i], cudaMemcpyHostToDevice));
        }
        for (size_t o = 0; o < mOut.size(); ++o)
        {
            if (!mOutAliased[o])
            {
                CUDA_CHECK(cudaMemset(mOut[o], 0xFF, mOutBytes[o]));
            }
        }
        if (mWorkspace != nullptr)
        {
            CUDA_CHECK(cudaMemset(mWorkspace, 0xFF, mWorkspaceBytes));
        }
        CUDA_CHECK(cudaDeviceSynchronize());
    }

    int32_t enqueue(IPluginV3* plugin, Descs const& d)
    {
        size_t const nbIn = mCase.inputs.size();
        std::vector<void const*> in(mIn.begin(), mIn.end());
        return runtimeOf(plugin)->enqueue(
            d.actual.data(), d.actual.data() + nbIn, in.data(), mOut.data(), mWorkspace, mStream);
    }

    void runDirect(char const* phase, IPluginV3* plugin, Descs const& d)
    {
        reset();
        CHECK(enqueue(plugin, d) == 0);
        CUDA_CHECK(cudaStreamSynchronize(mStream));
        record(phase);
    }

    void runGraph(char const* phase, IPluginV3* plugin, Descs const& d)
    {
        reset();
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaStreamBeginCapture(mStream, cudaStreamCaptureModeGlobal));
        int32_t const rc = enqueue(plugin, d);
        cudaError_t const end = cudaStreamEndCapture(mStream, &graph);
        CHECK(rc == 0);
        CUDA_CHECK(end);
        if (rc != 0 || end != cudaSuccess || graph == nullptr)
        {
            cudaGetLastError();
            return;
        }
        size_t nodes = 0;
        CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
        CHECK(nodes > 0);
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        reset(); // capture ran nothing; restore and poison again before the launch anyway
        CUDA_CHECK(cudaGraphLaunch(exec, mStream));
        CUDA_CHECK(cudaStreamSynchronize(mStream));
        record(phase);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }

private:
    void* alloc(size_t bytes)
    {
        void* p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
        mOwned.push_back(p);
        return p;
    }

    void record(char const* phase)
    {
        CUDA_CHECK(cudaGetLastError());
        for (size_t o = 0; o < mOut.size(); ++o)
        {
            auto const& t = mCase.outputs[o];
            std::vector<char> host(mOutBytes[o]);
            CUDA_CHECK(cudaMemcpy(host.data(), mOut[o], host.size(), cudaMemcpyDeviceToHost));
            gdn::lifecycle::writeBytes(
                mCase.dir + "/got_" + phase + "_" + t.name + ".bin", host.data(), host.size());
            double const err = gdn::lifecycle::relativeError(host.data(), t.type, mWant[o]);
            auto tol = mCase.tolerance.find(t.name);
            bool const ok = !std::isnan(err) && (tol == mCase.tolerance.end() || err <= tol->second);
            std::printf("  %-8s %-12s rel err %.3e%s%s\n", phase, t.name.c_str(), err,
                tol == mCase.tolerance.end() ? "" : (" (tolerance " + std::to_string(tol->second) + ")").c_str(),
                std::isnan(err) ? "  UNWRITTEN ELEMENTS (NaN)" : (ok ? "" : "  ABOVE TOLERANCE"));
            CHECK(ok);
        }
    }

    LifecycleCase const& mCase;
    cudaStream_t mStream = nullptr;
    std::vector<std::vector<char>> mHostIn;
    std::vector<void*> mIn, mOut, mOwned;
    std::vector<size_t> mInBytes, mOutBytes;
    std::vector<bool> mOutAliased;
    std::vector<std::vector<double>> mWant;
    void* mWorkspace = nullptr;
    size_t mWorkspaceBytes = 0;
};

// ---------------------------------------------------------------- one case
void runCase(std::string const& dir, bool hostOnly)
{
    LifecycleCase const c = gdn::lifecycle::readCase(dir);
    std::printf("case %s (%s)\n", dir.c_str(), c.op.c_str());
    IPluginCreatorV3One* creator = findCreator(c.op);
    CHECK(creator != nullptr);
    if (creator == nullptr)
    {
        return;
    }
    int32_t const errorsBefore = gdn::plugin::reportedErrorCount();
    size_t const loggedBefore = gFinder.logger.errors.size();

    // Fields as the ONNX parser builds them: the node's attributes named by getFieldNames (absent: the default),
    // ints kINT32 and floats kFLOAT32 of length 1; plus a field the plugin does not know, to be ignored.
    std::vector<PluginField> fields;
    for (auto const& kv : c.intFields)
        fields.emplace_back(kv.first.c_str(), &kv.second, PluginFieldType::kINT32, 1);
    for (auto const& kv : c.floatFields)
        fields.emplace_back(kv.first.c_str(), &kv.second, PluginFieldType::kFLOAT32, 1);
    int32_t const unknownValue = 1;
    fields.emplace_back("gdn_lifecycle_unknown_field", &unknownValue, PluginFieldType::kINT32, 1);
    PluginFieldCollection const fc{static_cast<int32_t>(fields.size()), fields.data()};
    std::unique_ptr<IPluginV3> plugin(creator->createPlugin("lifecycle", &fc, TensorRTPhase::kBUILD));
    CHECK(plugin != nullptr);
    if (!plugin)
    {
        return;
    }
    CHECK(gFinder.logger.lastWarningHas("ignoring unknown plugin field 'gdn_lifecycle_unknown_field'"));
    CHECK(coreOf(plugin.get()) != nullptr && buildOf(plugin.get()) != nullptr && runtimeOf(plugin.get()) != nullptr);
    CHECK(c.op == coreOf(plugin.get())->getPluginName()
        && std::strcmp(coreOf(plugin.get())->getPluginNamespace(), gdn::spec::kPluginNamespace) == 0
        && std::strcmp(coreOf(plugin.get())->getPluginVersion(), gdn::spec::kPluginVersion) == 0);

    int32_t const nbIn = static_cast<int32_t>(c.inputs.size());
    int32_t const nbOut = static_cast<int32_t>(c.outputs.size());
    CHECK(buildOf(plugin.get())->getNbOutputs() == nbOut);
    std::vector<DataType> inTypes, outTypes(c.outputs.size(), DataType::kINT8);
    for (auto const& t : c.inputs)
        inTypes.push_back(t.type);
    CHECK(buildOf(plugin.get())->getOutputDataTypes(outTypes.data(), nbOut, inTypes.data(), nbIn) == 0);
    for (size_t o = 0; o < c.outputs.size(); ++o)
        CHECK(outTypes[o] == c.outputs[o].type);

    checkShapes(c, plugin.get());
    Descs const d = makeDescs(c);
    checkFormats(c, plugin.get(), d);

#if GDN_TRT_HAS_BUILD_V2
    auto* b2 = static_cast<IPluginV3OneBuildV2*>(buildOf(plugin.get()));
    for (int32_t o = 0; o < static_cast<int32_t>(c.outputs.size()); ++o)
    {
        CHECK(b2->getAliasedInput(o) == (o == poolOutput(c) ? inputIndex(c, "state") : -1));
    }
#endif
    CHECK(buildOf(plugin.get())
              ->configurePlugin(d.dynamic.data(), nbIn, d.dynamic.data() + nbIn, nbOut)
        == 0);
    size_t const workspace
        = buildOf(plugin.get())->getWorkspaceSize(d.dynamic.data(), nbIn, d.dynamic.data() + nbIn, nbOut);
    std::printf("  workspace at the profile's max shapes: %zu bytes\n", workspace);

    // The engine's copy: cloned, configured again, then timed by the builder (onShapeChange + enqueue).
    std::unique_ptr<IPluginV3> built(plugin->clone());
    CHECK(built != nullptr);
    if (!built)
    {
        return;
    }
    CHECK(buildOf(built.get())->configurePlugin(d.dynamic.data(), nbIn, d.dynamic.data() + nbIn, nbOut) == 0);
    CHECK(runtimeOf(built.get())->onShapeChange(d.actual.data(), nbIn, d.actual.data() + nbIn, nbOut) == 0);

    // Serialized into the engine, re-created at deserialization, attached to an execution context.
    FieldCopy const serialized(runtimeOf(built.get())->getFieldsToSerialize());
    checkSerializedFields(c, creator, serialized.get());
    std::unique_ptr<IPluginV3> runtime(creator->createPlugin("lifecycle", serialized.get(), TensorRTPhase::kRUNTIME));
    CHECK(runtime != nullptr);
    if (!runtime)
    {
        return;
    }
    gdn::testing::CaptureRecorder recorder;
    gdn::testing::FakeResourceContext context;
    context.recorder = &recorder;
    std::unique_ptr<IPluginV3> attached(runtimeOf(runtime.get())->attachToContext(&context));
    CHECK(attached != nullptr && attached.get() != runtime.get());
    if (!attached)
    {
        return;
    }
    CHECK(runtimeOf(attached.get())->onShapeChange(d.actual.data(), nbIn, d.actual.data() + nbIn, nbOut) == 0);

    if (!hostOnly)
    {
        Device dev(c, workspace);
        dev.runDirect("build", built.get(), d);
        dev.runDirect("runtime", attached.get(), d);
        dev.runGraph("graph", attached.get(), d);
    }
    CHECK(recorder.getNbErrors() == 0);
    CHECK(gdn::plugin::reportedErrorCount() == errorsBefore);
    CHECK(gFinder.logger.errors.size() == loggedBefore);
    for (size_t i = loggedBefore; i < gFinder.logger.errors.size(); ++i)
    {
        std::printf("  plugin error: %s\n", gFinder.logger.errors[i].c_str());
    }
}
} // namespace

int main(int argc, char** argv)
{
    bool hostOnly = false;
    std::vector<std::string> dirs;
    for (int i = 1; i < argc; ++i)
    {
        std::string const a = argv[i];
        if (a == "--host-only")
            hostOnly = true;
        else
            dirs.push_back(a);
    }
    if (dirs.empty())
    {
        std::printf("usage: %s [--host-only] CASE_DIR...\n", argv[0]);
        return 2;
    }
    setLoggerFinder(&gFinder); // as IPluginRegistry::loadLibrary does
    if (!hostOnly)
    {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
        {
            std::printf("no CUDA device: run with --host-only\n");
            return 2;
        }
        cudaDeviceProp prop{};
        cudaGetDeviceProperties(&prop, 0);
        std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    }
    for (auto const& dir : dirs)
    {
        try
        {
            runCase(dir, hostOnly);
        }
        catch (std::exception const& e)
        {
            std::printf("FAILED %s: %s\n", dir.c_str(), e.what());
            ++gCounter.failures;
        }
    }
    std::printf("gdn_plugin_lifecycle%s: %zu cases, %d checks, %d failed\n", hostOnly ? " --host-only" : "",
        dirs.size(), gCounter.checks, gCounter.failures);
    return gCounter.failures == 0 ? 0 : 1;
}
