// libgdn_trt_plugins_autoreg.so: registers the gdn plugin creators when the library is loaded, for loaders that only
// dlopen a plugin library (trtexec --staticPlugins, polygraphy run/convert --plugins, ctypes.CDLL). It links
// libgdn_trt_plugins.so (RUNPATH $ORIGIN) and, at load time, finds the getPluginRegistry() of the TensorRT already
// loaded in the process (gdnTensorRtProcess.h; nothing is linked against or loaded) and registers each creator that
// the registry does not hold yet: loading it any number of times registers each creator exactly once.
// Never hand this library to IPluginRegistry::loadLibrary / trtexec --dynamicPlugins: use libgdn_trt_plugins.so.
#include "NvInferRuntime.h"
#include "gdnTensorRtProcess.h"

#include <cstdio>
#include <exception>
#include <mutex>
#include <string>

using namespace nvinfer1;

#define GDN_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
extern "C" void setLoggerFinder(ILoggerFinder* finder);

namespace
{
//! Hands the plugins TensorRT's global logger (the exported getLogger()), looked up at each call.
class GlobalLoggerFinder : public ILoggerFinder
{
public:
    ILogger* findLogger() noexcept override
    {
        using GetLoggerFn = ILogger* (*) ();
        auto fn = reinterpret_cast<GetLoggerFn>(gdn::plugin::findTensorRtSymbol("getLogger"));
        return fn != nullptr ? fn() : nullptr;
    }
};

struct CreatorInfo
{
    char const* name;
    char const* version;
    char const* pluginNamespace;
};

CreatorInfo infoOf(IPluginCreatorInterface* creator)
{
    // Every gdn creator is an IPluginCreatorV3One (getCreators in gdnPluginRegistration.cpp).
    auto* c = static_cast<IPluginCreatorV3One*>(creator);
    return {c->getPluginName(), c->getPluginVersion(), c->getPluginNamespace()};
}

void say(std::string const& msg)
{
    std::fprintf(stderr, "[gdn plugin] libgdn_trt_plugins_autoreg.so: %s\n", msg.c_str());
}
} // namespace

//! Registers the gdn creators with the registry of the TensorRT loaded in this process; creators that are already
//! registered (by an earlier load, or through loadLibrary) are left alone. Returns how many of the gdn creators the
//! registry holds afterwards (2 on success), or -1 when no usable TensorRT is loaded (one line on stderr says why).
extern "C" GDN_PLUGIN_EXPORT int32_t gdnRegisterPlugins() noexcept
{
    static std::mutex sMutex;
    static GlobalLoggerFinder sFinder;
    try
    {
        std::lock_guard<std::mutex> lock(sMutex);
        using GetRegistryFn = IPluginRegistry* (*) ();
        auto getRegistry = reinterpret_cast<GetRegistryFn>(gdn::plugin::findTensorRtSymbol("getPluginRegistry"));
        IPluginRegistry* registry = getRegistry != nullptr ? getRegistry() : nullptr;
        if (registry == nullptr)
        {
            say("no TensorRT (libnvinfer) is loaded in this process, so the gdn plugins were not registered; load "
                "TensorRT first (import tensorrt, or create a builder/runtime) or load libgdn_trt_plugins.so with "
                "IPluginRegistry::loadLibrary");
            return -1;
        }
        std::string const mismatch = gdn::plugin::tensorRtMismatch();
        if (!mismatch.empty())
        {
            say(mismatch + "; the gdn plugins were not registered");
            return -1;
        }
        setLoggerFinder(&sFinder);
        int32_t nb = 0;
        IPluginCreatorInterface* const* creators = getCreators(nb);
        int32_t held = 0;
        for (int32_t i = 0; i < nb; ++i)
        {
            CreatorInfo const info = infoOf(creators[i]);
            if (registry->getCreator(info.name, info.version, info.pluginNamespace) == nullptr
                && !registry->registerCreator(*creators[i], info.pluginNamespace))
            {
                say(std::string("TensorRT refused to register plugin creator ") + info.pluginNamespace
                    + "::" + info.name + " version " + info.version);
                continue;
            }
            ++held;
        }
        return held;
    }
    catch (std::exception const& e)
    {
        say(std::string("registration failed: ") + e.what());
    }
    catch (...)
    {
        say("registration failed");
    }
    return -1;
}

namespace
{
__attribute__((constructor)) void registerOnLoad()
{
    gdnRegisterPlugins();
}
} // namespace
