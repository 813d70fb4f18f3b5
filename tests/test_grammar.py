"""engine/structured_output/grammar.py and constraints.py without a model: what each compiled
constraint lets through, token by token, with the real SmolLM2 and Qwen2.5 tokenizers,
and how its bitmask lands on a batch of logits."""

import json
from typing import Any

import pytest
import torch

from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.errors import InvalidParamError
from engine.model_registry import resolve_model
from engine.structured_output.constraints import (
    JsonConstraint,
    SchemaSource,
    ToolCallConstraint,
    constraint_of,
)
from engine.structured_output.grammar import GrammarCompiler, GrammarState, mask_logits
from engine.tokenizer import Tokenizer, load_tokenizer
from tests.fake_runner import FakeTokenizer

POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["smollm2-135m", "qwen2.5-coder-0.5b"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return load_tokenizer(resolve_model(request.param))


@pytest.fixture(scope="module")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size)


def follows(state: GrammarState, tokenizer: Tokenizer, text: str) -> bool | None:
    """True: the text completes the grammar; False: it is a proper prefix; None: refused."""
    done = False
    for token in tokenizer.encode(text):
        try:
            done = state.accept(token)
        except RuntimeError:
            return None
    return done


def json_state(compiler: GrammarCompiler, schema: dict[str, Any]) -> GrammarState:
    return compiler.state_for(JsonConstraint(SchemaSource(json.dumps(schema), "response_format")))


def tools_state(
    compiler: GrammarCompiler, parallel: bool, schemas: dict[str, dict[str, Any]]
) -> GrammarState:
    functions = tuple(
        (name, SchemaSource(json.dumps(s), f"tools[{i}].function.parameters"))
        for i, (name, s) in enumerate(schemas.items())
    )
    return compiler.state_for(ToolCallConstraint(functions, parallel))


def test_a_json_schema_admits_exactly_its_documents(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    assert follows(json_state(compiler, POINT), tokenizer, '{"x": 1, "y": -2}') is True
    assert follows(json_state(compiler, POINT), tokenizer, '{"x": 1') is False
    assert follows(json_state(compiler, POINT), tokenizer, '{"x": 1, "z": 2}') is None
    assert follows(json_state(compiler, POINT), tokenizer, '{"x": "1", "y": 2}') is None
    assert follows(json_state(compiler, POINT), tokenizer, 'Sure! {"x": 1, "y": 2}') is None


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def test_tool_calls_name_a_declared_function_with_matching_arguments(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    schemas = {"move": POINT, "stop": {"type": "object", "properties": {}}}
    one, two = tool_call("move", {"x": 1, "y": 2}), tool_call("stop", {})
    assert follows(tools_state(compiler, False, schemas), tokenizer, one) is True
    assert follows(tools_state(compiler, True, schemas), tokenizer, f"{one}\n{two}") is False
    assert follows(tools_state(compiler, False, schemas), tokenizer, f"{one}\n{two}") is None
    assert follows(tools_state(compiler, False, schemas), tokenizer, tool_call("jump", {})) is None
    bad_args = tool_call("move", {"x": 1})
    assert follows(tools_state(compiler, False, schemas), tokenizer, bad_args) is None
    assert follows(tools_state(compiler, False, schemas), tokenizer, "I will call move") is None


def test_parallel_calls_may_end_after_each_complete_call(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    """Issue 23 (a): after every closed call the model may stop (an end-of-sequence token
    is allowed), inside a call it may not."""
    state = tools_state(compiler, True, {"move": POINT})
    one = tool_call("move", {"x": 1, "y": 2})
    cut = one.index("}") + 1  # inside the call: its arguments closed, the call not
    for text, may_end in ((one[:cut], False), (one[cut:], True), (f"\n{one}", True)):
        for token in tokenizer.encode(text):
            state.accept(token)
        logits = torch.zeros(1, tokenizer.vocab_size)
        mask_logits(logits, [state])
        allowed = set((logits[0] == 0).nonzero()[:, 0].tolist())
        assert bool(allowed & set(tokenizer.eos_token_ids)) is may_end


def test_the_tags_are_the_models_own_tokens_when_it_has_them(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    state = tools_state(compiler, False, {"stop": {"type": "object"}})
    first = tokenizer.encode("<tool_call>")
    allowed = torch.zeros(1, tokenizer.vocab_size)
    mask_logits(allowed, [state])
    ok = (allowed[0] == 0).nonzero()[:, 0].tolist()
    if len(first) == 1:  # Qwen2.5: one token, and the only way in
        assert ok == first
    else:  # SmolLM2: spelled out
        assert first[0] in ok


def test_parameters_with_local_definitions(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    schema = {
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/point"}},
        "required": ["at"],
        "$defs": {"point": POINT},
    }
    state = tools_state(compiler, False, {"go": schema})
    text = tool_call("go", {"at": {"x": 3, "y": 4}})
    assert follows(state, tokenizer, text) is True


@pytest.mark.parametrize(
    ("schema", "param"),
    [
        ({"type": "object", "properties": {"a": {"minimum": "x"}}}, "p.properties.a.minimum"),
        ({"type": "array", "items": [{"type": 3}]}, "p.items"),
        ({"type": "string", "pattern": "(?<=a)b"}, "p"),  # valid, but not enforceable
        ({"$ref": "#/$defs/missing"}, "p"),
        ({"$ref": "#"}, "p"),  # nothing but itself: no document satisfies it
        ({"$schema": 5}, "p.$schema"),
    ],
)
def test_bad_schemas_name_their_place(
    compiler: GrammarCompiler, schema: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidParamError) as info:
        compiler.state_for(JsonConstraint(SchemaSource(json.dumps(schema), "p")))
    assert info.value.param.startswith(param)
    assert str(info.value).startswith(info.value.param)


def test_masks_touch_only_constrained_rows(compiler: GrammarCompiler) -> None:
    vocab = compiler._vocab_size
    logits = torch.randn(3, vocab + 64)  # a model's padded vocabulary is wider
    before = logits.clone()
    mask_logits(logits, [None, json_state(compiler, POINT), None])
    assert torch.equal(logits[[0, 2]], before[[0, 2]])
    allowed = torch.isfinite(logits[1])
    assert 0 < int(allowed.sum()) < vocab and not bool(allowed[vocab:].any())
    assert torch.equal(logits[1][allowed], before[1][allowed])


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": POINT}},
    {"type": "function", "function": {"name": "b"}},
]


def test_which_requests_are_constrained() -> None:
    assert constraint_of(chat()) is None
    assert constraint_of(chat(response_format={"type": "text"})) is None
    assert constraint_of(chat(tools=TOOLS, tool_choice="auto")) is None
    assert constraint_of(chat(tools=TOOLS)) is None
    json_mode = constraint_of(chat(response_format={"type": "json_object"}))
    assert isinstance(json_mode, JsonConstraint)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": POINT}}
    schema = constraint_of(chat(response_format=fmt))
    assert isinstance(schema, JsonConstraint) and json.loads(schema.source.schema) == POINT
    forced = constraint_of(chat(tools=TOOLS, tool_choice="required", response_format=fmt))
    assert isinstance(forced, ToolCallConstraint) and forced.parallel
    assert [name for name, _ in forced.functions] == ["a", "b"]
    assert forced.functions[1][1].param == "tools[1].function.parameters"
    named = {"type": "function", "function": {"name": "b"}}
    one = constraint_of(chat(tools=TOOLS, tool_choice=named, parallel_tool_calls=False))
    assert isinstance(one, ToolCallConstraint) and not one.parallel
    assert [name for name, _ in one.functions] == ["b"]
    # a named choice makes one call unless parallel calls are asked for outright (#23)
    default = constraint_of(chat(tools=TOOLS, tool_choice=named))
    assert isinstance(default, ToolCallConstraint) and not default.parallel
    several = constraint_of(chat(tools=TOOLS, tool_choice=named, parallel_tool_calls=True))
    assert isinstance(several, ToolCallConstraint) and several.parallel


def test_a_tokenizer_llguidance_cannot_read_refuses_the_request() -> None:
    compiler = GrammarCompiler(FakeTokenizer(), 261)  # no `tokenizers` backend to hand over
    with pytest.raises(InvalidParamError) as info:
        compiler.state_for(JsonConstraint(SchemaSource(json.dumps(POINT), "response_format")))
    assert info.value.param == "response_format"
    tools = ToolCallConstraint((("f", SchemaSource("{}", "tools[0].function.parameters")),), True)
    with pytest.raises(InvalidParamError) as info:
        compiler.state_for(tools)
    assert info.value.param == "tool_choice"


def schema_of(properties: int, prefix: str = "p") -> JsonConstraint:
    props = {f"{prefix}{i}": {"type": "integer"} for i in range(properties)}
    return JsonConstraint(SchemaSource(json.dumps({"type": "object", "properties": props}), "rf"))


@pytest.mark.parametrize(
    ("constraint", "says"),
    [
        (schema_of(1001), "at most 1000 properties can be enforced (1001 given)"),
        (schema_of(3000), "at most 65536 bytes can be enforced"),
        (schema_of(401), "objects of at most 400 properties can be enforced (401 in one)"),
    ],
)
def test_schemas_past_the_size_caps_are_refused_before_compiling(
    compiler: GrammarCompiler, constraint: JsonConstraint, says: str
) -> None:
    """#29.6: what would compile for seconds (a 3,000-property schema took 2.8 s) or
    overflow llguidance is refused first, with our message naming the limit."""
    with pytest.raises(InvalidParamError) as info:
        compiler.state_for(constraint)
    assert info.value.param == "rf" and says in str(info.value)


def test_the_widest_object_allowed_decodes(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    """500 optional properties compiled, then failed at the first token (llguidance's
    2,000 items in a parser row): the cap keeps every admitted object decodable."""
    state = compiler.state_for(schema_of(400))
    assert follows(state, tokenizer, '{"p5": 3, "p399": 4}') is True


def test_deep_nesting_and_many_forced_functions_are_refused(compiler: GrammarCompiler) -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidParamError) as info:
        json_state(compiler, deep)
    assert "at most 32 levels deep" in str(info.value)
    with pytest.raises(InvalidParamError) as info:
        tools_state(compiler, True, {f"f{i}": {"type": "object"} for i in range(2000)})
    assert info.value.param == "tools" and "at most 128 functions (2000 given)" in str(info.value)


def test_the_cache_is_bounded_by_bytes(tokenizer: Tokenizer) -> None:
    """#29.6: compiled templates are kept within a byte budget (the least recently used go),
    not only by count: large schemas once kept ~30 MB each, 128 of them."""
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size, cache_bytes=4 << 20)
    schemas = [schema_of(200, prefix=f"s{k}_") for k in range(6)]
    for schema in schemas:
        compiler.state_for(schema)
        assert compiler.cached_bytes <= 4 << 20
    assert compiler.cached_state(schemas[-1]) is not None
    assert compiler.cached_state(schemas[0]) is None  # evicted for the budget


def test_library_failures_never_reach_the_client() -> None:
    """A Rust panic's text says nothing a client can act on and names internals."""
    from engine.structured_output.grammar import _reason

    panic = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10"
    assert _reason(panic) == "the grammar is too large or complex to enforce"
    assert (
        _reason("unsupported pattern: look-behind\nat line 3") == "unsupported pattern: look-behind"
    )
