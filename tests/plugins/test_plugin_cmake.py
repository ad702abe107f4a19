"""plugins_cpp/CMakeLists.txt: skips cleanly without TensorRT headers; with them, builds
libgdn_trt_plugins.so (exporting getCreators/setLoggerFinder, no libnvinfer needed) and the host-only
gdn_plugin_selftest, which must pass.

To stay fast (no nvcc run), the build here uses a scratch CMake project that adds plugins_cpp/ beside a
*stand-in* gdn_kernels_static: host C++ implementing the kernel API's shape checks, workspace size and
launches that return an error (the selftest never launches). The real kernels are linked in the full
build (`cmake -S . -B build ...`); ``test_built_selftest`` runs that build's selftest when it exists.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins_cpp"
SKIP_MESSAGE = ("gdn: TensorRT headers not found (set TensorRT_ROOT=...): skipping the TensorRT plugin target "
                "gdn_trt_plugins")
STD_TRT_DIRS = ["/usr/include/x86_64-linux-gnu", "/usr/include/aarch64-linux-gnu", "/usr/local/tensorrt/include",
                "/opt/tensorrt/include"]

STUB_KERNELS = r"""
// Test stand-in for plugins_cpp/kernels (host only): same API, no CUDA kernels.
#include "gdnKernels.h"
namespace gdn {
static bool head(int d) { return d == 64 || d == 128 || d == 256; }
char const* gdnPrefillSupports(GdnPrefillParams const& p) {
    if (!head(p.K) || !head(p.V)) return "prefill: head dim K, V in {64, 128, 256} only";
    if (p.Hk <= 0 || p.Hv % p.Hk) return "prefill: heads";
    if (p.N > 0 && (!p.cuSeqlens || !p.finalState)) return "prefill: cuSeqlens and finalState are required";
    return "";
}
char const* gdnDecodeSupports(GdnDecodeParams const& p) {
    if (!head(p.K) || !head(p.V)) return "decode: head dim K, V in {64, 128, 256} only";
    if (p.Hk <= 0 || p.Hv % p.Hk) return "decode: heads";
    if (p.stateMode == 0 && p.P != p.B) return "decode: P == B";
    if (p.B > 0 && (!p.q || !p.stateIn || !p.stateOut)) return "decode: pointers";
    return "";
}
size_t gdnPrefillWorkspaceSize(GdnPrefillParams const& p) { return size_t(p.T) * p.Hv * p.K * 4 + 256; }
cudaError_t launchGdnPrefill(GdnPrefillParams const&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launchGdnDecode(GdnDecodeParams const&, cudaStream_t) { return cudaErrorNotSupported; }
}
"""


def _trt_include() -> Path | None:
    roots = [os.environ["TensorRT_ROOT"] + "/include"] if os.environ.get("TensorRT_ROOT") else []
    for d in roots + STD_TRT_DIRS:
        if (Path(d) / "NvInferRuntime.h").is_file():
            return Path(d)
    return None


def _cuda_toolkit() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/include/cuda_runtime.h").is_file()


def _scratch(tmp_path: Path, kernels: str) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(gdn_plugin_probe LANGUAGES CXX)\n" + kernels
        + f"add_subdirectory({PLUGINS.as_posix()} plugins_cpp)\n")
    return src


def _run(cmd, env=None, timeout=600):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)


needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")


@needs_cmake
def test_configure_without_headers_skips(tmp_path):
    src = _scratch(tmp_path, "add_library(gdn_kernels_static INTERFACE)\n")
    env = {k: v for k, v in os.environ.items() if k != "TensorRT_ROOT"}
    ignore = STD_TRT_DIRS + ["/usr/include", "/usr/local/include"]
    r = _run(["cmake", "-S", src, "-B", tmp_path / "b", "-DCMAKE_IGNORE_PATH=" + ";".join(ignore)], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert SKIP_MESSAGE in r.stdout
    assert "gdn_trt_plugins" not in (tmp_path / "b" / "Makefile").read_text()


@needs_cmake
def test_selftest_with_stub_kernels(tmp_path):
    inc = _trt_include()
    if inc is None:
        pytest.skip("TensorRT headers not found (set TensorRT_ROOT or install them under " + ", ".join(STD_TRT_DIRS) + ")")
    if not _cuda_toolkit():
        pytest.skip("the CUDA toolkit (cuda_runtime.h, libcudart) is not installed")
    (tmp_path / "stub_kernels.cpp").write_text(STUB_KERNELS)
    src = _scratch(tmp_path, (
        "find_package(CUDAToolkit REQUIRED)\n"
        f"add_library(gdn_kernels_static STATIC {(tmp_path / 'stub_kernels.cpp').as_posix()})\n"
        "set_target_properties(gdn_kernels_static PROPERTIES POSITION_INDEPENDENT_CODE ON)\n"
        f"target_include_directories(gdn_kernels_static PUBLIC {(PLUGINS / 'kernels').as_posix()})\n"
        "target_link_libraries(gdn_kernels_static PUBLIC CUDA::cudart)\n"))
    b = tmp_path / "b"
    r = _run(["cmake", "-S", src, "-B", b, f"-DTensorRT_ROOT={inc.parent}"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gdn: TensorRT headers:" in r.stdout
    r = _run(["cmake", "--build", b, "-j2"])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    r = _run([b / "plugins_cpp" / "gdn_plugin_selftest"], timeout=60)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout + r.stderr
    lib = b / "plugins_cpp" / "libgdn_trt_plugins.so"
    assert lib.is_file()
    if shutil.which("nm"):
        exported = _run(["nm", "-D", "--defined-only", lib]).stdout
        assert " T getCreators" in exported and " T setLoggerFinder" in exported
        assert "launchGdnPrefill" not in exported   # the static kernels stay private
        undefined = _run(["nm", "-D", "--undefined-only", "-C", lib]).stdout
        assert "nvinfer1::" not in undefined and "createInferBuilder" not in undefined


def test_built_selftest():
    """The selftest of a full build (real kernels): `cmake -S . -B build -DTensorRT_ROOT=... && cmake --build build`."""
    build = Path(os.environ.get("GDN_BUILD_DIR", REPO / "build"))
    exe = build / "plugins_cpp" / "gdn_plugin_selftest"
    if not exe.is_file():
        pytest.skip(f"no full native build with the TensorRT plugins at {build} (set GDN_BUILD_DIR)")
    r = _run([exe], timeout=60)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout + r.stderr
