// Library entry points of libgdn_trt_plugins.so, as TensorRT 10+ expects from a plugin library loaded with
// IPluginRegistry::loadLibrary (trtexec --dynamicPlugins, polygraphy --plugins, Python
// trt.get_plugin_registry().load_library): getCreators lists the IPluginCreatorV3One creators and
// setLoggerFinder hands the library TensorRT's logger.
#include "gdnDecodePlugin/gdnDecodePlugin.h"
#include "gdnPrefillPlugin/gdnPrefillPlugin.h"

using namespace nvinfer1;

// TENSORRTAPI is empty outside TensorRT's own build; the library is compiled with hidden visibility.
#define GDN_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" GDN_PLUGIN_EXPORT IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static gdn::plugin::GdnPrefillPluginCreator sPrefillCreator;
    static gdn::plugin::GdnDecodePluginCreator sDecodeCreator;
    static IPluginCreatorInterface* const kCreators[] = {&sPrefillCreator, &sDecodeCreator};
    nbCreators = static_cast<int32_t>(sizeof(kCreators) / sizeof(kCreators[0]));
    return kCreators;
}

extern "C" GDN_PLUGIN_EXPORT void setLoggerFinder(ILoggerFinder* finder)
{
    gdn::plugin::setLoggerFinder(finder);
}
