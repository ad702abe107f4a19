// Library entry points of libgdn_trt_plugins.so, as TensorRT 10+ expects from a plugin library loaded with
// IPluginRegistry::loadLibrary (trtexec --dynamicPlugins, Python trt.get_plugin_registry().load_library, C++
// getPluginRegistry()->loadLibrary): getCreators lists the IPluginCreatorV3One creators and setLoggerFinder hands the
// library TensorRT's logger. This library registers nothing by itself when loaded (loadLibrary registers what
// getCreators returns and fails if a creator is already registered); for loaders that only dlopen a library
// (trtexec --staticPlugins, polygraphy --plugins) use libgdn_trt_plugins_autoreg.so (gdnPluginAutoRegister.cpp).
#include "gdnCommitPlugin/gdnCommitPlugin.h"
#include "gdnDecodePlugin/gdnDecodePlugin.h"
#include "gdnPrefillPlugin/gdnPrefillPlugin.h"
#include "gdnVerifyPlugin/gdnVerifyPlugin.h"
#include "gdnTensorRtProcess.h"

using namespace nvinfer1;

// TENSORRTAPI is empty outside TensorRT's own build; the library is compiled with hidden visibility.
#define GDN_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" GDN_PLUGIN_EXPORT IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static gdn::plugin::GdnPrefillPluginCreator sPrefillCreator;
    static gdn::plugin::GdnDecodePluginCreator sDecodeCreator;
    static gdn::plugin::GdnVerifyPluginCreator sVerifyCreator;
    static gdn::plugin::GdnCommitPluginCreator sCommitCreator;
    static IPluginCreatorInterface* const kCreators[]
        = {&sPrefillCreator, &sDecodeCreator, &sVerifyCreator, &sCommitCreator};
    try
    {
        std::string const mismatch = gdn::plugin::tensorRtMismatch();
        if (!mismatch.empty())
        {
            gdn::plugin::reportError(nullptr, "getCreators: " + mismatch + " (no plugin creators returned)");
            nbCreators = 0;
            return nullptr;
        }
    }
    catch (...)
    {
        nbCreators = 0;
        return nullptr;
    }
    nbCreators = static_cast<int32_t>(sizeof(kCreators) / sizeof(kCreators[0]));
    return kCreators;
}

extern "C" GDN_PLUGIN_EXPORT void setLoggerFinder(ILoggerFinder* finder)
{
    try
    {
        // A finder of another TensorRT major version has another virtual table: never call it.
        if (gdn::plugin::tensorRtMismatch().empty())
        {
            gdn::plugin::setLoggerFinder(finder);
        }
    }
    catch (...)
    {
    }
}

//! NV_TENSORRT_VERSION of the headers this library was compiled with (major*10000 + minor*100 + patch), so a
//! loader can refuse a library built for another TensorRT major version before handing it to TensorRT.
extern "C" GDN_PLUGIN_EXPORT int32_t gdnPluginTensorRtVersion()
{
    return static_cast<int32_t>(NV_TENSORRT_VERSION);
}
