"""Text of a sequence as its tokens arrive: incremental decoding with stop strings.

:class:`TextStream` decodes a sequence's running ids after every new token (the tokenizer's own decode of the
whole running list, so merges across token boundaries come out as the final decode has them) and emits the new
suffix, holding back what may still change:

- a trailing U+FFFD (an incomplete UTF-8 character of a byte-level tokenizer; the next token may complete it);
- the longest suffix that is a prefix of a stop string (it may become the stop string).

When a stop string appears the sequence ends; its text is everything before the first stop string (the stop
string itself is not part of the text, as in vLLM and onnxruntime-genai's defaults). :meth:`TextStream.finish`
emits what was held back when a sequence ends otherwise. The concatenation of everything emitted equals
:attr:`TextStream.text`, which equals ``decode(ids)`` (cut at the stop string).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ..errors import UsageError

__all__ = ["TextStream", "check_stop_strings", "accept_token"]


def check_stop_strings(stop_strings: Sequence[str]) -> list[str]:
    out = list(stop_strings or [])
    for s in out:
        if not isinstance(s, str) or s == "":
            raise UsageError(f"--stop {s!r}: a stop string must be non-empty text")
    return out


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stop_strings: Sequence[str] = ()):
        self.decode = decode
        self.stops = check_stop_strings(stop_strings)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.ids: list[int] = []
        self.text = ""              # emitted so far
        self.stopped = False
        self._full = ""

    def push(self, token: int) -> str:
        """Add a token; return the newly emitted text ("" while held back). Sets :attr:`stopped` when a stop
        string appeared (the text then ends before it)."""
        if self.stopped:
            raise ValueError("TextStream.push after a stop string ended the sequence")
        self.ids.append(int(token))
        full = self._full = self.decode(self.ids)
        done = len(self.text)
        if self.stops:
            start = max(0, done - self.longest)
            hits = [i for i in (full.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.stopped = True
                return self._emit(full, max(min(hits), done))
        end = len(full)
        while end > done and full[end - 1] == "\ufffd":
            end -= 1
        for k in range(min(self.longest - 1, end - done), 0, -1):
            tail = full[end - k:end]
            if any(s.startswith(tail) for s in self.stops):
                end -= k
                break
        return self._emit(full, end)

    def finish(self) -> str:
        """The held-back rest when the sequence ends without a stop string."""
        return "" if self.stopped else self._emit(self._full, len(self._full))

    def _emit(self, full: str, end: int) -> str:
        piece = full[len(self.text):end]
        self.text += piece
        return piece


def accept_token(i: int, token: int, tokens: list[list[int]], budget: int, eos: set,
                 streams: Optional[Sequence[TextStream]], on_text: Optional[Callable[[int, str], None]]) -> Optional[str]:
    """Prompt i's new token, for the generation loops: appended to ``tokens[i]`` and pushed into its text stream
    (streamed pieces go to ``on_text(i, piece)``) -> None while the sequence goes on, else why it ends ("eos",
    "stop": a stop string, "length": ``budget`` tokens), with its held-back text emitted."""
    tokens[i].append(token)
    if token in eos:
        why = "eos"
    elif streams is not None and _push(streams[i], token, i, on_text):
        why = "stop"
    elif len(tokens[i]) < budget:
        return None
    else:
        why = "length"
    if streams is not None:
        piece = streams[i].finish()
        if piece and on_text is not None:
            on_text(i, piece)
    return why


def _push(stream: TextStream, token: int, i: int, on_text) -> bool:
    piece = stream.push(token)
    if piece and on_text is not None:
        on_text(i, piece)
    return stream.stopped
