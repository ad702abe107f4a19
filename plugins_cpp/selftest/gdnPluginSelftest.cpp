// Host-only selftest of the gdn TensorRT plugins: exercises the creators and plugin objects the way
// TensorRT's builder would, without a GPU or the TensorRT runtime (only the headers are needed): names, fields,
// output types and shapes, the supportsFormatCombination truth table, configure/onShapeChange errors, error
// reporting. The GPU side of the lifecycle (enqueue vs the float64 reference) is gdn_plugin_lifecycle.
// Exit code 0 when every check passes; prints one line per failed check.
#include "gdnDecodePlugin/gdnDecodePlugin.h"
#include "gdnPrefillPlugin/gdnPrefillPlugin.h"
#include "testing/gdnTestDoubles.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace nvinfer1;
using gdn::plugin::reportedErrorCount;

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
extern "C" void setLoggerFinder(ILoggerFinder* finder);

namespace
{
using gdn::testing::CaptureFinder;
using gdn::testing::CaptureRecorder;
using gdn::testing::FakeResourceContext;
using FakeBuilder = gdn::testing::SymbolicExprBuilder;

gdn::testing::CheckCounter gCounter;
#define CHECK(cond) GDN_CHECK(gCounter, cond)

// ---------------------------------------------------------------- helpers
Dims dims(std::initializer_list<int64_t> v)
{
    Dims d{};
    d.nbDims = static_cast<int32_t>(v.size());
    int32_t i = 0;
    for (int64_t x : v)
    {
        d.d[i++] = x;
    }
    return d;
}

struct Tensor
{
    Dims d;
    DataType t;
};

std::vector<DynamicPluginTensorDesc> descs(std::vector<Tensor> const& ts)
{
    std::vector<DynamicPluginTensorDesc> out(ts.size());
    for (size_t i = 0; i < ts.size(); ++i)
    {
        out[i].desc.dims = ts[i].d;
        out[i].desc.type = ts[i].t;
        out[i].desc.format = TensorFormat::kLINEAR;
        out[i].desc.scale = -1.f;
        out[i].min = out[i].opt = out[i].max = ts[i].d;
    }
    return out;
}

std::vector<PluginTensorDesc> plain(std::vector<DynamicPluginTensorDesc> const& d)
{
    std::vector<PluginTensorDesc> out;
    for (auto const& x : d)
    {
        out.push_back(x.desc);
    }
    return out;
}

PluginField const* findField(PluginFieldCollection const* fc, char const* name)
{
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        if (std::strcmp(fc->fields[i].name, name) == 0)
        {
            return &fc->fields[i];
        }
    }
    return nullptr;
}

int32_t intField(PluginFieldCollection const* fc, char const* name)
{
    PluginField const* f = findField(fc, name);
    return (f && f->type == PluginFieldType::kINT32 && f->data) ? *static_cast<int32_t const*>(f->data) : -999;
}

float floatField(PluginFieldCollection const* fc, char const* name)
{
    PluginField const* f = findField(fc, name);
    return (f && f->type == PluginFieldType::kFLOAT32 && f->data) ? *static_cast<float const*>(f->data) : -999.f;
}

IPluginV3OneRuntime* runtimeOf(IPluginV3* p)
{
    return static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
}

IPluginV3OneBuild* buildOf(IPluginV3* p)
{
    return static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
}

IPluginV3OneCore* coreOf(IPluginV3* p)
{
    return static_cast<IPluginV3OneCore*>(p->getCapabilityInterface(PluginCapabilityType::kCORE));
}

// A valid prefill problem: T=10 tokens, N=2 sequences, Hk=2, Hv=4, K=V=128.
std::vector<Tensor> prefillTensors(DataType io, DataType gate, bool raw, int64_t Hv = 4)
{
    std::vector<Tensor> t = {{dims({10, 2, 128}), io}, {dims({10, 2, 128}), io}, {dims({10, Hv, 128}), io},
        {dims({10, Hv}), gate}, {dims({10, Hv}), gate}, {dims({3}), DataType::kINT32},
        {dims({2, Hv, 128, 128}), DataType::kFLOAT}};
    if (raw)
    {
        t.push_back({dims({Hv}), DataType::kFLOAT});
        t.push_back({dims({Hv}), DataType::kFLOAT});
    }
    t.push_back({dims({10, Hv, 128}), io});            // o
    t.push_back({dims({2, Hv, 128, 128}), DataType::kFLOAT}); // final_state
    return t;
}

// A valid decode problem: B=3, Hk=2, Hv=4, K=V=64; pool of 8 rows in state_mode 1.
std::vector<Tensor> decodeTensors(DataType io, DataType gate, bool raw, bool pool)
{
    int64_t const S = pool ? 8 : 3;
    std::vector<Tensor> t = {{dims({3, 2, 64}), io}, {dims({3, 2, 64}), io}, {dims({3, 4, 64}), io},
        {dims({3, 4}), gate}, {dims({3, 4}), gate}, {dims({S, 4, 64, 64}), DataType::kFLOAT}};
    if (pool)
    {
        t.push_back({dims({3}), DataType::kINT32});
    }
    if (raw)
    {
        t.push_back({dims({4}), DataType::kFLOAT});
        t.push_back({dims({4}), DataType::kFLOAT});
    }
    t.push_back({dims({3, 4, 64}), io});
    t.push_back({dims({S, 4, 64, 64}), DataType::kFLOAT});
    return t;
}

IPluginV3* make(IPluginCreatorV3One* c, std::vector<PluginField> const& fields)
{
    PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.empty() ? nullptr : fields.data()};
    return c->createPlugin("selftest", &fc, TensorRTPhase::kBUILD);
}

// Every position of a valid combination is accepted; returns the number of rejected positions.
int rejectedPositions(IPluginV3* p, std::vector<Tensor> const& t, int32_t nbInputs)
{
    auto d = descs(t);
    int rejected = 0;
    for (int32_t pos = 0; pos < static_cast<int32_t>(d.size()); ++pos)
    {
        rejected += buildOf(p)->supportsFormatCombination(pos, d.data(), nbInputs, 2) ? 0 : 1;
    }
    return rejected;
}

bool accepts(IPluginV3* p, std::vector<Tensor> t, int32_t nbInputs, int32_t pos, DataType type,
    TensorFormat format = TensorFormat::kLINEAR)
{
    t[pos].t = type;
    auto d = descs(t);
    d[pos].desc.format = format;
    return buildOf(p)->supportsFormatCombination(pos, d.data(), nbInputs, 2);
}
} // namespace

int main()
{
    CaptureFinder finder;
    setLoggerFinder(&finder);

    // ------------------------------------------------------------ creators
    int32_t nb = 0;
    IPluginCreatorInterface* const* list = getCreators(nb);
    CHECK(nb == 4 && list != nullptr);
    if (nb != 4 || list == nullptr)
    {
        return 1;
    }
    IPluginCreatorV3One* pc = nullptr;
    IPluginCreatorV3One* dc = nullptr;
    IPluginCreatorV3One* vc = nullptr;
    IPluginCreatorV3One* cc = nullptr;
    for (int32_t i = 0; i < nb; ++i)
    {
        CHECK(std::strcmp(list[i]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0);
        auto* c = static_cast<IPluginCreatorV3One*>(list[i]);
        CHECK(std::strcmp(c->getPluginNamespace(), gdn::spec::kPluginNamespace) == 0);
        CHECK(std::strcmp(c->getPluginVersion(), gdn::spec::kPluginVersion) == 0);
        std::string const name = c->getPluginName();
        (name == gdn::spec::kGatedDeltaPrefillName        ? pc
                : name == gdn::spec::kGatedDeltaDecodeName ? dc
                : name == gdn::spec::kGatedDeltaVerifyName ? vc
                                                           : cc)
            = c;
    }
    CHECK(pc != nullptr && dc != nullptr && vc != nullptr && cc != nullptr
        && std::strcmp(cc->getPluginName(), gdn::spec::kGatedDeltaCommitName) == 0);
    if (pc == nullptr || dc == nullptr || vc == nullptr || cc == nullptr)
    {
        return 1;
    }
    // verify: the decode fields (state_mode included); commit: state_mode only
    CHECK(vc->getFieldNames()->nbFields == 5 && findField(vc->getFieldNames(), "state_mode") != nullptr);
    CHECK(cc->getFieldNames()->nbFields == 1 && findField(cc->getFieldNames(), "state_mode") != nullptr);
    CHECK(std::strcmp(gdn::spec::kPluginNamespace, "gdn") == 0 && std::strcmp(gdn::spec::kPluginVersion, "1") == 0);

    PluginFieldCollection const* pn = pc->getFieldNames();
    PluginFieldCollection const* dn = dc->getFieldNames();
    CHECK(pn->nbFields == 4 && dn->nbFields == 5);
    CHECK(findField(pn, "gate_mode") && findField(pn, "use_qk_l2norm") && findField(pn, "scale")
        && findField(pn, "l2norm_eps") && !findField(pn, "state_mode"));
    CHECK(findField(dn, "state_mode") && findField(dn, "state_mode")->type == PluginFieldType::kINT32);
    CHECK(findField(pn, "scale")->type == PluginFieldType::kFLOAT32
        && findField(pn, "gate_mode")->type == PluginFieldType::kINT32);

    // ------------------------------------------------------------ defaults and explicit fields
    IPluginV3* pDefault = pc->createPlugin("p0", nullptr, TensorRTPhase::kBUILD);
    CHECK(pDefault != nullptr);
    PluginFieldCollection const* sf = runtimeOf(pDefault)->getFieldsToSerialize();
    CHECK(sf->nbFields == 4 && intField(sf, "gate_mode") == 0 && intField(sf, "use_qk_l2norm") == 0);
    CHECK(floatField(sf, "scale") == 0.f && floatField(sf, "l2norm_eps") == 1e-6f);
    CHECK(std::strcmp(coreOf(pDefault)->getPluginName(), "GatedDeltaPrefill") == 0);
    CHECK(std::strcmp(coreOf(pDefault)->getPluginNamespace(), "gdn") == 0);
    CHECK(buildOf(pDefault)->getNbOutputs() == 2);

    int32_t const one = 1;
    float const scale = 0.125f;
    double const eps64 = 1e-5;
    int64_t const pool64 = 1;
    IPluginV3* pRaw = make(pc,
        {{"gate_mode", &one, PluginFieldType::kINT32, 1}, {"use_qk_l2norm", &one, PluginFieldType::kINT32, 1},
            {"scale", &scale, PluginFieldType::kFLOAT32, 1}, {"l2norm_eps", &eps64, PluginFieldType::kFLOAT64, 1}});
    CHECK(pRaw != nullptr);
    IPluginV3* dPool = make(dc, {{"state_mode", &pool64, PluginFieldType::kINT64, 1}});
    IPluginV3* dRawPool = make(dc, {{"state_mode", &one, PluginFieldType::kINT32, 1}, {"gate_mode", &one, PluginFieldType::kINT32, 1}});
    IPluginV3* dDense = make(dc, {});
    CHECK(dPool != nullptr && dRawPool != nullptr && dDense != nullptr);

    // serialize -> clone -> runtime re-creation round trip
    IPluginV3* pClone = pRaw->clone();
    CHECK(pClone != nullptr);
    PluginFieldCollection const* cf = runtimeOf(pClone)->getFieldsToSerialize();
    CHECK(intField(cf, "gate_mode") == 1 && intField(cf, "use_qk_l2norm") == 1);
    CHECK(floatField(cf, "scale") == 0.125f && floatField(cf, "l2norm_eps") == 1e-5f);
    IPluginV3* pRuntime = pc->createPlugin("rt", cf, TensorRTPhase::kRUNTIME);
    CHECK(pRuntime != nullptr);
    CHECK(pRuntime && intField(runtimeOf(pRuntime)->getFieldsToSerialize(), "gate_mode") == 1);
    IPluginV3* dRuntime = dc->createPlugin("rt", runtimeOf(dRawPool)->getFieldsToSerialize(), TensorRTPhase::kRUNTIME);
    CHECK(dRuntime && intField(runtimeOf(dRuntime)->getFieldsToSerialize(), "state_mode") == 1
        && intField(runtimeOf(dRuntime)->getFieldsToSerialize(), "gate_mode") == 1);
    IPluginV3* attached = runtimeOf(pRaw)->attachToContext(nullptr);
    CHECK(attached != nullptr && floatField(runtimeOf(attached)->getFieldsToSerialize(), "scale") == 0.125f);

    // ------------------------------------------------------------ output types
    DataType in9[9] = {DataType::kHALF, DataType::kHALF, DataType::kHALF, DataType::kFLOAT, DataType::kFLOAT,
        DataType::kINT32, DataType::kFLOAT, DataType::kFLOAT, DataType::kFLOAT};
    DataType outT[2] = {DataType::kINT32, DataType::kINT32};
    CHECK(buildOf(pRaw)->getOutputDataTypes(outT, 2, in9, 9) == 0);
    CHECK(outT[0] == DataType::kHALF && outT[1] == DataType::kFLOAT);
    int const errorsBefore = reportedErrorCount();
    CHECK(buildOf(pRaw)->getOutputDataTypes(outT, 2, in9, 7) != 0); // gate_mode 1 needs 9 inputs
    CHECK(reportedErrorCount() == errorsBefore + 1);

    // ------------------------------------------------------------ supportsFormatCombination truth table
    for (DataType io : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
    {
        for (DataType gate : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
        {
            CHECK(rejectedPositions(pDefault, prefillTensors(io, gate, false), 7) == 0);
            CHECK(rejectedPositions(pRaw, prefillTensors(io, gate, true), 9) == 0);
            CHECK(rejectedPositions(dDense, decodeTensors(io, gate, false, false), 6) == 0);
            CHECK(rejectedPositions(dRawPool, decodeTensors(io, gate, true, true), 9) == 0);
        }
    }
    auto pt = prefillTensors(DataType::kHALF, DataType::kFLOAT, false);
    CHECK(!accepts(pDefault, pt, 7, 0, DataType::kINT32));                    // q int32
    CHECK(!accepts(pDefault, pt, 7, 0, DataType::kHALF, TensorFormat::kHWC8)); // non-linear format
    CHECK(!accepts(pDefault, pt, 7, 1, DataType::kFLOAT));                    // k differs from q
    CHECK(!accepts(pDefault, pt, 7, 2, DataType::kBF16));                     // v differs from q
    CHECK(!accepts(pDefault, pt, 7, 4, DataType::kHALF));                     // beta differs from g
    CHECK(!accepts(pDefault, pt, 7, 5, DataType::kINT64));                    // cu_seqlens int64
    CHECK(!accepts(pDefault, pt, 7, 6, DataType::kHALF));                     // initial_state fp16
    CHECK(!accepts(pDefault, pt, 7, 7, DataType::kFLOAT));                    // o differs from q
    CHECK(!accepts(pDefault, pt, 7, 8, DataType::kHALF));                     // final_state fp16
    CHECK(!accepts(pDefault, pt, 9, 0, DataType::kHALF));                     // wrong input count
    auto dt = decodeTensors(DataType::kBF16, DataType::kBF16, true, true);
    CHECK(!accepts(dRawPool, dt, 9, 6, DataType::kFLOAT)); // slots must be int32
    CHECK(!accepts(dRawPool, dt, 9, 7, DataType::kHALF));  // A_log fp32
    CHECK(!accepts(dRawPool, dt, 9, 5, DataType::kBF16));  // state fp32
    CHECK(!accepts(dRawPool, dt, 9, 10, DataType::kHALF)); // new_state fp32

    // ------------------------------------------------------------ output shapes (fake expression builder)
    {
        FakeBuilder eb;
        auto t = prefillTensors(DataType::kFLOAT, DataType::kFLOAT, false);
        std::vector<DimsExprs> in;
        for (int i = 0; i < 7; ++i)
        {
            in.push_back(eb.constants(t[i].d));
        }
        DimsExprs out[2]{};
        CHECK(buildOf(pDefault)->getOutputShapes(in.data(), 7, nullptr, 0, out, 2, eb) == 0);
        CHECK(out[0].nbDims == 3 && out[0].d[0]->getConstantValue() == 10 && out[0].d[1]->getConstantValue() == 4
            && out[0].d[2]->getConstantValue() == 128);
        CHECK(out[1].nbDims == 4 && out[1].d[0]->getConstantValue() == 2 && out[1].d[1]->getConstantValue() == 4
            && out[1].d[2]->getConstantValue() == 128 && out[1].d[3]->getConstantValue() == 128);
        CHECK(buildOf(pRaw)->getOutputShapes(in.data(), 7, nullptr, 0, out, 2, eb) != 0); // needs 9 inputs

        auto u = decodeTensors(DataType::kFLOAT, DataType::kFLOAT, false, true);
        std::vector<DimsExprs> din;
        for (int i = 0; i < 7; ++i)
        {
            din.push_back(eb.constants(u[i].d));
        }
        CHECK(buildOf(dPool)->getOutputShapes(din.data(), 7, nullptr, 0, out, 2, eb) == 0);
        CHECK(out[0].nbDims == 3 && out[0].d[0]->getConstantValue() == 3 && out[0].d[2]->getConstantValue() == 64);
        CHECK(out[1].nbDims == 4 && out[1].d[0]->getConstantValue() == 8 && out[1].d[3]->getConstantValue() == 64);
    }

    // ------------------------------------------------------------ aliasing (decode pool)
#if GDN_TRT_HAS_BUILD_V2
    {
        auto* b2 = static_cast<IPluginV3OneBuildV2*>(buildOf(dPool));
        CHECK(std::string(b2->getInterfaceInfo().kind) == "PLUGIN_V3ONE_BUILD" && b2->getInterfaceInfo().major == 2);
        CHECK(b2->getAliasedInput(1) == 5 && b2->getAliasedInput(0) == -1);
        CHECK(static_cast<IPluginV3OneBuildV2*>(buildOf(dDense))->getAliasedInput(1) == -1);
        CHECK(static_cast<IPluginV3OneBuildV2*>(buildOf(pDefault))->getAliasedInput(1) == -1);
    }
#endif

    // ------------------------------------------------------------ configure / onShapeChange
    {
        auto good = descs(prefillTensors(DataType::kHALF, DataType::kFLOAT, false));
        int const rc = buildOf(pDefault)->configurePlugin(good.data(), 7, good.data() + 7, 2);
        if (rc != 0)
        {
            std::printf("note: configurePlugin rejected a valid problem: %s\n",
                finder.logger.errors.empty() ? "?" : finder.logger.errors.back().c_str());
        }
        CHECK(rc == 0);
        auto wild = good;
        wild[0].desc.dims.d[0] = -1; // dynamic T at build time
        wild[5].desc.dims.d[0] = -1;
        CHECK(buildOf(pDefault)->configurePlugin(wild.data(), 7, wild.data() + 7, 2) == 0);
        CHECK(runtimeOf(pDefault)->onShapeChange(plain(good).data(), 7, plain(good).data() + 7, 2) == 0);

        auto gva = descs(prefillTensors(DataType::kHALF, DataType::kFLOAT, false, 3)); // Hv=3, Hk=2
        int e0 = reportedErrorCount();
        CHECK(buildOf(pDefault)->configurePlugin(gva.data(), 7, gva.data() + 7, 2) != 0);
        CHECK(reportedErrorCount() == e0 + 1 && finder.logger.lastErrorHas("not a multiple of Hk=2"));
        CHECK(runtimeOf(pDefault)->onShapeChange(plain(gva).data(), 7, plain(gva).data() + 7, 2) != 0);

        auto badState = good;
        badState[6].desc.dims.d[0] = 5; // N from cu_seqlens is 2
        CHECK(runtimeOf(pDefault)->onShapeChange(plain(badState).data(), 7, plain(badState).data() + 7, 2) != 0);
        CHECK(finder.logger.lastErrorHas("initial_state: dimension 0 (N) is 5, expected 2"));

        auto dgood = descs(decodeTensors(DataType::kBF16, DataType::kFLOAT, false, true));
        CHECK(buildOf(dPool)->configurePlugin(dgood.data(), 7, dgood.data() + 7, 2) == 0);
        auto dbad = descs(decodeTensors(DataType::kBF16, DataType::kFLOAT, false, false));
        dbad[5].desc.dims.d[0] = 7; // dense state needs one row per sequence
        CHECK(buildOf(dDense)->configurePlugin(dbad.data(), 6, dbad.data() + 6, 2) != 0);
        CHECK(finder.logger.lastErrorHas("state: dimension 0"));
        CHECK(buildOf(dDense)->configurePlugin(dgood.data(), 7, dgood.data() + 7, 2) != 0); // 7 inputs, dense wants 6

        std::vector<DynamicPluginTensorDesc> pmax = good;
        size_t const ws = buildOf(pDefault)->getWorkspaceSize(pmax.data(), 7, pmax.data() + 7, 2);
        gdn::GdnPrefillParams p;
        p.T = 10;
        p.N = 2;
        p.Hk = 2;
        p.Hv = 4;
        p.K = 128;
        p.V = 128;
        p.ioType = gdn::DType::kFloat16;
        p.gateType = gdn::DType::kFloat32;
        CHECK(ws == gdn::gdnPrefillWorkspaceSize(p));
        CHECK(buildOf(dDense)->getWorkspaceSize(dgood.data(), 6, dgood.data() + 6, 2) == 0);
    }

    // ------------------------------------------------------------ bad fields give errors, not crashes
    {
        int32_t const seven = 7;
        float const negative = -1.f;
        char const text[] = "1";
        int e0 = reportedErrorCount();
        CHECK(make(pc, {{"gate_mode", &seven, PluginFieldType::kINT32, 1}}) == nullptr);
        CHECK(finder.logger.lastErrorHas("gate_mode: must be 0 or 1, got 7"));
        CHECK(make(dc, {{"state_mode", &seven, PluginFieldType::kINT32, 1}}) == nullptr);
        // Unknown fields are ignored with a warning naming them (prefill has no state_mode); known ones still apply.
        IPluginV3* ignored = make(pc, {{"state_mode", &one, PluginFieldType::kINT32, 1}, {"bogus", text,
            PluginFieldType::kCHAR, 1}, {"gate_mode", &one, PluginFieldType::kINT32, 1}});
        CHECK(ignored != nullptr && intField(runtimeOf(ignored)->getFieldsToSerialize(), "gate_mode") == 1);
        CHECK(finder.logger.lastWarningHas("GatedDeltaPrefill: ignoring unknown plugin field 'bogus'"));
        CHECK(finder.logger.warnings.size() >= 2
            && finder.logger.warnings[finder.logger.warnings.size() - 2].find("unknown plugin field 'state_mode'")
                != std::string::npos);
        delete ignored;
        CHECK(make(pc, {{"gate_mode", text, PluginFieldType::kCHAR, 1}}) == nullptr);
        CHECK(make(pc, {{"l2norm_eps", &negative, PluginFieldType::kFLOAT32, 1}}) == nullptr);
        CHECK(make(pc, {{"scale", &scale, PluginFieldType::kFLOAT32, 0}}) == nullptr);
        CHECK(make(pc, {{"use_qk_l2norm", &scale, PluginFieldType::kFLOAT32, 1}}) == nullptr); // 0.125 not an int
        CHECK(make(pc, {{nullptr, &one, PluginFieldType::kINT32, 1}}) == nullptr);
        CHECK(reportedErrorCount() == e0 + 7);
    }

    // ------------------------------------------------------------ shared plugin machinery, per plugin
    {
        // The three capability interfaces are distinct sub-objects of the right kind, for both plugins.
        for (IPluginV3* p : {pDefault, dPool})
        {
            CHECK(std::string(coreOf(p)->getInterfaceInfo().kind) == "PLUGIN_V3ONE_CORE");
            CHECK(std::string(buildOf(p)->getInterfaceInfo().kind) == "PLUGIN_V3ONE_BUILD");
            CHECK(std::string(runtimeOf(p)->getInterfaceInfo().kind) == "PLUGIN_V3ONE_RUNTIME");
        }
        CHECK(std::strcmp(coreOf(dPool)->getPluginName(), "GatedDeltaDecode") == 0
            && std::strcmp(coreOf(dPool)->getPluginVersion(), "1") == 0
            && std::strcmp(coreOf(dPool)->getPluginNamespace(), "gdn") == 0);

        // attachToContext takes the context's error recorder; clone keeps it; errors name the op and method.
        CaptureRecorder recorder;
        FakeResourceContext ctx;
        ctx.recorder = &recorder;
        IPluginV3* dCtx = runtimeOf(dRawPool)->attachToContext(&ctx);
        CHECK(dCtx != nullptr && std::strcmp(coreOf(dCtx)->getPluginName(), "GatedDeltaDecode") == 0);
        CHECK(intField(runtimeOf(dCtx)->getFieldsToSerialize(), "state_mode") == 1);
        DataType outD[2] = {DataType::kINT32, DataType::kINT32};
        CHECK(buildOf(dCtx)->getOutputDataTypes(outD, 2, in9, 7) != 0); // gate_mode 1 + pool needs 9 inputs
        CHECK(recorder.getNbErrors() == 1
            && recorder.lastHas("GatedDeltaDecode::getOutputDataTypes: expected 9 inputs and 2 outputs, got 7"));
        IPluginV3* dCtxClone = dCtx->clone();
        CHECK(dCtxClone != nullptr);
        CHECK(buildOf(dCtxClone)->getOutputDataTypes(outD, 2, in9, 6) != 0);
        CHECK(recorder.getNbErrors() == 2 && recorder.lastHas("GatedDeltaDecode::getOutputDataTypes"));
#if GDN_TRT_HAS_BUILD_V2
        CHECK(static_cast<IPluginV3OneBuildV2*>(buildOf(dCtxClone))->getAliasedInput(1) == 5);
#endif
        CHECK(runtimeOf(pDefault)->getFieldsToSerialize()->nbFields == 4);
        delete dCtxClone;
        delete dCtx;

        // enqueue returns an error code (never throws) and names the plugin and method.
        int e0 = reportedErrorCount();
        auto pg = plain(descs(prefillTensors(DataType::kHALF, DataType::kFLOAT, false)));
        CHECK(runtimeOf(pDefault)->enqueue(pg.data(), pg.data() + 7, nullptr, nullptr, nullptr, nullptr) != 0);
        CHECK(reportedErrorCount() == e0 + 1
            && finder.logger.lastErrorHas("GatedDeltaPrefill::enqueue: null descriptors or pointers"));
        std::vector<void const*> nullIn(9, nullptr);
        std::vector<void*> nullOut(2, nullptr);
        CHECK(runtimeOf(pDefault)->enqueue(pg.data(), pg.data() + 7, nullIn.data(), nullOut.data(), nullptr, nullptr)
            != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaPrefill::enqueue: unsupported by the kernels"));
        auto dg = plain(descs(decodeTensors(DataType::kFLOAT, DataType::kFLOAT, false, false)));
        CHECK(runtimeOf(dDense)->enqueue(dg.data(), dg.data() + 6, nullIn.data(), nullOut.data(), nullptr, nullptr)
            != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaDecode::enqueue: unsupported by the kernels"));
        CHECK(reportedErrorCount() == e0 + 3);

        // method-specific failures carry the op name prefix
        auto pgood = descs(prefillTensors(DataType::kHALF, DataType::kFLOAT, false));
        CHECK(buildOf(pDefault)->getWorkspaceSize(pgood.data(), 9, pgood.data() + 7, 2) == 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaPrefill::getWorkspaceSize: unexpected number of inputs"));
        auto vt = decodeTensors(DataType::kFLOAT, DataType::kFLOAT, false, false);
        vt[2].d.d[2] = 32; // V=32: the shapes agree, the kernels do not support it
        vt[5].d.d[3] = 32;
        vt[6].d.d[2] = 32;
        vt[7].d.d[3] = 32;
        auto dwrong = descs(vt);
        CHECK(buildOf(dDense)->configurePlugin(dwrong.data(), 6, dwrong.data() + 6, 2) != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaDecode::configurePlugin: unsupported by the kernels"));
        CHECK(runtimeOf(dDense)->onShapeChange(plain(dwrong).data(), 6, plain(dwrong).data() + 6, 2) != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaDecode::onShapeChange: unsupported by the kernels"));
        CHECK(buildOf(dDense)->configurePlugin(dwrong.data(), 6, dwrong.data() + 6, 1) != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaDecode::configurePlugin: invalid input/output descriptors"));
        int32_t const seven = 7;
        CHECK(make(dc, {{"state_mode", &seven, PluginFieldType::kINT32, 1}}) == nullptr);
        CHECK(finder.logger.lastErrorHas("GatedDeltaDecode createPlugin('selftest'): GatedDeltaDecode: state_mode"));
    }

    // ------------------------------------------------------------ verify and commit (speculative decoding)
    {
        int32_t const poolMode = 1;
        // verify, pool: T=6 tokens of N=2 sequences, Hk=2, Hv=4, K=V=64, pool of 5 rows, slots [2]
        std::vector<Tensor> vt = {{dims({6, 2, 64}), DataType::kBF16}, {dims({6, 2, 64}), DataType::kBF16},
            {dims({6, 4, 64}), DataType::kBF16}, {dims({6, 4}), DataType::kFLOAT}, {dims({6, 4}), DataType::kFLOAT},
            {dims({3}), DataType::kINT32}, {dims({5, 4, 64, 64}), DataType::kFLOAT}, {dims({2}), DataType::kINT32},
            {dims({6, 4, 64}), DataType::kBF16}, {dims({6, 2, 64}), DataType::kFLOAT},
            {dims({6, 4, 64}), DataType::kFLOAT}, {dims({6, 4}), DataType::kFLOAT}};
        IPluginV3* v = make(vc, {{"state_mode", &poolMode, PluginFieldType::kINT32, 1}});
        CHECK(v != nullptr && buildOf(v)->getNbOutputs() == 4);
        auto vd = descs(vt);
        CHECK(buildOf(v)->configurePlugin(vd.data(), 8, vd.data() + 8, 4) == 0);
        DataType in8[8] = {DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kFLOAT, DataType::kFLOAT,
            DataType::kINT32, DataType::kFLOAT, DataType::kINT32};
        DataType out4[4] = {DataType::kINT8, DataType::kINT8, DataType::kINT8, DataType::kINT8};
        CHECK(buildOf(v)->getOutputDataTypes(out4, 4, in8, 8) == 0 && out4[0] == DataType::kBF16
            && out4[1] == DataType::kFLOAT && out4[2] == DataType::kFLOAT && out4[3] == DataType::kFLOAT);
#if GDN_TRT_HAS_BUILD_V2
        for (int32_t o = 0; o < 4; ++o)
        {
            CHECK(static_cast<IPluginV3OneBuildV2*>(buildOf(v))->getAliasedInput(o) == -1); // the state is only read
        }
#endif
        auto vbad = vt;
        vbad[7].d = dims({3}); // slots [3] for N=2
        auto vbd = descs(vbad);
        CHECK(buildOf(v)->configurePlugin(vbd.data(), 8, vbd.data() + 8, 4) != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaVerify::configurePlugin: slots: dimension 0 (N) is 3, expected 2"));
        std::vector<void const*> nullIn(8, nullptr);
        std::vector<void*> nullOut(4, nullptr);
        CHECK(runtimeOf(v)->enqueue(plain(vd).data(), plain(vd).data() + 8, nullIn.data(), nullOut.data(), nullptr,
                  nullptr)
            != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaVerify::enqueue: unsupported by the kernels"));

        // commit, dense: state [2,4,64,64], factors of T=6 tokens, cu_seqlens [3], accepted [2]
        std::vector<Tensor> ct = {{dims({2, 4, 64, 64}), DataType::kFLOAT}, {dims({6, 2, 64}), DataType::kFLOAT},
            {dims({6, 4, 64}), DataType::kFLOAT}, {dims({6, 4}), DataType::kFLOAT}, {dims({3}), DataType::kINT32},
            {dims({2}), DataType::kINT32}, {dims({2, 4, 64, 64}), DataType::kFLOAT}};
        IPluginV3* c = make(cc, {});
        CHECK(c != nullptr && buildOf(c)->getNbOutputs() == 1);
        PluginFieldCollection const* cf = runtimeOf(c)->getFieldsToSerialize();
        CHECK(cf->nbFields == 1 && intField(cf, "state_mode") == 0);
        auto cd = descs(ct);
        CHECK(buildOf(c)->configurePlugin(cd.data(), 6, cd.data() + 6, 1) == 0);
        for (int32_t pos = 0; pos < 7; ++pos)
        {
            bool const index = pos == 4 || pos == 5;
            CHECK(buildOf(c)->supportsFormatCombination(pos, cd.data(), 6, 1));
            auto other = cd;
            other[pos].desc.type = index ? DataType::kFLOAT : DataType::kINT32;
            CHECK(!buildOf(c)->supportsFormatCombination(pos, other.data(), 6, 1));
        }
#if GDN_TRT_HAS_BUILD_V2
        CHECK(static_cast<IPluginV3OneBuildV2*>(buildOf(c))->getAliasedInput(0) == -1); // dense: a new tensor
#endif
        auto cbad = ct;
        cbad[0].d = dims({3, 4, 64, 64});
        cbad[6].d = cbad[0].d;
        auto cbd = descs(cbad);
        CHECK(runtimeOf(c)->onShapeChange(plain(cbd).data(), 6, plain(cbd).data() + 6, 1) != 0);
        CHECK(finder.logger.lastErrorHas("GatedDeltaCommit::onShapeChange: state: dimension 0 (S=N) is 3, expected 2"));
        IPluginV3* cp = make(cc, {{"state_mode", &poolMode, PluginFieldType::kINT32, 1}});
        CHECK(cp != nullptr && intField(runtimeOf(cp)->getFieldsToSerialize(), "state_mode") == 1);
#if GDN_TRT_HAS_BUILD_V2
        CHECK(static_cast<IPluginV3OneBuildV2*>(buildOf(cp))->getAliasedInput(0) == 0); // pool updated in place
#endif
        DataType in6[6] = {DataType::kFLOAT, DataType::kFLOAT, DataType::kFLOAT, DataType::kFLOAT, DataType::kINT32,
            DataType::kINT32};
        DataType out1[1] = {DataType::kINT8};
        CHECK(buildOf(cp)->getOutputDataTypes(out1, 1, in6, 6) != 0); // state_mode 1 needs slots: 7 inputs
        CHECK(finder.logger.lastErrorHas("GatedDeltaCommit::getOutputDataTypes: expected 7 inputs and 1 output"));
        int32_t const two = 2;
        CHECK(make(cc, {{"state_mode", &two, PluginFieldType::kINT32, 1}}) == nullptr);
        CHECK(finder.logger.lastErrorHas("GatedDeltaCommit createPlugin('selftest'): GatedDeltaCommit: state_mode"));
        IPluginV3* cClone = cp->clone();
        CHECK(cClone != nullptr && std::strcmp(coreOf(cClone)->getPluginName(), "GatedDeltaCommit") == 0);
        for (IPluginV3* p : {v, c, cp, cClone})
        {
            delete p;
        }
    }

    for (IPluginV3* p : {pDefault, pRaw, dPool, dRawPool, dDense, pClone, pRuntime, dRuntime, attached})
    {
        delete p;
    }
    std::printf("gdn_plugin_selftest: %d checks, %d failed\n", gCounter.checks, gCounter.failures);
    return gCounter.failures == 0 ? 0 : 1;
}
