// gdn_plugin_loading_test SCENARIO FAKE_NVINFER PLUGIN_LIB AUTOREG_LIB
//
// Loads the gdn plugin libraries the ways TensorRT's tools do, twice in one process, against a fake libnvinfer
// (gdnFakeNvinfer.cpp) whose registry records registerCreator calls, and checks that both gdn creators end up
// registered exactly once. One scenario per process (the registry is process-global):
//   static-twice          trtexec --staticPlugins=AUTOREG twice: dlopen only; TensorRT linked by the executable
//   loadlibrary-twice     trtexec --dynamicPlugins / load_library(PLUGIN): loadLibrary (dlopen + getCreators) twice
//   python-twice          polygraphy --plugins AUTOREG under the tensorrt wheel (libnvinfer loaded RTLD_LOCAL)
//   static-then-loadlibrary, loadlibrary-then-static   both ways in one process, either order
//   no-tensorrt           AUTOREG loaded where no TensorRT is loaded: a clear line, nothing registered, no crash
//   version-mismatch      the loaded TensorRT has another major version: nothing registered, a clear line
// Exit code 0 when every check passes; one line per failed check.
#include "NvInferRuntime.h"
#include "gdnOpSpec.h"
#include "testing/gdnTestDoubles.h"

#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <string>

using namespace nvinfer1;

namespace
{
gdn::testing::CheckCounter gCounter;
#define CHECK(cond) GDN_CHECK(gCounter, cond)

struct Paths
{
    char const* fake;
    char const* plugins;
    char const* autoreg;
};

using GetRegistryFn = IPluginRegistry* (*) ();
using CountsFn = void (*)(int*, int*, int*);
using RegisterFn = int32_t (*)();

struct Fake
{
    void* handle = nullptr;
    IPluginRegistry* registry = nullptr;
    CountsFn counts = nullptr;

    int registerCalls() const
    {
        int r = 0, l = 0, m = 0;
        counts(&r, &l, &m);
        return r;
    }
    int loggedMessages() const
    {
        int r = 0, l = 0, m = 0;
        counts(&r, &l, &m);
        return m;
    }
};

Fake loadFake(char const* path, int mode)
{
    Fake f;
    f.handle = dlopen(path, RTLD_NOW | mode);
    if (f.handle == nullptr)
    {
        std::printf("cannot load the fake libnvinfer %s: %s\n", path, dlerror());
        return f;
    }
    auto get = reinterpret_cast<GetRegistryFn>(dlsym(f.handle, "getPluginRegistry"));
    f.registry = get != nullptr ? get() : nullptr;
    f.counts = reinterpret_cast<CountsFn>(dlsym(f.handle, "gdnFakeRegistryCounts"));
    return f;
}

//! dlopen only, as trtexec --staticPlugins (RTLD_LAZY) and ctypes.CDLL (RTLD_LOCAL) do.
void* dlopenOnly(char const* path)
{
    void* h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (h == nullptr)
    {
        std::printf("dlopen(%s): %s\n", path, dlerror());
    }
    return h;
}

//! The gdn plugin creators getCreators returns: prefill, decode, verify, commit.
constexpr int kNbGdnCreators = 4;

int gdnCreatorsRegistered(IPluginRegistry* registry)
{
    int held = 0;
    for (char const* name : {gdn::spec::kGatedDeltaPrefillName, gdn::spec::kGatedDeltaDecodeName,
             gdn::spec::kGatedDeltaVerifyName, gdn::spec::kGatedDeltaCommitName})
    {
        IPluginCreatorInterface* c
            = registry->getCreator(name, gdn::spec::kPluginVersion, gdn::spec::kPluginNamespace);
        if (c != nullptr && std::strcmp(c->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0)
        {
            auto* v3 = static_cast<IPluginCreatorV3One*>(c);
            held += std::strcmp(v3->getPluginName(), name) == 0
                    && std::strcmp(v3->getPluginNamespace(), gdn::spec::kPluginNamespace) == 0
                    && std::strcmp(v3->getPluginVersion(), gdn::spec::kPluginVersion) == 0
                ? 1
                : 0;
        }
    }
    return held;
}

//! Every gdn creator registered, one registerCreator call accepted for each, nothing else registered.
void expectRegisteredOnce(Fake const& fake, int expectedRegisterCalls)
{
    int32_t n = 0;
    fake.registry->getAllCreators(&n);
    CHECK(n == kNbGdnCreators);
    CHECK(gdnCreatorsRegistered(fake.registry) == kNbGdnCreators);
    CHECK(fake.registerCalls() == expectedRegisterCalls);
}

//! A creator from the registry makes a plugin, and its errors reach TensorRT's logger (setLoggerFinder worked).
void expectWorkingCreator(Fake const& fake)
{
    auto* c = static_cast<IPluginCreatorV3One*>(fake.registry->getCreator(
        gdn::spec::kGatedDeltaDecodeName, gdn::spec::kPluginVersion, gdn::spec::kPluginNamespace));
    if (c == nullptr)
    {
        CHECK(c != nullptr);
        return;
    }
    PluginFieldCollection empty{0, nullptr};
    IPluginV3* p = c->createPlugin("loading_test", &empty, TensorRTPhase::kBUILD);
    CHECK(p != nullptr);
    delete p;
    int32_t const bad = 7;
    PluginField field{gdn::spec::kStateModeName, &bad, PluginFieldType::kINT32, 1};
    PluginFieldCollection fc{1, &field};
    int const before = fake.loggedMessages();
    CHECK(c->createPlugin("loading_test", &fc, TensorRTPhase::kBUILD) == nullptr);
    CHECK(fake.loggedMessages() == before + 1); // the error went to TensorRT's logger, not to stderr
}

int32_t callRegister(void* autoreg)
{
    auto fn = reinterpret_cast<RegisterFn>(dlsym(autoreg, "gdnRegisterPlugins"));
    CHECK(fn != nullptr);
    return fn != nullptr ? fn() : -2;
}

void staticTwice(Paths const& p, int fakeMode)
{
    Fake fake = loadFake(p.fake, fakeMode);
    CHECK(fake.registry != nullptr && fake.counts != nullptr);
    if (fake.registry == nullptr || fake.counts == nullptr)
    {
        return;
    }
    void* a = dlopenOnly(p.autoreg);
    CHECK(a != nullptr);
    expectRegisteredOnce(fake, kNbGdnCreators);
    void* b = dlopenOnly(p.autoreg); // the same object: its constructor does not run again
    CHECK(b == a);
    CHECK(callRegister(b) == kNbGdnCreators); // an explicit second registration finds them all, registers nothing
    expectRegisteredOnce(fake, kNbGdnCreators);
    expectWorkingCreator(fake);
}

void loadLibraryTwice(Paths const& p)
{
    Fake fake = loadFake(p.fake, RTLD_GLOBAL);
    CHECK(fake.registry != nullptr && fake.counts != nullptr);
    if (fake.registry == nullptr || fake.counts == nullptr)
    {
        return;
    }
    CHECK(fake.registry->loadLibrary(p.plugins) != nullptr);
    expectRegisteredOnce(fake, kNbGdnCreators);
    // TensorRT refuses a second load of a library whose creators are registered: the caller (gdn-build's loader)
    // must check getCreator first; the registry still holds each creator once.
    CHECK(fake.registry->loadLibrary(p.plugins) == nullptr);
    expectRegisteredOnce(fake, kNbGdnCreators);
    expectWorkingCreator(fake);
}

void staticThenLoadLibrary(Paths const& p)
{
    Fake fake = loadFake(p.fake, RTLD_GLOBAL);
    if (fake.registry == nullptr || fake.counts == nullptr)
    {
        CHECK(fake.registry != nullptr && fake.counts != nullptr);
        return;
    }
    CHECK(dlopenOnly(p.autoreg) != nullptr);
    CHECK(fake.registry->loadLibrary(p.plugins) == nullptr); // already registered: TensorRT refuses, nothing doubles
    expectRegisteredOnce(fake, kNbGdnCreators);
    expectWorkingCreator(fake);
}

void loadLibraryThenStatic(Paths const& p)
{
    Fake fake = loadFake(p.fake, RTLD_GLOBAL);
    if (fake.registry == nullptr || fake.counts == nullptr)
    {
        CHECK(fake.registry != nullptr && fake.counts != nullptr);
        return;
    }
    CHECK(fake.registry->loadLibrary(p.plugins) != nullptr);
    void* a = dlopenOnly(p.autoreg); // finds both registered: registers nothing
    CHECK(a != nullptr);
    CHECK(callRegister(a) == kNbGdnCreators);
    expectRegisteredOnce(fake, kNbGdnCreators);
    expectWorkingCreator(fake);
}

void noTensorRt(Paths const& p)
{
    void* a = dlopenOnly(p.autoreg); // prints one line saying TensorRT is not loaded
    CHECK(a != nullptr);
    CHECK(callRegister(a) == -1);
}

void versionMismatch(Paths const& p)
{
    Fake fake = loadFake(p.fake, RTLD_GLOBAL); // run with GDN_FAKE_TENSORRT_VERSION of another major version
    if (fake.registry == nullptr || fake.counts == nullptr)
    {
        CHECK(fake.registry != nullptr && fake.counts != nullptr);
        return;
    }
    void* a = dlopenOnly(p.autoreg);
    CHECK(a != nullptr);
    CHECK(callRegister(a) == -1);
    fake.registry->loadLibrary(p.plugins); // getCreators returns no creators
    int32_t n = -1;
    fake.registry->getAllCreators(&n);
    CHECK(n == 0);
    CHECK(fake.registerCalls() == 0);
}
} // namespace

int main(int argc, char** argv)
{
    if (argc != 5)
    {
        std::printf("usage: %s SCENARIO FAKE_NVINFER PLUGIN_LIB AUTOREG_LIB\n", argv[0]);
        return 2;
    }
    std::string const scenario = argv[1];
    Paths const p{argv[2], argv[3], argv[4]};
    if (scenario == "static-twice")
        staticTwice(p, RTLD_GLOBAL);
    else if (scenario == "python-twice")
        staticTwice(p, RTLD_LOCAL);
    else if (scenario == "loadlibrary-twice")
        loadLibraryTwice(p);
    else if (scenario == "static-then-loadlibrary")
        staticThenLoadLibrary(p);
    else if (scenario == "loadlibrary-then-static")
        loadLibraryThenStatic(p);
    else if (scenario == "no-tensorrt")
        noTensorRt(p);
    else if (scenario == "version-mismatch")
        versionMismatch(p);
    else
    {
        std::printf("unknown scenario %s\n", scenario.c_str());
        return 2;
    }
    std::printf("gdn_plugin_loading_test %s: %d checks, %d failed\n", scenario.c_str(), gCounter.checks,
        gCounter.failures);
    return gCounter.failures == 0 && gCounter.checks > 0 ? 0 : 1;
}
