"""The request fields that shape what an answer may be: `tools`, `tool_choice` and
`response_format` (OpenAI's shapes, pydantic only: the gateway validates with them too).

engine/structured_output/constraints.py turns them into what the output must match."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`: OpenAI's structured output (the schema is enforced
    during decoding whether or not `strict` is set)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # BaseModel.schema
    strict: bool | None = None

    @model_serializer(mode="wrap")
    def _as_sent(self, handler: Any) -> dict[str, Any]:
        # forwarded to remote tiers under OpenAI's own name, whatever the dump's by_alias
        out = handler(self)
        if "schema_" in out:
            out["schema"] = out.pop("schema_")
        return out


class ToolChoiceFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`"""

    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("`json_schema` is required when type is json_schema")
        return self
