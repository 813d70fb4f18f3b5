"""Structured output: constraints (JSON schemas, forced tool calls) compiled into token masks."""
