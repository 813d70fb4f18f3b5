"""The policy's service sections: server, auth, cache, embedder, engines, limits."""

import hashlib
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from engine.config import KV_DTYPES, WEIGHT_FORMATS, EngineConfig
from engine.entrypoints.body_limit import DEFAULT_MAX_BODY_BYTES
from gateway.policy.common import StrictModel, between_0_and_1, not_negative, positive
from gateway.policy.tiers import Route, RouteCacheSettings, Strictness


class ServerSettings(StrictModel):
    host: str = "127.0.0.1"
    port: int = 8000
    reload_interval_s: float = 1.0  # how often the policy file's mtime is polled; 0 turns it off
    # SIGTERM: in-flight requests get this long to finish, then the rest are aborted. 25 s:
    # with the abort margin that fits Kubernetes' default 30 s before it kills the pod.
    shutdown_grace_s: float = 25.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413
    # Where gateway replicas share their stats and policy reloads (read at start). None:
    # limits.redis_url, then cache.redis_url; none of the three: this gateway is alone.
    redis_url: str | None = None

    _check_interval = field_validator("reload_interval_s", "shutdown_grace_s")(not_negative)
    _check_body = field_validator("max_body_bytes")(positive)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError("must be between 1 and 65535")
        return value


class ApiKey(StrictModel):
    """One bearer key: the key itself, or its SHA-256 (`tiergate hash-key`) so the policy
    file holds no usable secret."""

    key: str | None = None
    key_sha256: str | None = None
    tenant: str
    tier_override: bool = False  # may this key pick the tier with the x-tiergate-tier header
    name: str | None = None  # its label in spend metrics; None: `sha256:` + 8 hex digits

    @field_validator("key")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("must be 64 hex digits (the output of `tiergate hash-key`)")
        return value.lower() if value is not None else None

    @model_validator(mode="after")
    def _one_of(self) -> "ApiKey":
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("set exactly one of key and key_sha256")
        return self

    def digest(self) -> str:
        return self.key_sha256 or key_digest(self.key.encode())  # type: ignore[union-attr]

    def label(self) -> str:
        return self.name or key_label(self.digest())


def key_label(digest: str) -> str:
    """A key as metrics name it: never the key, a prefix of its hash too short to look up."""
    return "sha256:" + digest[:8]


def key_digest(key: bytes) -> str:
    """How keys are compared: by SHA-256, so a stored hash and a plain key work alike."""
    return hashlib.sha256(key).hexdigest()


def _secret(value: str | None) -> str | None:
    # An empty secret would match an empty bearer token: refuse it rather than open the door.
    if value is not None and not value.strip():
        raise ValueError("must not be empty (leave the key out to disable what it guards)")
    return value


class AuthSettings(StrictModel):
    # keys: every caller needs one of `keys`. none: no auth, every caller is tenant
    # "default"; it must be said explicitly, so an edit that empties `keys` cannot open it.
    mode: Literal["keys", "none"] = "keys"
    keys: list[ApiKey] = []
    admin_key: str | None = None  # None: the /admin API is disabled
    metrics_key: str | None = None  # bearer key for /metrics (the admin key works too)
    # Secret mixed into the cache salt sent to remote engines (HMAC of the tenant), so a
    # salt cannot be guessed from a tenant's name. None: a random one per process.
    cache_salt_secret: str | None = None
    # SQLite file of the keys made with POST /admin/keys when no Redis is set (with one,
    # they live there). None: managed-keys.sqlite3 beside the cache's default file.
    managed_keys_path: str | None = None

    _check_secrets = field_validator("admin_key", "metrics_key", "cache_salt_secret")(_secret)

    @model_validator(mode="after")
    def _keys_match_mode(self) -> "AuthSettings":
        if self.mode == "keys" and not self.keys:
            raise ValueError(
                "no keys: list at least one under auth.keys, or set `mode: none` to serve "
                "without authentication"
            )
        if self.mode == "none" and self.keys:
            raise ValueError("mode none takes no keys: remove them or the mode")
        return self

    def managed_keys_file(self) -> Path:
        path = self.managed_keys_path
        return Path(path).expanduser() if path else default_cache_path("managed-keys.sqlite3")


def default_cache_path(name: str = "semantic-cache.sqlite3") -> Path:
    root = os.environ.get("TIERGATE_CACHE_DIR") or Path.home() / ".cache" / "tiergate"
    return Path(root) / name


class CacheSettings(StrictModel):
    enabled: bool = False
    store: Literal["embedded", "redis"] = "embedded"
    path: str | None = None  # embedded store's SQLite file; None: default_cache_path()
    redis_url: str | None = Field(None, validate_default=True)  # required when store is redis
    redis_prefix: str = "tiergate:cache"  # key prefix: gateways sharing it share entries
    ttl_s: float | None = 3600.0  # entry lifetime, a request's TTL at most; None: never expire
    max_entries: int = 100_000  # beyond it the least recently used entries are evicted
    approximate_above: int = 20_000  # a scope's index turns from exact to IVF above this
    # default cosine floor for candidates: 0.6 lets the verifier see rewordings the embedder
    # ranks low (people's paraphrases: median cosine 0.88, a quarter below 0.8)
    min_similarity: float = 0.6
    # balanced: at most 1% of the people's train must-not pairs, and of a crowded train
    # scope's lookups, served wrong out of fold (strict 0.3%, lenient 3%), for every model
    verifier: Strictness = "balanced"
    # logistic: the vetoes, then a logistic model over cosine and word-alignment features;
    # aligned: the same vetoes, then a logistic model that also reads the embedder's
    # word-piece states (gateway/cache/aligned_verifier.py); nli: aligned's model plus an
    # NLI model's reading of the pair both ways (gateway/cache/nli_verifier.py; serves the
    # most rewordings, costs ~30 ms of a core per pair); pair: most vetoes, then the
    # cross-encoder (gateway/cache/pair_model.py). Figures: docs/cache.md.
    verifier_model: Literal["logistic", "aligned", "nli", "pair"] = "logistic"
    # The verifier's probability a candidate needs, instead of the strictness's own: what
    # `tiergate calibrate-cache` picks for a wrong-hit bound. None: the strictness decides.
    verifier_threshold: float | None = None
    candidates: int = 3  # most candidates the verifier sees per lookup, best first
    # A lookup whose only candidate at or above the floor is one stored question is one
    # pair: true holds it to the verifier's pair-by-pair threshold (lower; picked out of
    # fold on the people's pairs), false to the crowded-scope one. An explicit
    # verifier_threshold holds every lookup. docs/cache.md
    one_candidate_thresholds: bool = True
    # most of a lookup's candidates a verifier's model reads (nli: its NLI passes), past
    # those the vetoes or the nli gate decide; None: every candidate. 1 saves ~40% of
    # nli's passes and serves fewer rewordings where a scope holds many neighbours
    # (docs/cache.md)
    model_reads: int | None = None
    max_temperature: float = 1.0  # answers sampled hotter are not stored

    _check_similarity = field_validator("min_similarity", "verifier_threshold")(between_0_and_1)
    _check_positive = field_validator(
        "ttl_s", "max_entries", "approximate_above", "candidates", "model_reads"
    )(positive)
    _check_temperature = field_validator("max_temperature")(not_negative)

    @field_validator("redis_url")
    @classmethod
    def _redis_needs_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("store") == "redis" and not value:
            raise ValueError("required when store is redis")
        return value

    def sqlite_path(self) -> Path:
        return Path(self.path).expanduser() if self.path else default_cache_path()

    def for_route(self, route: Route | None) -> RouteCacheSettings:
        """A route's effective settings: its overrides, every unset key from this section."""
        overrides = route.cache if route is not None else RouteCacheSettings()
        return RouteCacheSettings(
            enabled=self.enabled and overrides.enabled is not False,
            min_similarity=_first(overrides.min_similarity, self.min_similarity),
            verifier=overrides.verifier or self.verifier,
            verifier_threshold=_first(overrides.verifier_threshold, self.verifier_threshold),
            ttl_s=_first(overrides.ttl_s, self.ttl_s),
        )

    def stores_temperature(self, temperature: float | None) -> bool:
        return temperature is None or temperature <= self.max_temperature


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


class EmbedderSettings(StrictModel):
    model: str = "all-MiniLM-L6-v2"
    batch_size: int = 32
    max_wait_ms: float = 2.0  # micro-batching window, open while requests come together
    backend: Literal["auto", "onnx", "torch"] = "auto"  # auto: ONNX Runtime, else torch
    # Padded tokens per forward pass (rows x longest): bounds one bulk request's memory.
    max_batch_tokens: int = 2048

    _check_batch = field_validator("batch_size", "max_batch_tokens")(positive)
    _check_wait = field_validator("max_wait_ms")(not_negative)


_ENGINE = EngineConfig(model="")  # the engine's own defaults: the one source of them
_MB = 1024 * 1024


class EngineSettings(StrictModel):
    """One in-process engine; deployments name it by its key under `engines`.

    Each field is `engine.config.EngineConfig`'s (defaults included, read from it), with
    the KV budget in MiB; `to_config` is the one mapping, used by the gateway and by
    `tiergate engine` alike.
    """

    model: str | None = None  # bundled name, GGUF path or HF folder; None: the engines key
    kv_cache_mb: int = _ENGINE.kv_cache_bytes // _MB
    page_size: int = _ENGINE.page_size
    max_num_seqs: int = _ENGINE.max_num_seqs
    max_num_batched_tokens: int = _ENGINE.max_num_batched_tokens
    max_waiting: int = _ENGINE.max_waiting
    max_waiting_per_tenant: int | None = _ENGINE.max_waiting_per_tenant  # None: all
    max_model_len: int | None = _ENGINE.max_model_len
    enable_prefix_caching: bool = _ENGINE.enable_prefix_caching
    kv_watermark: float = _ENGINE.kv_watermark  # pages kept free at admission (a fraction)
    kv_reserve_tokens: int = _ENGINE.kv_reserve_tokens  # growth each running request keeps
    num_threads: int | None = _ENGINE.num_threads  # None or "auto": measured at start
    weights: Literal[WEIGHT_FORMATS] = _ENGINE.weights  # projection / LM-head weights
    kv_dtype: Literal[KV_DTYPES] = _ENGINE.kv_dtype  # K/V pool element type

    _check_positive = field_validator(
        "kv_cache_mb",
        "page_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_waiting",
        "max_waiting_per_tenant",
        "max_model_len",
        "num_threads",
    )(positive)
    _check_reserve = field_validator("kv_reserve_tokens")(not_negative)

    @field_validator("num_threads", mode="before")
    @classmethod
    def _auto_threads(cls, value: object) -> object:
        return None if value == "auto" else value

    _check_watermark = field_validator("kv_watermark")(between_0_and_1)

    def to_config(self, name: str) -> EngineConfig:
        """The engine's config; `name` is the model when `model` is not set."""
        same = self.model_dump(exclude={"model", "kv_cache_mb"})
        return EngineConfig(model=self.model or name, kv_cache_bytes=self.kv_cache_mb * _MB, **same)


DEFAULT_MAX_CONCURRENT = 32  # limits.default.max_concurrent when the policy does not set it


class LimitSet(StrictModel):
    """Ceilings for one tenant or one key; a field left out (or null) sets no ceiling."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + completion
    max_concurrent: int | None = None  # requests in flight at once, streams included

    _check_positive = field_validator("requests_per_minute", "tokens_per_minute", "max_concurrent")(
        positive
    )

    def over(self, base: "LimitSet") -> "LimitSet":
        """These limits on top of `base`: fields written here win, even an explicit null."""
        return base.model_copy(update={f: getattr(self, f) for f in self.model_fields_set})

    @property
    def empty(self) -> bool:
        return self.requests_per_minute is self.tokens_per_minute is self.max_concurrent is None


class LimitsSettings(StrictModel):
    """Rate and concurrency limits; see docs/policies.md, "Limits"."""

    # Where the counters live so gateway replicas share them. None: cache.redis_url when
    # that is set, else in this process.
    redis_url: str | None = None
    default: LimitSet = LimitSet()  # every tenant without an entry under `tenants`
    tenants: dict[str, LimitSet] = {}  # per tenant, field by field over `default`
    keys: dict[str, LimitSet] = {}  # per API key, by its SHA-256 hex; on top of its tenant's

    @model_validator(mode="after")
    def _default_share(self) -> "LimitsSettings":
        # Unless the policy says otherwise (`null` lifts it), no tenant holds more than
        # DEFAULT_MAX_CONCURRENT requests at once, so one tenant's flood cannot take every
        # engine slot and queue place from the others.
        if "max_concurrent" not in self.default.model_fields_set:
            share = {"max_concurrent": DEFAULT_MAX_CONCURRENT}
            self.default = self.default.model_copy(update=share)
        return self

    def for_tenant(self, tenant: str) -> LimitSet:
        own = self.tenants.get(tenant)
        return self.default if own is None else own.over(self.default)
