"""One-line progress on stderr for long commands (gdn-export of a real-size checkpoint, gdn-check of its folder).

:class:`Progress` shows what the command is doing now and, where it is known, how far it is::

    gdn-export: tracing prefill ... 95 s
    gdn-export: writing weights (prefill) 7.4 / 17.9 GB (41%) 62 s

On a terminal the line is redrawn in place (``\\r``, at most :data:`TTY_INTERVAL` apart) and erased when the step
ends. In a log (stderr not a terminal) a line is printed only after a step has run :data:`LOG_INTERVAL` seconds and
then at most once per :data:`LOG_INTERVAL`: a short export prints nothing, a long one a line a minute.
``Progress(enabled=False)`` (``--quiet``) prints nothing.

A step without a measurable fraction (torch.export, onnxruntime runs) is shown by a ticker thread with its elapsed
time (:meth:`Progress.step`); a step that counts (bytes written) calls :meth:`Progress.update`.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

__all__ = ["Progress", "TTY_INTERVAL", "LOG_INTERVAL", "format_bytes"]

TTY_INTERVAL = 0.5       # seconds between redraws on a terminal
LOG_INTERVAL = 60.0      # seconds between lines in a log (and before the first one)


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


class Progress:
    """Throttled one-line progress of the current step (see the module docstring).

    ``stream`` (default stderr) and ``tty`` (default ``stream.isatty()``) pick the form; ``clock`` is injectable
    for tests. Thread-safe: the ticker of :meth:`step` and :meth:`update` share one lock."""

    def __init__(self, prog: str, *, enabled: bool = True, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, tick: float | None = None):
        self.prog, self.enabled = prog, enabled
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            try:
                tty = bool(self.stream.isatty())
            except (AttributeError, ValueError):
                tty = False
        self.tty, self.clock = tty, clock
        self.interval = TTY_INTERVAL if tty else LOG_INTERVAL
        self.tick = tick if tick is not None else (1.0 if tty else 5.0)
        self._lock = threading.Lock()
        self._label: str | None = None
        self._start = self._last = 0.0
        self._drawn = False            # a tty line is on screen
        self._done = self._total = None
        self._unit = "bytes"

    # -- steps ------------------------------------------------------------------------------------------------
    def begin(self, label: str) -> None:
        with self._lock:
            self._clear()
            self._label, self._start = label, self.clock()
            self._done = self._total = None
            self._last = self._start if not self.tty else self._start - self.interval

    def update(self, done: float | None = None, total: float | None = None, *, unit: str = "bytes",
               force: bool = False) -> None:
        """Report ``done`` of ``total`` for the current step (None: the last ones reported, e.g. from the
        ticker); printed only when the throttle allows."""
        if not self.enabled or self._label is None:
            return
        with self._lock:
            if done is not None:
                self._done, self._total, self._unit = done, total, unit
            done, total, unit = self._done, self._total, self._unit
            now = self.clock()
            if not force and now - self._last < self.interval:
                return
            self._last = now
            self._emit(self._line(now, done, total, unit))

    def end(self) -> None:
        with self._lock:
            self._clear()
            self._label = None

    def clear(self) -> None:
        """Erase a drawn line (before printing something else on the terminal); the next tick redraws it."""
        with self._lock:
            self._clear()

    @contextmanager
    def step(self, label: str) -> Iterator["Progress"]:
        """A step shown with its elapsed time by a ticker thread while the body runs (no fraction known)."""
        self.begin(label)
        stop = threading.Event()
        ticker = None
        if self.enabled:
            def run() -> None:
                while not stop.wait(self.tick):
                    self.update()
            ticker = threading.Thread(target=run, name="gdn-progress", daemon=True)
            ticker.start()
        try:
            yield self
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            self.end()

    # -- output -----------------------------------------------------------------------------------------------
    def _line(self, now: float, done, total, unit: str) -> str:
        text = f"{self.prog}: {self._label}"
        if done is not None:
            fmt = format_bytes if unit == "bytes" else (lambda v: f"{int(v)}")
            text += f" {fmt(done)}"
            if total:
                text += f" / {fmt(total)} ({100 * done / total:.0f}%)"
            if unit != "bytes":
                text += f" {unit}"
        else:
            text += " ..."
        return f"{text} {now - self._start:.0f} s"

    def _emit(self, line: str) -> None:
        try:
            if self.tty:
                self.stream.write("\r" + line + "\x1b[K")
                self._drawn = True
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):        # a closed or broken stderr must not fail the export
            self.enabled = False

    def _clear(self) -> None:
        if self._drawn:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                self.enabled = False
            self._drawn = False
