"""Constrained decoding with llguidance: a Constraint becomes a token matcher per request.

A constraint compiles once per distinct content (cached by its hash) into a template
LLMatcher; each request gets its own copy, made when the request is added, off the step
loop (deep_copy is cheap; compiling a schema is not). In a step the runner has each
constrained request's matcher fill its row of a token bitmask and sets every token the
grammar forbids to -inf, other rows untouched; the engine advances the request's
matcher with each token it accepts and ends the request once the grammar is complete.

Schemas are checked against their JSON Schema meta-schema first, so an error names the
offending place (`response_format.json_schema.schema.properties.age.minimum`); what the
meta-schema allows but llguidance cannot enforce is refused with llguidance's message
(never a panic's text). A compile costs seconds and megabytes as a schema grows, so its
size is capped (bytes, properties, nesting, forced functions) before any work, and the
cache of compiled templates is bounded by their estimated bytes as well as their number.
"""

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance
import numpy as np
import torch
from jsonschema import Draft202012Validator, SchemaError, validators

from engine.errors import InvalidParamError
from engine.structured_output.constraints import (
    CLOSE,
    OPEN,
    Constraint,
    JsonConstraint,
    SchemaSource,
    ToolCallConstraint,
)

# Compact JSON as models write it (`{"a": 1, "b": 2}`): no free whitespace, which a small
# model could otherwise repeat until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CACHE_SIZE = 128  # compiled constraints kept (least recently used go first)
CACHE_BYTES = 128 << 20  # and their estimated size (see _template_bytes)
# What one request may ask to compile: ~1 s and ~15 MB on a laptop core at these bounds
# (a 3,000-property schema took 2.8 s, most of it in the meta-schema check; 2,000 forced
# functions overflow llguidance's symbol table).
MAX_SCHEMA_BYTES = 64 << 10  # the JSON text of all the request's schemas together
MAX_PROPERTIES = 1000  # object properties declared, all schemas and nesting levels together
# in one object: llguidance's parser allows 2,000 items in a row, ~4 per optional property,
# and a wider object fails only once decoding reaches it
MAX_OBJECT_PROPERTIES = 400
MAX_DEPTH = 32  # nested objects / arrays in one schema
MAX_FUNCTIONS = 128  # functions a forced tool call may choose from (OpenAI's tools limit)
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)  # errors without grammar internals
_SHIFTS = np.arange(32, dtype=np.uint32)


class GrammarState:
    """One request's position in its grammar. Used by the step loop thread only."""

    def __init__(self, matcher: llguidance.LLMatcher, mask_words: int) -> None:
        self.matcher = matcher
        self.mask_words = mask_words  # int32 words of its token bitmask

    def accept(self, token: int) -> bool:
        """Advance past a sampled token; True when the grammar is complete."""
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"token {token} breaks the grammar: {self.matcher.get_error()}")
        return self.matcher.is_stopped()


class GrammarCompiler:
    """Compiles constraints for one tokenizer; thread-safe (requests are added from any)."""

    def __init__(self, tokenizer: Any, vocab_size: int, cache_bytes: int = CACHE_BYTES) -> None:
        self._tokenizer = tokenizer  # engine.tokenizer.Tokenizer
        self._vocab_size = vocab_size  # the logits' width
        self._ll: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[llguidance.LLMatcher, int]] = OrderedDict()
        self._cache_budget = cache_bytes
        self.cached_bytes = 0  # the estimated size of the templates in the cache

    def cached_state(self, constraint: Constraint) -> GrammarState | None:
        """A fresh matcher from the cache (cheap: no compile), or None."""
        key = _key(constraint)
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return None
            self._cache.move_to_end(key)
            return self._state(entry[0])

    def state_for(self, constraint: Constraint) -> GrammarState:
        """A fresh matcher for one request; InvalidParamError names a bad schema's field."""
        if (state := self.cached_state(constraint)) is not None:
            return state
        check_size(constraint)
        template, size = self._compile(constraint)  # unlocked: other requests need not wait
        with self._lock:
            key = _key(constraint)
            if key not in self._cache:
                self._cache[key] = (template, size)
                self.cached_bytes += size
            while len(self._cache) > 1 and (
                len(self._cache) > _CACHE_SIZE or self.cached_bytes > self._cache_budget
            ):
                _, (_, dropped) = self._cache.popitem(last=False)
                self.cached_bytes -= dropped
            return self._state(template)

    def _state(self, template: llguidance.LLMatcher) -> GrammarState:
        return GrammarState(template.deep_copy(), (self._vocab_size + 31) // 32)

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (about a second for a 150k vocabulary), then kept."""
        with self._lock:
            if self._ll is None:
                tok = self._tokenizer
                self._ll = llguidance.LLTokenizer(
                    tok.backend.to_str(),
                    n_vocab=self._vocab_size,
                    eos_token=sorted(tok.eos_token_ids),
                )
            return self._ll

    def _compile(self, constraint: Constraint) -> tuple[llguidance.LLMatcher, int]:
        """The template matcher and its estimated size in bytes."""
        try:
            ll = self.ll_tokenizer()
        except Exception as exc:  # a tokenizer llguidance cannot read: refuse, stay up
            field = "response_format" if isinstance(constraint, JsonConstraint) else "tool_choice"
            message = f"{field} cannot be enforced with this model's tokenizer: {exc}"
            raise InvalidParamError(field, message) from exc
        if isinstance(constraint, JsonConstraint):
            _, grammar = self._checked(constraint.source, ll)
            param = constraint.source.param
        else:
            grammar = llguidance.LLMatcher.grammar_from_lark(self._tool_lark(constraint, ll))
            param = "tools"
        matcher = llguidance.LLMatcher(ll, grammar, log_level=0, limits=_LIMITS)
        probe = matcher.deep_copy()  # some grammars fail only at their first mask
        probe.compute_bitmask()  # (a schema that is nothing but a reference to itself)
        if matcher.is_error() or probe.is_error():
            reason = _reason(matcher.get_error() or probe.get_error())
            raise InvalidParamError(param, f"{param}: no output can satisfy it ({reason})")
        return matcher, _template_bytes(grammar)

    def _checked(
        self, source: SchemaSource, ll: llguidance.LLTokenizer
    ) -> tuple[dict[str, Any], str]:
        """The schema and its grammar, once both the meta-schema and llguidance accept it."""
        schema = json.loads(source.schema)
        if not isinstance(schema, dict):
            raise InvalidParamError(source.param, f"{source.param}: a schema must be an object")
        check_shape(schema, source.param)
        try:
            meta = validators.validator_for(schema, default=Draft202012Validator)
        except Exception:  # e.g. a `$schema` that is not a string
            where = f"{source.param}.$schema"
            raise InvalidParamError(where, f"{where}: not a known JSON Schema dialect") from None
        try:
            meta.check_schema(schema)
        except SchemaError as exc:
            where = source.param + "".join(
                f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path
            )
            raise InvalidParamError(where, f"{where}: invalid JSON schema: {exc.message}") from None
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                grammar, ll, limits=_LIMITS
            )
        except ValueError as exc:
            is_error, messages = True, [str(exc)]
        if is_error:
            reason = _reason(messages[0] if messages else "")
            message = f"{source.param}: this schema cannot be enforced: {reason}"
            raise InvalidParamError(source.param, message)
        return schema, grammar

    def _tool_lark(self, constraint: ToolCallConstraint, ll: llguidance.LLTokenizer) -> str:
        """Qwen2.5's (Hermes') format: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
        </tool_call>`, calls separated by a newline; the tags as the model's own tokens
        when its vocabulary has them."""
        rules = []
        for i, (name, source) in enumerate(constraint.functions):
            params = dict(self._checked(source, ll)[0])
            # `#/$defs/...` references point at the root: the definitions move up to it
            defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
            call = {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
                "x-guidance": JSON_OPTIONS,
                **defs,
            }
            rules.append(f"fn_{i}: %json {json.dumps(call, ensure_ascii=False)}")
        names = " | ".join(f"fn_{i}" for i in range(len(rules)))
        repeat = ' ("\\n" call)*' if constraint.parallel else ""
        head = [
            f"start: call{repeat}",
            f'call: {self._tag(OPEN, ll)} "\\n" ({names}) "\\n" {self._tag(CLOSE, ll)}',
        ]
        return "\n".join(head + rules) + "\n"

    def _tag(self, text: str, ll: llguidance.LLTokenizer) -> str:
        token = self._tokenizer.backend.token_to_id(text)
        if token is not None and ll.is_special_token(token):
            return text  # lark's special-token syntax: <tool_call>
        return json.dumps(text)


def _key(constraint: Constraint) -> str:
    return hashlib.sha256(repr(constraint).encode()).hexdigest()


def _template_bytes(grammar: str) -> int:
    # Measured: resident memory grows ~100 bytes per character of the grammar's text
    # (10.6 MB for a 3,000-property schema's 103k), plus a fixed part per matcher.
    return (256 << 10) + 128 * len(grammar)


def _reason(message: str) -> str:
    """llguidance's first line, unless it is the library's own failure (a Rust panic or
    assertion): that says nothing the client can act on, and names internals."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    if not line or "panic" in line or "assert" in line:
        return "the grammar is too large or complex to enforce"
    return line


def check_size(constraint: Constraint) -> None:
    """Refuse what would take too long or too much memory to compile, before any work."""
    if isinstance(constraint, JsonConstraint):
        sources, param = [constraint.source], constraint.source.param
    else:
        sources, param = [source for _, source in constraint.functions], "tools"
        if len(sources) > MAX_FUNCTIONS:
            message = f"tools: a forced call can choose from at most {MAX_FUNCTIONS} functions"
            raise InvalidParamError(param, f"{message} ({len(sources)} given)")
    size = sum(len(source.schema.encode()) for source in sources)
    if size > MAX_SCHEMA_BYTES:
        message = f"{param}: schemas of at most {MAX_SCHEMA_BYTES} bytes can be enforced"
        raise InvalidParamError(param, f"{message} ({size} given)")
    try:
        counts = [_properties(json.loads(source.schema)) for source in sources]
    except RecursionError:
        message = f"{param}: schemas nested at most {MAX_DEPTH} levels deep can be enforced"
        raise InvalidParamError(param, message) from None
    properties, widest = sum(c[0] for c in counts), max((c[1] for c in counts), default=0)
    if properties > MAX_PROPERTIES:
        message = f"{param}: schemas of at most {MAX_PROPERTIES} properties can be enforced"
        raise InvalidParamError(param, f"{message} ({properties} given)")
    if widest > MAX_OBJECT_PROPERTIES:
        message = f"{param}: objects of at most {MAX_OBJECT_PROPERTIES} properties can be enforced"
        raise InvalidParamError(param, f"{message} ({widest} in one)")


def _properties(schema: Any) -> tuple[int, int]:
    """Object properties declared anywhere in the schema, and the most in one object
    (iterative: nesting is unbounded here)."""
    count, widest, todo = 0, 0, [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                count += len(node["properties"])
                widest = max(widest, len(node["properties"]))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return count, widest


def check_shape(schema: dict[str, Any], param: str) -> None:
    """Nesting the meta-schema check and the compiler would recurse through: bounded."""
    todo: list[tuple[Any, int]] = [(schema, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            message = f"{param}: schemas nested at most {MAX_DEPTH} levels deep can be enforced"
            raise InvalidParamError(param, message)
        children = node.values() if isinstance(node, dict) else node
        todo.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


def mask_logits(logits: torch.Tensor, states: list[GrammarState | None]) -> None:
    """Set every token a row's grammar forbids to -inf, in place (rows without: untouched).

    A handful of rows: each matcher fills its bitmask row directly (llguidance's thread
    pool costs more than it saves here), and only the smaller of the allowed and forbidden
    sets is touched, found word by word (most words are all 0 or all 1 bits): a full-width
    boolean pass over the vocabulary would cost more than computing the mask."""
    rows = [i for i, s in enumerate(states) if s is not None]
    if not rows:
        return
    words = states[rows[0]].mask_words  # type: ignore[union-attr]
    bitmask = torch.full((len(rows), words), -1, dtype=torch.int32)
    for j, i in enumerate(rows):
        target = bitmask[j]
        states[i].matcher.unsafe_compute_mask_ptr(target.data_ptr(), words * 4)  # type: ignore[union-attr]
    for j, i in enumerate(rows):
        _mask_row(logits[i], bitmask[j].numpy().view(np.uint32))


def _mask_row(row: torch.Tensor, words: np.ndarray) -> None:
    """-inf where the bitmask `words` has a 0 bit (and past its end)."""
    vocab = row.shape[0]
    some_allowed = np.flatnonzero(words)
    some_forbidden = np.flatnonzero(~words)
    if len(some_allowed) <= len(some_forbidden):  # e.g. between JSON values
        ids = torch.from_numpy(_set_bits(words, some_allowed))
        ids = ids[ids < vocab]
        kept = row[ids]
        row.fill_(float("-inf"))
        row[ids] = kept
        return
    ids = torch.from_numpy(_set_bits(~words, some_forbidden))
    row[ids[ids < vocab]] = float("-inf")
    row[32 * len(words) :] = float("-inf")  # a padded vocabulary: no grammar knows these


def _set_bits(words: np.ndarray, which: np.ndarray) -> np.ndarray:
    """Token ids of the 1 bits in words[which] (bit j of word w is token 32w + j)."""
    bits = (words[which, None] >> _SHIFTS) & 1
    word, bit = np.nonzero(bits)
    return (which[word] * 32 + bit).astype(np.int64)
