// The IPluginCreatorV3One of every gdn TensorRT plugin, written once: GdnPluginCreator<Plugin> answers the plugin's
// name, version, namespace and field names and creates it from a field collection (errors reported, nullptr
// returned). A plugin class says what differs:
//
//   static constexpr char const* kName;                                   // spec op name = plugin name
//   static void fieldNames(FieldList& names);                             // the fields the creator lists
//   static Plugin* fromFields(nvinfer1::PluginFieldCollection const* fc); // throws GdnPluginError
//
// GdnPluginBase (the q/k/v ops) defines the last two from kHasStateMode; gdnCommitPlugin its own (state_mode only).
#pragma once

#include "gdnPluginUtils.h"

#include <exception>
#include <string>

namespace gdn
{
namespace plugin
{

template <typename Plugin>
class GdnPluginCreator : public GdnPluginNamed<nvinfer1::IPluginCreatorV3One, Plugin>
{
public:
    GdnPluginCreator()
    {
        Plugin::fieldNames(mFieldNames);
    }
    ~GdnPluginCreator() override = default;

    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override
    {
        return mFieldNames.collection();
    }
    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
        nvinfer1::TensorRTPhase /*phase*/) noexcept override
    {
        try
        {
            return Plugin::fromFields(fc);
        }
        catch (std::exception const& e)
        {
            reportError(nullptr,
                std::string(Plugin::kName) + " createPlugin('" + (name ? name : "") + "'): " + e.what());
        }
        return nullptr;
    }

private:
    FieldList mFieldNames;
};

} // namespace plugin
} // namespace gdn
