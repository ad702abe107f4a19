"""plugins_cpp/CMakeLists.txt and the plugin libraries, on a CPU (no GPU, no TensorRT runtime).

Without TensorRT headers CMake skips the plugins with one line naming TensorRT_ROOT. With the headers
(``$TensorRT_ROOT``, the standard places, or /work/trt/TensorRT), a scratch CMake project builds plugins_cpp/
beside a *stand-in* gdn_kernels_static (host C++ with the kernel API's checks and workspace size; launches return
an error; no nvcc run) and checks:

- the libraries: exported symbols, the CUDA runtime linked statically (no libcudart.so NEEDED), no RUNPATH but
  ``$ORIGIN`` (nothing of the build machine), never unloaded (NODELETE), no libnvinfer needed;
- ``gdn_plugin_selftest`` (host-only checks of the plugin classes);
- ``gdn_plugin_loading_test``: the libraries loaded the way trtexec --staticPlugins / --dynamicPlugins, Polygraphy
  --plugins and load_library load them, twice in one process, against a fake libnvinfer registry that records
  registerCreator: every creator (prefill, decode, verify, commit) ends up registered exactly once;
- ``gdn_plugin_lifecycle --host-only``: the TensorRT call sequence up to enqueue on the cases of
  lifecycle_cases.py (the GPU part is test_plugin_lifecycle.py).

The selftest and the library checks also run on a full build (real kernels) when ``build/`` (or
``$GDN_BUILD_DIR``) has one.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .lifecycle_cases import default_cases, write_case

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins_cpp"
SKIP_MESSAGE = ("gdn: TensorRT headers not found (set TensorRT_ROOT=/path/to/TensorRT, the folder whose include/ "
                "holds NvInferRuntime.h): skipping the TensorRT plugins (gdn_trt_plugins)")
STD_TRT_DIRS = ["/usr/include/x86_64-linux-gnu", "/usr/include/aarch64-linux-gnu", "/usr/local/tensorrt/include",
                "/opt/tensorrt/include"]
DEV_TRT_ROOT = "/work/trt/TensorRT"   # headers-only copy on the development machine (never committed)
LOADING_SCENARIOS = ["static-twice", "loadlibrary-twice", "python-twice", "static-then-loadlibrary",
                     "loadlibrary-then-static", "no-tensorrt", "version-mismatch"]

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
char const* gdnVerifySupports(GdnVerifyParams const& p) {
    if (!head(p.K) || !head(p.V)) return "verify: head dim K, V in {64, 128, 256} only";
    if (p.Hk <= 0 || p.Hv % p.Hk) return "verify: heads";
    if (p.stateMode == 0 && p.P != p.N) return "verify: P == N";
    if (p.N > 0 && p.T > 0 && (!p.q || !p.state || !p.commitK)) return "verify: pointers";
    return "";
}
char const* gdnCommitSupports(GdnCommitParams const& p) {
    if (!head(p.K) || !head(p.V)) return "commit: head dim K, V in {64, 128, 256} only";
    if (p.Hk <= 0 || p.Hv % p.Hk) return "commit: heads";
    if (p.stateMode == 0 && p.P != p.N) return "commit: P == N";
    if (p.N > 0 && p.T > 0 && (!p.state || !p.accepted)) return "commit: pointers";
    return "";
}
size_t gdnPrefillWorkspaceSize(GdnPrefillParams const& p) { return size_t(p.T) * p.Hv * p.K * 4 + 256; }
cudaError_t launchGdnPrefill(GdnPrefillParams const&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launchGdnDecode(GdnDecodeParams const&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launchGdnVerify(GdnVerifyParams const&, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launchGdnCommit(GdnCommitParams const&, cudaStream_t) { return cudaErrorNotSupported; }
}
"""


def trt_include() -> Path | None:
    roots = [os.environ["TensorRT_ROOT"]] if os.environ.get("TensorRT_ROOT") else []
    for d in [r + "/include" for r in roots + [DEV_TRT_ROOT]] + STD_TRT_DIRS:
        if (Path(d) / "NvInferRuntime.h").is_file():
            return Path(d)
    return None


def _cuda_toolkit() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/include/cuda_runtime.h").is_file()


def _scratch(root: Path, kernels: str) -> Path:
    src = root / "src"
    src.mkdir(parents=True)
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
def test_configure_with_wrong_root_names_it(tmp_path):
    src = _scratch(tmp_path, "add_library(gdn_kernels_static INTERFACE)\n")
    env = {k: v for k, v in os.environ.items() if k != "TensorRT_ROOT"}
    ignore = STD_TRT_DIRS + ["/usr/include", "/usr/local/include"]
    r = _run(["cmake", "-S", src, "-B", tmp_path / "b", f"-DTensorRT_ROOT={tmp_path / 'nowhere'}",
              "-DCMAKE_IGNORE_PATH=" + ";".join(ignore)], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "TensorRT headers not found" in ln]
    assert lines == [f"-- gdn: TensorRT headers not found: TensorRT_ROOT={tmp_path / 'nowhere'} has no "
                     "include/NvInferRuntime.h; skipping the TensorRT plugins (gdn_trt_plugins)"]


@pytest.fixture(scope="module")
def stub_build(tmp_path_factory) -> Path:
    """plugins_cpp/ built against the TensorRT headers and the stand-in kernels; returns its plugins_cpp folder."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    inc = trt_include()
    if inc is None:
        pytest.skip("TensorRT headers not found (set TensorRT_ROOT, or install them under "
                    + ", ".join(STD_TRT_DIRS) + ")")
    if not _cuda_toolkit():
        pytest.skip("the CUDA toolkit (cuda_runtime.h, libcudart_static) is not installed")
    root = tmp_path_factory.mktemp("plugin_build")
    (root / "stub_kernels.cpp").write_text(STUB_KERNELS)
    src = _scratch(root, (
        "find_package(CUDAToolkit REQUIRED)\n"
        f"add_library(gdn_kernels_static STATIC {(root / 'stub_kernels.cpp').as_posix()})\n"
        "set_target_properties(gdn_kernels_static PROPERTIES POSITION_INDEPENDENT_CODE ON)\n"
        f"target_include_directories(gdn_kernels_static PUBLIC {(PLUGINS / 'kernels').as_posix()})\n"
        "target_link_libraries(gdn_kernels_static PUBLIC CUDA::cudart_static)\n"))
    b = root / "b"
    r = _run(["cmake", "-S", src, "-B", b, f"-DTensorRT_ROOT={inc.parent}"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gdn: TensorRT headers:" in r.stdout
    r = _run(["cmake", "--build", b, "-j2"])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return b / "plugins_cpp"


def _full_build() -> Path | None:
    d = Path(os.environ.get("GDN_BUILD_DIR", REPO / "build")) / "plugins_cpp"
    return d if (d / "libgdn_trt_plugins.so").is_file() else None


def _check_libraries(folder: Path) -> None:
    main, autoreg = folder / "libgdn_trt_plugins.so", folder / "libgdn_trt_plugins_autoreg.so"
    for lib in (main, autoreg):
        assert lib.is_file(), lib
        dyn = _run(["readelf", "-d", lib]).stdout
        needed = [ln.split("[", 1)[1].rstrip("]") for ln in dyn.splitlines() if "(NEEDED)" in ln]
        assert not [n for n in needed if n.startswith("libcudart")], f"{lib.name} needs {needed}: cudart must be static"
        assert not [n for n in needed if n.startswith("libnvinfer")], f"{lib.name} needs {needed}"
        paths = [ln.split("[", 1)[1].rstrip("]") for ln in dyn.splitlines() if "(RUNPATH)" in ln or "(RPATH)" in ln]
        assert all(p == "$ORIGIN" for p in paths), f"{lib.name} has RUNPATH {paths} (only $ORIGIN allowed)"
        assert "NODELETE" in dyn, f"{lib.name} is not linked with -z nodelete"
    assert [n for n in _run(["readelf", "-d", autoreg]).stdout.splitlines() if "libgdn_trt_plugins.so" in n]
    exported = _run(["nm", "-D", "--defined-only", main]).stdout
    for sym in ("getCreators", "setLoggerFinder", "gdnPluginTensorRtVersion"):
        assert f" T {sym}" in exported
    assert "launchGdnPrefill" not in exported   # the static kernels stay private
    assert " T gdnRegisterPlugins" in _run(["nm", "-D", "--defined-only", autoreg]).stdout
    undefined = _run(["nm", "-D", "--undefined-only", "-C", main]).stdout
    assert "nvinfer1::" not in undefined and "createInferBuilder" not in undefined and "cuda" not in undefined


needs_binutils = pytest.mark.skipif(shutil.which("readelf") is None or shutil.which("nm") is None,
                                    reason="readelf/nm (binutils) are not installed")


@needs_binutils
def test_libraries(stub_build):
    _check_libraries(stub_build)


def test_selftest(stub_build):
    r = _run([stub_build / "gdn_plugin_selftest"], timeout=60)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("scenario", LOADING_SCENARIOS)
def test_loading(stub_build, scenario):
    env = dict(os.environ)
    if scenario == "version-mismatch":
        text = (trt_include() / "NvInferVersion.h").read_text()
        major = int(re.search(r"#define (?:TRT_MAJOR_ENTERPRISE|NV_TENSORRT_MAJOR)\s+(\d+)", text).group(1))
        env["GDN_FAKE_TENSORRT_VERSION"] = str((major + 1) * 10000 + 800)   # another major version
    r = _run([stub_build / "gdn_plugin_loading_test", scenario, stub_build / "fake_tensorrt" / "libnvinfer.so.fake",
              stub_build / "libgdn_trt_plugins.so", stub_build / "libgdn_trt_plugins_autoreg.so"], env=env, timeout=60)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout + r.stderr
    if scenario in ("loadlibrary-twice", "static-then-loadlibrary"):
        # the second loadLibrary is refused by the registry (TensorRT's documented rule), nothing registered twice
        assert "exists already" in r.stderr
    if scenario == "no-tensorrt":
        assert ("libgdn_trt_plugins_autoreg.so: no TensorRT (libnvinfer) is loaded in this process, so the gdn "
                "plugins were not registered") in r.stderr
    if scenario == "version-mismatch":
        assert "headers but this process runs TensorRT" in r.stderr and "rebuild it with TensorRT_ROOT" in r.stderr
    else:
        assert "headers but this process runs TensorRT" not in r.stderr


def test_lifecycle_host_only(stub_build, tmp_path, gen):
    dirs = [write_case(tmp_path, c) for c in default_cases(gen)]
    r = _run([stub_build / "gdn_plugin_lifecycle", "--host-only", *dirs], timeout=120)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout + r.stderr
    assert f"{len(dirs)} cases" in r.stdout


def test_full_build():
    """The selftest and the library checks of a full build (real kernels, `cmake -S . -B build -DTensorRT_ROOT=...`)."""
    folder = _full_build()
    if folder is None:
        pytest.skip("no full native build with the TensorRT plugins at build/ (set GDN_BUILD_DIR)")
    r = _run([folder / "gdn_plugin_selftest"], timeout=60)
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout + r.stderr
    if shutil.which("readelf") and shutil.which("nm"):
        _check_libraries(folder)
