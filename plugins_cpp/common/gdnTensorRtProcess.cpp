#include "gdnTensorRtProcess.h"

#include "NvInferVersion.h"

#include <cstring>
#include <dlfcn.h>
#include <link.h>

namespace gdn
{
namespace plugin
{
namespace
{
struct Search
{
    char const* symbol;
    void* address;
};

bool isTensorRtLibrary(char const* path) noexcept
{
    if (path == nullptr || path[0] == '\0')
    {
        return false;
    }
    char const* slash = std::strrchr(path, '/');
    char const* base = slash != nullptr ? slash + 1 : path;
    return std::strncmp(base, "libnvinfer.so", 13) == 0;
}

int visitObject(dl_phdr_info* info, size_t /*size*/, void* data) noexcept
{
    auto* search = static_cast<Search*>(data);
    if (!isTensorRtLibrary(info->dlpi_name))
    {
        return 0;
    }
    // RTLD_NOLOAD: a handle to the object that is already loaded (even RTLD_LOCAL); never loads anything.
    void* handle = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr)
    {
        return 0;
    }
    search->address = dlsym(handle, search->symbol);
    dlclose(handle); // drops only the reference RTLD_NOLOAD added
    return search->address != nullptr ? 1 : 0;
}
} // namespace

void* findTensorRtSymbol(char const* name) noexcept
{
    if (void* global = dlsym(RTLD_DEFAULT, name))
    {
        return global;
    }
    Search search{name, nullptr};
    dl_iterate_phdr(visitObject, &search);
    return search.address;
}

int32_t loadedTensorRtVersion() noexcept
{
    using VersionFn = int32_t (*)();
    auto fn = reinterpret_cast<VersionFn>(findTensorRtSymbol("getInferLibVersion"));
    return fn != nullptr ? fn() : -1;
}

std::string tensorRtMismatch()
{
    int32_t const loaded = loadedTensorRtVersion();
    if (loaded < 0 || loaded / 10000 == NV_TENSORRT_MAJOR)
    {
        return {};
    }
    return "the gdn plugin library was compiled with TensorRT " + std::to_string(NV_TENSORRT_MAJOR) + "."
        + std::to_string(NV_TENSORRT_MINOR) + " headers but this process runs TensorRT "
        + std::to_string(loaded / 10000) + "." + std::to_string(loaded / 100 % 100)
        + "; rebuild it with TensorRT_ROOT pointing at that TensorRT (its plugin and logger interfaces differ "
          "between major versions)";
}

} // namespace plugin
} // namespace gdn
