"""Incremental detokenization with stop strings.

Text is emitted as soon as it is certain: a token that ends inside a multi-byte character
("\\ufffd") waits for the next one, and text that could be the start of a stop string is
held back until it either completes the stop string (then it and all after it are dropped)
or stops matching (then it is emitted). Stop strings are matched across token boundaries.
"""

from typing import Protocol

_CONTEXT_TOKENS = 4  # prompt tokens decoded ahead of the output, for correct leading spaces


class Decoder(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_ids: list[int], stop: list[str]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        if self._ids and tokenizer.decode(self._ids).endswith("\ufffd"):
            self._ids = []  # a context cut inside a character would shift the diff below
        self._prefix_offset = 0  # start of the window re-decoded each step
        self._read_offset = len(self._ids)  # tokens before this are already in self.text
        self._stop = [s for s in stop if s]
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self.text = ""  # output text so far, including held-back text; cut at a stop string
        self._emitted = 0  # characters of self.text already handed out
        self.stopped = False  # a stop string matched

    def add(self, token_id: int) -> str:
        """Feed one generated token; returns the text that became safe to emit."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        return self._append(self._decode_window(final=False), final=False)

    def flush(self) -> str:
        """The request ends for another reason: emit everything still held back."""
        if self.stopped:
            return ""
        return self._append(self._decode_window(final=True), final=True)

    def _decode_window(self, final: bool) -> str:
        window = self._ids[self._prefix_offset :]
        known = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._tokenizer.decode(window)
        if len(full) <= len(known) or (full.endswith("\ufffd") and not final):
            return ""  # nothing new yet, or a character is still incomplete
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(known) :]

    def _append(self, delta: str, final: bool) -> str:
        start = max(0, len(self.text) - self._max_stop + 1)
        self.text += delta
        pos = self._find_stop(start)
        if pos is not None:
            self.text = self.text[:pos]
            self.stopped = True
            return self._emit(pos)
        hold = 0 if final else self._partial_stop_len()
        return self._emit(len(self.text) - hold)

    def _find_stop(self, start: int) -> int | None:
        hits = [p for s in self._stop if (p := self.text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _partial_stop_len(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        for k in range(min(self._max_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return k
        return 0

    def _emit(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted : end]
        self._emitted = end
        return out
