"""The engine's public API: LLMEngine (synchronous steps) and AsyncEngine (asyncio streams)."""

from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine

__all__ = ["AsyncEngine", "LLMEngine"]
