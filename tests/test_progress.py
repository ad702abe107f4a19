"""gdn_deploy.progress: one throttled line per step; in a log nothing for short steps, then a line per interval; on
a terminal one line redrawn in place and erased at the end; nothing at all when disabled (--quiet)."""
from __future__ import annotations

import io

from gdn_deploy.progress import LOG_INTERVAL, Progress, format_bytes


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_log_form_is_quiet_for_short_steps_then_one_line_per_interval():
    out, clock = io.StringIO(), Clock()
    p = Progress("gdn-export", stream=out, tty=False, clock=clock)
    p.begin("writing weights of prefill")
    for i in range(1, 1000):                        # many updates within the first interval: nothing
        clock.t += (LOG_INTERVAL - 1) / 1000
        p.update(i * 1e6, 18e9)
    assert out.getvalue() == ""
    clock.t += 2
    p.update(9e9, 18e9)
    p.update(9.1e9, 18e9)                           # throttled
    clock.t += LOG_INTERVAL
    p.update(None)                                  # a ticker update repeats the last numbers
    p.end()
    lines = out.getvalue().splitlines()
    assert lines == ["gdn-export: writing weights of prefill 9.0 GB / 18.0 GB (50%) 61 s",
                     "gdn-export: writing weights of prefill 9.1 GB / 18.0 GB (51%) 121 s"]
    assert "\r" not in out.getvalue()


def test_tty_form_redraws_one_line_and_erases_it():
    out, clock = io.StringIO(), Clock()
    p = Progress("gdn-check", stream=out, tty=True, clock=clock)
    p.begin("checking prefill")
    p.update()                                      # first draw at once
    clock.t += 0.1
    p.update()                                      # throttled
    clock.t += 1.0
    p.update()
    p.end()
    text = out.getvalue()
    assert text == ("\rgdn-check: checking prefill ... 0 s\x1b[K" "\rgdn-check: checking prefill ... 1 s\x1b[K"
                    "\r\x1b[K")


def test_step_ticks_without_updates_and_disabled_prints_nothing():
    out = io.StringIO()
    p = Progress("gdn-export", stream=out, tty=False, tick=0.01)
    p.interval = 0.0
    with p.step("tracing prefill (torch.export)"):
        import time
        deadline = time.monotonic() + 5
        while "tracing" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert out.getvalue().startswith("gdn-export: tracing prefill (torch.export) ... ")
    quiet = io.StringIO()
    q = Progress("gdn-export", stream=quiet, tty=True, enabled=False, tick=0.01)
    with q.step("tracing"):
        q.update(5, 10)
    q.clear()
    assert quiet.getvalue() == ""


def test_a_broken_stream_does_not_fail_the_command():
    class Broken(io.StringIO):
        def write(self, s):
            raise OSError("EPIPE")
    p = Progress("gdn-export", stream=Broken(), tty=True)
    p.begin("x")
    p.update(1, 2)
    p.end()
    assert not p.enabled


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 999, 1500, 2.5e6, 17.9e9)] == ["0 B", "999 B", "1.5 kB", "2.5 MB",
                                                                          "17.9 GB"]
