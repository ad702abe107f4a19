// A stand-in for libnvinfer with only what plugin loading touches, for gdn_plugin_loading_test: the exported C
// functions getPluginRegistry, getInferLibVersion and getLogger, and a plugin registry that records every
// registerCreator call and loads libraries the way IPluginRegistry::loadLibrary is documented to (dlopen, then
// getCreators and setLoggerFinder; fails and returns nullptr when any of the library's creators is already registered).
// Built as libnvinfer.so.<major> in a test folder of the build tree: never installed, never a real TensorRT.
#include "NvInferRuntime.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <mutex>
#include <string>
#include <vector>

using namespace nvinfer1;

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace
{
class FakeLogger : public ILogger
{
public:
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        std::fprintf(stderr, "[fake tensorrt] severity %d: %s\n", static_cast<int>(severity), msg);
        ++messages;
    }
    int messages = 0;
};

class FakeFinder : public ILoggerFinder
{
public:
    ILogger* findLogger() override
    {
        return &logger;
    }
    FakeLogger logger;
};

struct Entry
{
    std::string name, version, ns;
    IPluginCreatorInterface* creator;
};

char const* kindOf(IPluginCreatorInterface const& c)
{
    return c.getInterfaceInfo().kind;
}

bool describe(IPluginCreatorInterface& c, std::string& name, std::string& version, std::string& ns)
{
    if (std::strcmp(kindOf(c), "PLUGIN CREATOR_V3ONE") != 0)
    {
        return false;
    }
    auto& v3 = static_cast<IPluginCreatorV3One&>(c);
    name = v3.getPluginName();
    version = v3.getPluginVersion();
    ns = v3.getPluginNamespace();
    return true;
}

class FakeRegistry : public IPluginRegistry
{
public:
    void setErrorRecorder(IErrorRecorder* const) noexcept override {}
    IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return nullptr;
    }
    bool isParentSearchEnabled() const override
    {
        return false;
    }
    void setParentSearchEnabled(bool const) override {}

    PluginLibraryHandle loadLibrary(AsciiChar const* pluginPath) noexcept override
    {
        ++loadLibraryCalls;
        void* handle = dlopen(pluginPath, RTLD_LAZY | RTLD_LOCAL);
        if (handle == nullptr)
        {
            std::fprintf(stderr, "[fake tensorrt] loadLibrary(%s): %s\n", pluginPath, dlerror());
            return nullptr;
        }
        using GetCreators = IPluginCreatorInterface* const* (*) (int32_t&);
        using SetFinder = void (*)(ILoggerFinder*);
        auto getCreators = reinterpret_cast<GetCreators>(dlsym(handle, "getCreators"));
        if (auto setFinder = reinterpret_cast<SetFinder>(dlsym(handle, "setLoggerFinder")))
        {
            setFinder(&finder);
        }
        if (getCreators == nullptr)
        {
            std::fprintf(stderr, "[fake tensorrt] loadLibrary(%s): no getCreators\n", pluginPath);
            return nullptr;
        }
        int32_t nb = 0;
        IPluginCreatorInterface* const* creators = getCreators(nb);
        for (int32_t i = 0; i < nb; ++i)
        {
            std::string name, version, ns;
            if (!describe(*creators[i], name, version, ns) || find(name, version, ns) != nullptr)
            {
                std::fprintf(stderr, "[fake tensorrt] loadLibrary(%s): creator %s::%s exists already\n", pluginPath,
                    ns.c_str(), name.c_str());
                return nullptr;
            }
        }
        for (int32_t i = 0; i < nb; ++i)
        {
            std::string name, version, ns;
            describe(*creators[i], name, version, ns);
            registerCreator(*creators[i], ns.c_str());
        }
        return handle;
    }
    void deregisterLibrary(PluginLibraryHandle) noexcept override {}

    bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const pluginNamespace) noexcept override
    {
        std::lock_guard<std::mutex> lock(mMutex);
        ++registerCalls;
        std::string name, version, ns;
        if (!describe(creator, name, version, ns) || ns != (pluginNamespace ? pluginNamespace : "")
            || findLocked(name, version, ns) != nullptr)
        {
            return false;
        }
        mEntries.push_back({name, version, ns, &creator});
        mList.push_back(&creator);
        return true;
    }
    IPluginCreatorInterface* const* getAllCreators(int32_t* const numCreators) const noexcept override
    {
        *numCreators = static_cast<int32_t>(mList.size());
        return mList.empty() ? nullptr : mList.data();
    }
    IPluginCreatorInterface* getCreator(AsciiChar const* const pluginName, AsciiChar const* const pluginVersion,
        AsciiChar const* const pluginNamespace) noexcept override
    {
        return find(pluginName, pluginVersion, pluginNamespace ? pluginNamespace : "");
    }
    bool deregisterCreator(IPluginCreatorInterface const&) noexcept override
    {
        return false;
    }
    IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override
    {
        return nullptr;
    }
    int32_t releasePluginResource(AsciiChar const*) noexcept override
    {
        return 0;
    }
    // TensorRT >= 10.15 (no `override`, so the fake also compiles against older headers that lack it).
    IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const numCreators) noexcept
    {
        return getAllCreators(numCreators);
    }
#if NV_TENSORRT_MAJOR < 11
    // The IPluginV2 methods TensorRT 10 still declares (removed in 11).
    bool registerCreator(IPluginCreator&, AsciiChar const* const) noexcept override
    {
        ++registerCalls;
        return false;
    }
    IPluginCreator* const* getPluginCreatorList(int32_t* const numCreators) const noexcept override
    {
        *numCreators = 0;
        return nullptr;
    }
    IPluginCreator* getPluginCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept
        override
    {
        return nullptr;
    }
    bool deregisterCreator(IPluginCreator const&) noexcept override
    {
        return false;
    }
#endif

    int registerCalls = 0;
    int loadLibraryCalls = 0;
    FakeFinder finder;

private:
    IPluginCreatorInterface* find(std::string const& name, std::string const& version, std::string const& ns)
    {
        std::lock_guard<std::mutex> lock(mMutex);
        return findLocked(name, version, ns);
    }
    IPluginCreatorInterface* findLocked(std::string const& name, std::string const& version, std::string const& ns)
    {
        for (auto const& e : mEntries)
        {
            if (e.name == name && e.version == version && e.ns == ns)
            {
                return e.creator;
            }
        }
        return nullptr;
    }
    std::mutex mMutex;
    std::vector<Entry> mEntries;
    std::vector<IPluginCreatorInterface*> mList;
};

FakeRegistry& registry()
{
    static FakeRegistry sRegistry;
    return sRegistry;
}
} // namespace

FAKE_EXPORT IPluginRegistry* getPluginRegistry() noexcept
{
    return &registry();
}

//! NV_TENSORRT_VERSION of the headers, or $GDN_FAKE_TENSORRT_VERSION (to play another TensorRT version).
FAKE_EXPORT int32_t getInferLibVersion() noexcept
{
    char const* env = std::getenv("GDN_FAKE_TENSORRT_VERSION");
    return env != nullptr ? static_cast<int32_t>(std::atoi(env)) : static_cast<int32_t>(NV_TENSORRT_VERSION);
}

FAKE_EXPORT ILogger* getLogger() noexcept
{
    return &registry().finder.logger;
}

//! For the test: registerCreator calls so far, loadLibrary calls so far, messages logged through the fake logger.
FAKE_EXPORT void gdnFakeRegistryCounts(int* registerCalls, int* loadLibraryCalls, int* loggedMessages)
{
    *registerCalls = registry().registerCalls;
    *loadLibraryCalls = registry().loadLibraryCalls;
    *loggedMessages = registry().finder.logger.messages;
}
