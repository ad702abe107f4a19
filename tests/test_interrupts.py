"""Ctrl-C (SIGINT) ends every command with one line "<prog>: interrupted" and exit code 130: while torch is being
imported (the first seconds of a command), and after the work is done while the interpreter shuts down."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

if not sys.platform.startswith("linux"):
    pytest.skip("reads /proc/<pid>/maps to see when torch is being loaded", allow_module_level=True)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_when_torch_loads(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Start ``cmd``, send SIGINT as soon as torch's shared library is mapped (torch is being imported), wait."""
    # SIGINT back to its default in the child: a shell without job control starts background jobs (`cmd &`) with
    # SIGINT ignored, and an ignored signal stays ignored across exec, so Python would never see the Ctrl-C
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd,
                         preexec_fn=_default_sigint)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and p.poll() is None:
            try:
                if "libtorch" in Path(f"/proc/{p.pid}/maps").read_text():
                    break
            except OSError:
                pass
            time.sleep(0.02)
        assert p.poll() is None, "the command ended before torch was loaded"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


@pytest.mark.parametrize("prog, cmd", [
    ("gdn-export", [sys.executable, "-m", "gdn_deploy.export.cli", "default", "-o", "out"]),
    ("gdn-check", [sys.executable, "-m", "gdn_deploy.export.check_cli", "default"]),
    ("decode_loop", [sys.executable, str(REPO / "samples" / "decode_loop.py")]),
])
def test_ctrl_c_while_importing_torch_is_one_line_and_130(tmp_path, prog, cmd):
    r = _interrupt_when_torch_loads(cmd, tmp_path)
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert r.stderr == f"{prog}: interrupted\n", r.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_ctrl_c_after_the_work_while_shutting_down_is_one_line_and_130(tmp_path):
    """run_cli(command=True): the body returned (its summary printed); a SIGINT during the interpreter's shutdown
    (here: an exit handler that waits) prints the line and exits 130 instead of dying silently."""
    code = ("import atexit, sys, time\n"
            "from gdn_deploy.errors import run_cli\n"
            "atexit.register(time.sleep, 60)\n"
            "def body():\n"
            "    print('demo: done, PASS', flush=True)\n"
            "    return 0\n"
            "sys.exit(run_cli('demo', body, command=True))\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV, cwd=tmp_path)
    try:
        assert p.stdout.readline() == "demo: done, PASS\n"
        time.sleep(0.5)                   # the body has returned; the process sits in its exit handler
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130 and err == "demo: interrupted\n", (p.returncode, err)


def test_in_process_calls_leave_the_sigint_handler_alone(capsys):
    from gdn_deploy.export.check_cli import main as check_main
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit):
        check_main(["--help"])
    assert check_main(["/nonexistent/folder"]) == 2
    assert signal.getsignal(signal.SIGINT) is before
