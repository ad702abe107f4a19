// The TensorRT library (libnvinfer) loaded in this process, seen from the plugin libraries without linking it:
// its exported C entry points are looked up at run time, so one library serves every loader (TensorRT's
// IPluginRegistry::loadLibrary, a plain dlopen by trtexec --staticPlugins, ctypes.CDLL by Polygraphy).
#pragma once

#include <cstdint>
#include <string>

namespace gdn
{
namespace plugin
{

//! Address of the exported C function `name` of the TensorRT library loaded in this process, or nullptr.
//! Looks in the global scope first (executables linked with libnvinfer, e.g. trtexec), then in every loaded object
//! whose file name starts with "libnvinfer.so" (the Python tensorrt wheel loads it RTLD_LOCAL). Loads nothing.
void* findTensorRtSymbol(char const* name) noexcept;

//! getInferLibVersion() of the loaded TensorRT (major*10000 + minor*100 + patch), or -1 when none is loaded.
int32_t loadedTensorRtVersion() noexcept;

//! Empty when the loaded TensorRT has the major version of the headers this library was compiled with (or when no
//! TensorRT is loaded, e.g. in tests); otherwise one line saying what to rebuild. TensorRT 11 changed the virtual
//! tables of ILogger, ILoggerFinder and IPluginRegistry, so a library must never cross a major version.
std::string tensorRtMismatch();

} // namespace plugin
} // namespace gdn
