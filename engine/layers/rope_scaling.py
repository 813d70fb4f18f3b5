"""Rotary frequencies, with the context-extension scalings a model's files may ask for.

A scaling is kept as a plain dict (it travels as JSON in the weights cache), named as in
Hugging Face's `rope_scaling` / `rope_parameters`:

- `linear`: every frequency divided by `factor` (positions interpolated).
- `llama3`: Llama 3.1's: long wavelengths divided by `factor`, short ones kept, a smooth
  blend between (`low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`).
- `freq_factors`: each frequency divided by its own factor: what llama.cpp's converter
  stores for llama3 (the `rope_freqs` tensor) in place of the four numbers.

Scalings that change with the sequence length (`dynamic`) or also scale attention (`yarn`,
`longrope`) are refused when the model loads: ignoring them would answer, wrongly.
"""

import math
from typing import Any

import torch

RopeScaling = dict[str, Any]
SUPPORTED = ("linear", "llama3", "freq_factors")


class UnsupportedRopeScaling(ValueError):
    pass


def hf_rope_scaling(cfg: dict[str, Any]) -> RopeScaling | None:
    """The scaling a config.json asks for (`rope_scaling`, or transformers 5's
    `rope_parameters`), checked; None for plain rope."""
    raw = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = raw.get("rope_type") or raw.get("type") or "default"
    if kind == "default":
        return None
    if kind == "linear":
        return checked({"rope_type": "linear", "factor": raw.get("factor")})
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor")
        scaling = {"rope_type": "llama3", **{k: raw.get(k) for k in keys}}
        original = raw.get("original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = original
        return checked(scaling)
    raise UnsupportedRopeScaling(_unsupported(kind))


def gguf_rope_scaling(
    meta: dict[str, Any], arch: str, freqs: list[float] | None
) -> RopeScaling | None:
    """The scaling in GGUF metadata: `{arch}.rope.scaling.type` / `.factor` (or the older
    `{arch}.rope.scale_linear`), or per-frequency factors from a `rope_freqs` tensor."""
    if freqs is not None:
        return checked({"rope_type": "freq_factors", "factors": [float(f) for f in freqs]})
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = meta.get(f"{arch}.rope.scaling.factor") or meta.get(f"{arch}.rope.scale_linear")
    if kind == "none" and factor in (None, 0, 1):
        return None
    if kind in ("none", "linear"):  # an old file with only scale_linear means linear
        return checked({"rope_type": "linear", "factor": factor})
    raise UnsupportedRopeScaling(_unsupported(kind))


def _unsupported(kind: str) -> str:
    return f"rope scaling {kind!r} is not supported; supported: {', '.join(SUPPORTED)}"


def checked(scaling: RopeScaling) -> RopeScaling:
    """The scaling with numbers that make sense, or UnsupportedRopeScaling saying which not."""
    kind = scaling["rope_type"]
    if kind == "freq_factors":
        if not scaling["factors"] or not all(f > 0 for f in scaling["factors"]):
            raise UnsupportedRopeScaling("rope_freqs factors must be positive")
        return scaling
    if not isinstance(scaling.get("factor"), int | float) or scaling["factor"] <= 0:
        raise UnsupportedRopeScaling(f"rope scaling {kind!r} needs a positive factor")
    scaling["factor"] = float(scaling["factor"])
    if kind == "llama3":
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        original = scaling["original_max_position_embeddings"]
        if not all(isinstance(v, int | float) for v in (low, high)) or not high > low:
            raise UnsupportedRopeScaling("llama3 needs high_freq_factor > low_freq_factor")
        if not isinstance(original, int) or original <= 0:
            raise UnsupportedRopeScaling("llama3 needs original_max_position_embeddings")
    return scaling


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """theta^(-2i/D) for i < D/2, scaled; float64 on the CPU (the table is built from it)."""
    f64 = {"dtype": torch.float64, "device": "cpu"}
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, **f64) / head_dim)
    if scaling is None:
        return inv_freq
    kind = scaling["rope_type"]
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "freq_factors":
        factors = torch.tensor(scaling["factors"], **f64)
        if factors.shape != inv_freq.shape:
            raise UnsupportedRopeScaling(
                f"rope_freqs has {factors.numel()} factors for {inv_freq.numel()} frequencies"
            )
        return inv_freq / factors
    if kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise UnsupportedRopeScaling(_unsupported(kind))


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Wavelengths longer than the original context are stretched by `factor`; shorter than
    # original / high_freq_factor kept; those between blended linearly in 1/wavelength.
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    original = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq
