"""Exit codes of every gdn-deploy command, the errors that carry them, and the shared CLI runner.

One table for all commands (gdn-export, gdn-check, gdn-build, samples/decode_loop.py); the README
prints :data:`EXIT_CODES_HELP`. A command raises a :class:`GdnError` subclass; :func:`run_cli`
turns it into one line on stderr (``<prog>: <what>: <message>``) and the exit code. Set
``GDN_DEBUG=1`` for the Python traceback.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from enum import IntEnum
from typing import Callable

__all__ = ["ExitCode", "EXIT_CODES_HELP", "GdnError", "UsageError", "LoadError", "ExportFailure", "RunFailure",
           "MismatchError", "NotChecked", "TensorRTMissing", "PluginError", "TensorRTFailure", "run_cli",
           "quiet_warnings", "first_line", "missing_kernel"]


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1          # an unexpected error: a bug, please report it (GDN_DEBUG=1 shows the traceback)
    USAGE = 2             # bad command line or argument: a missing file, a bad option value, not an export folder
    LOAD = 3              # the model or export folder cannot be loaded (unreadable, inconsistent, unsupported)
    EXPORT = 4            # the export failed, or a runtime could not run a graph
    MISMATCH = 5          # outputs differ beyond the tolerance (verification, gdn-check, --compare)
    NO_TENSORRT = 6       # the tensorrt Python module is missing or too old
    PLUGIN = 7            # the gdn TensorRT plugin library is missing or cannot be loaded
    TENSORRT = 8          # TensorRT could not parse, build or run a graph
    NOT_CHECKED = 9       # nothing was checked: no runtime here could run a graph (a missing kernel)
    INTERRUPTED = 130


EXIT_CODES_HELP = """\
exit codes (the same for every gdn-deploy command):
  0 ok                         5 outputs differ beyond the tolerance
  1 unexpected error (a bug)   6 TensorRT (the tensorrt module) missing or too old
  2 usage / bad argument       7 gdn TensorRT plugin library missing or not loadable
  3 model or export folder     8 TensorRT could not parse, build or run a graph
    cannot be loaded         130 interrupted
  4 export failed, or a runtime could not run a graph
  9 not checked: no runtime here could run a graph (a kernel is missing);
    the files are written: check them with gdn-check where TensorRT runs
Set GDN_DEBUG=1 for a Python traceback."""

_WHAT = {ExitCode.INTERNAL: "unexpected error", ExitCode.USAGE: "error", ExitCode.LOAD: "cannot load",
         ExitCode.EXPORT: "failed", ExitCode.MISMATCH: "mismatch", ExitCode.NO_TENSORRT: "TensorRT unavailable",
         ExitCode.PLUGIN: "plugin library", ExitCode.TENSORRT: "TensorRT failed",
         ExitCode.NOT_CHECKED: "not checked"}


class GdnError(Exception):
    """An error a command reports as one line with :attr:`exit_code`."""
    exit_code = ExitCode.INTERNAL


class UsageError(GdnError):
    exit_code = ExitCode.USAGE


class LoadError(GdnError):
    exit_code = ExitCode.LOAD


class ExportFailure(GdnError):
    exit_code = ExitCode.EXPORT


class RunFailure(GdnError):
    """A runtime (onnxruntime, PyTorch) could not run a graph."""
    exit_code = ExitCode.EXPORT


class MismatchError(GdnError):
    exit_code = ExitCode.MISMATCH


class NotChecked(GdnError):
    """A requested check could not run anywhere (no runtime here runs the graphs): not a pass."""
    exit_code = ExitCode.NOT_CHECKED


class TensorRTMissing(GdnError):
    exit_code = ExitCode.NO_TENSORRT


class PluginError(GdnError):
    exit_code = ExitCode.PLUGIN


class TensorRTFailure(GdnError):
    exit_code = ExitCode.TENSORRT


# Warnings that tell a user of our commands nothing they can act on (seen with torch 2.11-2.13 / onnxscript).
_NOISE = (
    (FutureWarning, r".*LeafSpec.*"),
    (UserWarning, r".*The axis name: .* will not be used.*"),
    (UserWarning, r".*torchvision.*"),
    (DeprecationWarning, r".*"),
)
_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "onnxscript", "torch._dynamo")


def quiet_warnings(quiet: bool = False) -> None:
    """Silence the library warnings a command's user cannot act on (all warnings with ``quiet``)."""
    for cat, pattern in _NOISE:
        warnings.filterwarnings("ignore", message=pattern, category=cat)
    if quiet:
        warnings.simplefilter("ignore")
    import torch  # noqa: F401  (torch sets its loggers' levels when imported: set ours after that)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def first_line(e: BaseException, limit: int = 400) -> str:
    text = str(e).strip().splitlines()
    return text[0][:limit] if text else type(e).__name__


def missing_kernel(msg: str, limit: int = 200) -> str | None:
    """What an onnxruntime error says about a kernel its provider lacks, None for any other error: the CUDA
    provider's "Failed to find kernel for <op> ..." at session load (the part that names the op and types, which
    comes after a long source location), or the CPU provider's NOT_IMPLEMENTED line."""
    import re
    m = re.search(r"Failed to find kernel for (\S+).*?ep:'(\w+)'", msg)
    if m:
        types = re.search(r"implemented only for the following types \(((?:tensor\(\w+\),?)+)\), but the node "
                          r"in the model has the following type \((tensor\(\w+\))\)", msg)
        how = f" for {types.group(2)} (it has {types.group(1).rstrip(',')})" if types else ""
        return f"{m.group(2)} has no kernel of {m.group(1)}{how}"[:limit]
    m = re.search(r"\w+ExecutionProvider has no kernel of .*", msg)      # this function's own words, passed on
    if m:
        return m.group(0)[:limit]
    return first_line(Exception(msg), limit) if "NOT_IMPLEMENTED" in msg else None


def _exit_interrupted(prog: str) -> Callable:
    def handler(signum, frame):  # noqa: ARG001
        try:
            sys.stdout.flush()
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        finally:
            os._exit(int(ExitCode.INTERRUPTED))
    return handler


def run_cli(prog: str, fn: Callable[[], int], *, command: bool = False) -> int:
    """Run a command body; map :class:`GdnError` (and anything else) to one stderr line and an exit code.

    Ctrl-C during the body prints ``<prog>: interrupted`` and returns 130. Put everything slow (argument parsing,
    ``import torch``) inside ``fn``. With ``command`` (the process is this command: ``main()`` called without an
    argv), a Ctrl-C after the body, while the interpreter shuts down, also ends in that line and exit code 130
    (a SIGINT handler installed for the rest of the process)."""
    try:
        return int(fn())
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return ExitCode.INTERRUPTED
    except Exception as e:  # noqa: BLE001: one readable line; the exit code says what failed
        if os.environ.get("GDN_DEBUG") == "1":
            traceback.print_exc()
        code = e.exit_code if isinstance(e, GdnError) else ExitCode.INTERNAL
        msg = first_line(e)
        if code == ExitCode.INTERNAL:
            msg = f"{type(e).__name__}: {msg} (a bug in gdn-deploy: rerun with GDN_DEBUG=1 and report the traceback)"
        print(f"{prog}: {_WHAT.get(code, 'error')}: {msg}", file=sys.stderr)
        return int(code)
    finally:
        if command:
            import signal
            import threading
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, _exit_interrupted(prog))
