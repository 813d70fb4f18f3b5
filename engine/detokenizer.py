"""Incremental detokenization with stop strings.

Text is emitted as soon as it is certain: a token that ends inside a multi-byte character
("\\ufffd") waits for the next one, and text that could be the start of a stop string is
held back until it either completes the stop string (then it and all after it are dropped)
or stops matching (then it is emitted). Stop strings are matched across token boundaries,
in O(new text) per token (engine/stop_matcher.py); the first one to complete wins.
"""

from typing import Protocol

from engine.stop_matcher import StopMatcher

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
        self._stop = StopMatcher(stop)
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
        end = self._stop.feed(delta)
        if end is not None:
            pos = len(self.text) + end - self._stop.match_len
            self.text = (self.text + delta)[:pos]
            self.stopped = True
            return self._emit(pos)
        self.text += delta
        hold = 0 if final else self._stop.held
        return self._emit(len(self.text) - hold)

    def _emit(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        out = self.text[self._emitted : end]
        self._emitted = end
        return out
