"""What a remote deployment receives: an allow-list of request fields, the tenant's salt.

The request models keep unknown fields (clients send vendor extras); forwarding them as
is would let a caller reach upstream features the gateway never checked (`priority`,
`prompt_logprobs`, `chat_template`...). Only the fields below leave the gateway;
the rest are dropped (documented in docs/api.md).

Prefix caches: a vLLM-style server shares KV pages between requests with the same
`cache_salt`. The caller's own salt is never forwarded; the gateway always sets one
derived from the tenant with an HMAC, so tenants never share pages and a salt cannot be
guessed from a tenant's name.
"""

import hashlib
import hmac
import logging
import secrets
from typing import Any

from gateway.backends.base import GenerationRequest

logger = logging.getLogger("tiergate.forward")

# Sampling and tool fields every OpenAI-compatible API takes.
OPENAI_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "n",  # the choices come back with their index (the cache never takes n > 1)
        "logprobs",  # chat: a bool; completions: how many alternatives
        "top_logprobs",
    }
)
# Completions only: a chat request's `best_of` is an unknown extra, dropped like the rest.
COMPLETION_FIELDS = frozenset({"best_of"})
# vLLM's extensions: only servers that speak vLLM's API (`hosted_vllm/`) get them.
VLLM_FIELDS = frozenset({"top_k", "ignore_eos", "continue_final_message", "add_generation_prompt"})
MESSAGE_FIELDS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
# Sent by the backends themselves (model, prompt, stream, salt) or refused at validation.
_OWN_FIELDS = frozenset({"model", "messages", "prompt", "stream", "stream_options", "cache_salt"})
_DEFAULT_ONLY = frozenset({"echo"})  # validated to its default: not sent

SALTED_PROVIDERS = frozenset({"hosted_vllm"})  # servers known to take `cache_salt`
_PROCESS_SECRET = secrets.token_bytes(32)  # when the policy sets no auth.cache_salt_secret


def tenant_cache_salt(tenant: str, secret: str | None) -> str:
    key = secret.encode() if secret is not None else _PROCESS_SECRET
    return hmac.new(key, tenant.encode(), hashlib.sha256).hexdigest()


def sampling_fields(request: GenerationRequest, vllm: bool) -> dict[str, Any]:
    """The caller's allowed fields as set; vLLM's extensions only for a vLLM-style server."""
    body = request.body
    fields = body.model_dump(exclude_unset=True, exclude_none=True)
    allowed = OPENAI_FIELDS | VLLM_FIELDS if vllm else OPENAI_FIELDS
    if not request.is_chat:
        allowed |= COMPLETION_FIELDS
    dropped = sorted(fields.keys() - allowed - _OWN_FIELDS - _DEFAULT_ONLY)
    if dropped:
        logger.debug("request %s: not forwarded: %s", request.request_id, ", ".join(dropped))
    return {k: v for k, v in fields.items() if k in allowed}


def forwarded_messages(request: GenerationRequest) -> list[dict[str, Any]]:
    """Chat messages with their known fields only (clients echo `refusal`, `audio`...)."""
    return [
        m.model_dump(include=MESSAGE_FIELDS, exclude_none=True)
        for m in request.body.messages  # type: ignore[union-attr]
    ]
