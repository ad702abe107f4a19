"""gdn-build without TensorRT: help, metadata errors, missing module, ONNX preparation, library lookup.

The last tests drive the whole TensorRT code path of gdn-build against a small recording stand-in
for the ``tensorrt`` module (clearly not TensorRT: it checks the calls gdn-build makes, e.g. that
the parser receives the TensorRT-ready file, the profiles and the aliasing preview feature, and that
its plugin registry follows TensorRT's rule that load_library fails when a creator is already
registered); real engines are built and run in test_trt_engine.py where TensorRT and a GPU exist.
"""
from __future__ import annotations

import json
import sys
import types

import onnx
import pytest

from gdn_deploy.plugins import (PLUGIN_LIB_ENV, find_plugin_library, plugin_library_candidates,
                                prepare_onnx_for_tensorrt)
from gdn_deploy.errors import EXIT_CODES_HELP
from gdn_deploy.onnx_nodes import tensorrt_ready_problems
from gdn_deploy.plugins import build_cli, loader
from gdn_deploy.spec import SPEC

from .onnx_graphs import decode_profile, gdn_model, prefill_profile, write_export_dir


def run(argv, capsys):
    code = build_cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def export_dir(tmp_path):
    return write_export_dir(tmp_path / "export",
                            {"prefill": gdn_model("GatedDeltaPrefill"), "decode": gdn_model("GatedDeltaDecode")},
                            {"prefill": prefill_profile(), "decode": decode_profile()})


@pytest.fixture
def no_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)   # `import tensorrt` raises ImportError


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        build_cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for needle in ("gdn-build", "EXPORT_DIR", "--graphs", "--plugin-lib", "--fp16", "--bf16", "--workspace-gb",
                   "-o", PLUGIN_LIB_ENV, "libgdn_trt_plugins_autoreg.so", "once per process"):
        assert needle in text
    assert EXIT_CODES_HELP in text      # the one exit-code table of every command


def test_missing_tensorrt_exit_6(export_dir, no_tensorrt, capsys):
    code, out, err = run([export_dir], capsys)
    assert code == build_cli.EXIT_NO_TENSORRT == 6      # the one exit-code table (gdn_deploy.errors)
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("gdn-build: TensorRT is not installed (the tensorrt Python module could not be "
                               "imported); engines can be built on a machine with TensorRT >= 10.3")
    assert not list(export_dir.glob("*.engine"))


def _meta(d):
    return json.loads((d / "gdn_model.json").read_text())


@pytest.mark.parametrize("case, needle, code", [      # 2: not an export folder / bad argument; 3: bad folder
    ("no_dir", "not a directory", 2),
    ("no_json", "no gdn_model.json here", 2),
    ("bad_json", "not readable JSON", 3),
    ("not_object", "not a JSON object", 3),
    ("other_format", "not a gdn-deploy export sidecar", 3),
    ("no_graphs", "missing key 'graphs'", 3),
    ("no_file", "graphs.decode needs a 'file'", 3),
    ("missing_onnx", "does not exist", 3),
    ("missing_trt_onnx", "graphs.decode.tensorrt_file", 3),
    ("unknown_graph", "no graph 'decode_pool' (available: prefill, decode)", 2),
    ("profile_order", "needs min <= opt <= max", 3),
    ("profile_rank", "different ranks", 3),
    ("profile_levels", "expected {\"min\"", 3),
    ("profile_type", "expected a list of ints", 3),
])
def test_metadata_errors(export_dir, capsys, case, needle, code):
    meta = _meta(export_dir)
    argv = [export_dir]
    if case == "no_dir":
        argv = [export_dir / "nope"]
    elif case == "no_json":
        (export_dir / "gdn_model.json").unlink()
    elif case == "bad_json":
        (export_dir / "gdn_model.json").write_text("{not json")
    elif case == "not_object":
        (export_dir / "gdn_model.json").write_text("[1, 2]")
    else:
        if case == "other_format":
            meta["format"] = "something-else"
        elif case == "no_graphs":
            del meta["graphs"]
        elif case == "no_file":
            del meta["graphs"]["decode"]["file"]
        elif case == "missing_onnx":
            (export_dir / "decode.onnx").unlink()
        elif case == "missing_trt_onnx":
            (export_dir / "decode.trt.onnx").unlink()
        elif case == "unknown_graph":
            argv += ["--graphs", "decode,decode_pool"]
        elif case == "profile_order":
            meta["profiles"]["decode"]["q"]["min"] = [9, 2, 64]
        elif case == "profile_rank":
            meta["profiles"]["decode"]["q"]["max"] = [8, 2]
        elif case == "profile_levels":
            del meta["profiles"]["decode"]["q"]["opt"]
        elif case == "profile_type":
            meta["profiles"]["prefill"]["q"]["min"] = "1,2,64"
        (export_dir / "gdn_model.json").write_text(json.dumps(meta))
    got, out, err = run(argv, capsys)
    assert got == code, err
    assert err.startswith("gdn-build: ") and needle in err, err


def test_bad_workspace(export_dir, capsys):
    code, _, err = run([export_dir, "--workspace-gb", "0"], capsys)
    assert code == 2 and "--workspace-gb must be > 0" in err


def test_onnx_only_prepares_models(tmp_path, no_tensorrt, capsys):
    export_dir = write_export_dir(tmp_path / "old_export",
                                  {"prefill": gdn_model("GatedDeltaPrefill"), "decode": gdn_model("GatedDeltaDecode")},
                                  {"prefill": prefill_profile(), "decode": decode_profile()}, tensorrt=False)
    code, out, err = run([export_dir, "--onnx-only"], capsys)
    assert code == 0, err
    for name, op in (("prefill", "GatedDeltaPrefill"), ("decode", "GatedDeltaDecode")):
        m = onnx.load(str(export_dir / f"{name}.trt.onnx"))
        (node,) = m.graph.node
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert node.op_type == op and node.domain == SPEC.domain
        assert attrs["plugin_namespace"] == SPEC.plugin_namespace.encode() == b"gdn"
        assert attrs["plugin_version"] == SPEC.plugin_version.encode() == b"1"
        assert not any(f.name == op for f in m.functions)
        assert f"{name}.trt.onnx" in out
    assert onnx.load(str(export_dir / "decode.onnx")).functions, "the original export must stay untouched"
    assert {g: i["tensorrt_file"] for g, i in _meta(export_dir)["graphs"].items()} == {
        "prefill": "prefill.trt.onnx", "decode": "decode.trt.onnx"}


def test_prepare_is_idempotent_and_keeps_other_functions():
    m = gdn_model("GatedDeltaDecode", state_mode=1, gate_mode=1)
    other = onnx.helper.make_function("custom", "Other", ["x"], ["y"], [onnx.helper.make_node("Identity", ["x"], ["y"])],
                                      [onnx.helper.make_opsetid("", 18)])
    m.functions.append(other)
    m.graph.node[0].overload = "gate1_l2norm0_state1"
    s1 = prepare_onnx_for_tensorrt(m)
    assert s1 == {"nodes": 1, "attributes_added": 2, "functions_removed": 1}
    assert [f.name for f in m.functions] == ["Other"] and not m.graph.node[0].overload
    s2 = prepare_onnx_for_tensorrt(m)
    assert s2 == {"nodes": 1, "attributes_added": 0, "functions_removed": 0}
    assert sum(a.name == "plugin_namespace" for a in m.graph.node[0].attribute) == 1


def test_prepare_rejects_foreign_namespace():
    m = gdn_model("GatedDeltaPrefill", with_function=False)
    m.graph.node[0].attribute.append(onnx.helper.make_attribute("plugin_namespace", "other"))
    with pytest.raises(ValueError, match="plugin_namespace='other'"):
        prepare_onnx_for_tensorrt(m)


def test_find_plugin_library(tmp_path, monkeypatch):
    lib = tmp_path / "libgdn_trt_plugins.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setenv(PLUGIN_LIB_ENV, str(lib))
    assert find_plugin_library() == lib.resolve()
    assert plugin_library_candidates() == [lib]
    monkeypatch.setenv(PLUGIN_LIB_ENV, str(tmp_path / "missing.so"))
    assert find_plugin_library() is None
    monkeypatch.delenv(PLUGIN_LIB_ENV)
    monkeypatch.chdir(tmp_path)
    cands = plugin_library_candidates()
    assert tmp_path / "build" / "plugins_cpp" / "libgdn_trt_plugins.so" in cands
    assert any(c.parent.name == "plugins" and c.parent.parent.name == "gdn_deploy" for c in cands)


# ---------------------------------------------------------------- TensorRT code path against a recording stand-in
class _Rec:
    """Records calls; attribute access returns a new recorder (enough for gdn-build's TensorRT calls)."""

    def __init__(self, log, name):
        self._log, self._name = log, name

    def __getattr__(self, item):
        return _Rec(self._log, f"{self._name}.{item}")

    def __call__(self, *a, **k):
        self._log.append((self._name, a, k))
        return _Rec(self._log, f"{self._name}()")

    def __int__(self):
        return 0


def _fake_tensorrt(log, inputs, library_registers=True, version="10.9.0"):
    """A recording stand-in of the ``tensorrt`` module. Its registry follows TensorRT's documented rule:
    load_library registers the library's creators, and returns None when any of them is already registered."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.Logger = type("Logger", (), {"INFO": 3, "WARNING": 2, "__init__": lambda self, sev: None})
    registered = set()

    class Registry:
        def load_library(self, path):
            log.append(("load_library", (path,), {}))
            ours = ({(op, SPEC.plugin_version, SPEC.plugin_namespace) for op in SPEC.plugin_ops}
                    if library_registers else set())
            if ours & registered:
                return None
            registered.update(ours)
            return object()

        def get_creator(self, name, version, namespace):
            log.append(("get_creator", (name, version, namespace), {}))
            return object() if (name, version, namespace) in registered else None

    class Tensor:
        def __init__(self, name, shape):
            self.name, self.shape = name, shape

    class Network:
        num_inputs = len(inputs)

        def get_input(self, i):
            return Tensor(*list(inputs.items())[i])

    class Parser:
        num_errors = 0

        def __init__(self, network, logger):
            pass

        def set_flag(self, flag):
            log.append(("parser.set_flag", (flag,), {}))

        def set_flags(self, flags):
            log.append(("parser.set_flag", (flags,), {}))

        def parse(self, data, path):
            log.append(("parse", (onnx.load_from_string(data), path), {}))
            return True

    class Profile:
        def set_shape(self, name, mn, opt, mx):
            log.append(("set_shape", (name, mn, opt, mx), {}))

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            log.append(("create_network", (flags,), {}))
            return Network()

        def create_builder_config(self):
            return _Rec(log, "config")

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            return b"ENGINE"

    registry = Registry()
    trt.get_plugin_registry = lambda: registry
    trt.Builder, trt.OnnxParser = Builder, Parser
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=0)
    trt.OnnxParserFlag = types.SimpleNamespace(ENABLE_PLUGIN_OVERRIDE="OVERRIDE")
    trt.PreviewFeature = types.SimpleNamespace(ALIASED_PLUGIN_IO_10_03="ALIAS")
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WS")
    trt.BuilderFlag = types.SimpleNamespace(FP16="FP16", BF16="BF16")
    return trt


def test_build_flow_with_recording_tensorrt(export_dir, tmp_path, monkeypatch, capsys):
    lib = tmp_path / "libgdn_trt_plugins.so"
    lib.write_bytes(b"\x7fELF")
    log = []
    inputs = {n: tuple(-1 if i == 0 else d for i, d in enumerate(s["max"]))
              for n, s in decode_profile().items()}
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(log, inputs))
    out = tmp_path / "engines"
    code, so, se = run([export_dir, "--graphs", "decode", "--plugin-lib", lib, "-o", out, "--workspace-gb", "0.5"],
                       capsys)
    assert code == 0, se
    assert (out / "decode.engine").read_bytes() == b"ENGINE"
    summary = json.loads((out / "gdn_engines.json").read_text())
    assert summary["engines"]["decode"]["file"] == "decode.engine" and summary["tensorrt_version"] == "10.9.0"
    calls = {c[0]: c for c in log}
    assert [c[1] for c in log if c[0] == "load_library"] == [(str(lib),)]
    assert {c[1] for c in log if c[0] == "get_creator"} == {(op, "1", "gdn") for op in SPEC.plugin_ops}
    assert calls["create_network"][1] == (1,)                       # strongly typed
    assert "parser.set_flag" not in calls                           # no ENABLE_PLUGIN_OVERRIDE (or any flag)
    parsed, path = calls["parse"][1]
    assert path == str(export_dir / "decode.trt.onnx")              # the TensorRT-ready file gdn-export wrote
    assert not parsed.functions and not tensorrt_ready_problems(parsed)
    assert ("config.set_preview_feature", ("ALIAS", True), {}) in log
    assert ("config.set_memory_pool_limit", ("WS", 1 << 29), {}) in log
    shapes = {c[1][0]: c[1][1:] for c in log if c[0] == "set_shape"}
    assert shapes["state"] == ([1, 4, 64, 64], [4, 4, 64, 64], [8, 4, 64, 64])
    assert "decode: wrote" in so

    # gdn-build again in the same process (the same registry): nothing is loaded twice, no error
    log.clear()
    code, so, se = run([export_dir, "--graphs", "decode", "--plugin-lib", lib, "-o", out], capsys)
    assert code == 0, se
    assert not [c for c in log if c[0] == "load_library"] and "already registered" in so

    # the plugin library must hold both creators
    log.clear()
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(log, inputs, library_registers=False))
    code, _, se = run([export_dir, "--graphs", "decode", "--plugin-lib", lib, "-o", out], capsys)
    assert code == build_cli.EXIT_PLUGIN and "no plugin creator GatedDeltaPrefill, GatedDeltaDecode" in se

    # TensorRT older than 10.3: exit 6 before anything is loaded
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(log, inputs, version="10.2.0"))
    code, _, se = run([export_dir, "--graphs", "decode", "--plugin-lib", lib, "-o", out], capsys)
    assert code == build_cli.EXIT_NO_TENSORRT and "plugins need TensorRT >= 10.3" in se

    # a folder exported before gdn-export wrote TensorRT-ready files: prepared in memory
    log.clear()
    meta = _meta(export_dir)
    del meta["graphs"]["decode"]["tensorrt_file"]
    (export_dir / "gdn_model.json").write_text(json.dumps(meta))
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(log, inputs))
    code, _, se = run([export_dir, "--graphs", "decode", "--plugin-lib", lib, "-o", out], capsys)
    assert code == 0, se
    parsed, path = next(c[1] for c in log if c[0] == "parse")
    assert path == str(export_dir / "decode.onnx") and not tensorrt_ready_problems(parsed)

    # a dynamic input without a profile entry is reported before building
    meta = _meta(export_dir)
    del meta["profiles"]["decode"]["slots" if "slots" in meta["profiles"]["decode"] else "beta"]
    (export_dir / "gdn_model.json").write_text(json.dumps(meta))
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(log, inputs))
    code, _, se = run([export_dir, "--graphs", "decode", "--plugin-lib", lib, "-o", out], capsys)
    assert code == 2 and "beta have dynamic shapes" in se

    # no library anywhere: exit 3 naming where it looked
    monkeypatch.setenv(PLUGIN_LIB_ENV, str(tmp_path / "none.so"))
    code, _, se = run([export_dir, "--graphs", "decode"], capsys)
    assert code == build_cli.EXIT_PLUGIN and "plugin library not found" in se and "none.so" in se


def test_loader_refuses_library_of_another_major(tmp_path, monkeypatch):
    lib = tmp_path / "libgdn_trt_plugins.so"
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(loader, "library_tensorrt_version", lambda path: 110100)
    log = []
    trt = _fake_tensorrt(log, {}, version="10.9.0")
    with pytest.raises(loader.PluginLoadError, match=r"compiled with TensorRT 11\.1 headers but this is TensorRT "
                                                     r"10\.9\.0; rebuild it with TensorRT_ROOT"):
        loader.load_gdn_plugins(trt, lib)
    assert not [c for c in log if c[0] == "load_library"]
