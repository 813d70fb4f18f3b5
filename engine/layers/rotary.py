"""Half-split (NEOX / Hugging Face) rotary embedding: the per-position table and its
application; the frequencies and their scalings are engine/layers/rope_scaling.py's."""

import torch

from engine.layers.direct import Direct
from engine.layers.rope_scaling import RopeScaling, inv_frequencies

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) [T, 1, D/2] for the step's positions


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [T, heads, D] rotated by position (half-split / NEOX layout)."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Rotary(Direct):
    """The cos / sin table of every position, precomputed."""

    def __init__(
        self, head_dim: int, theta: float, scaling: RopeScaling | None, max_position: int
    ) -> None:
        super().__init__()
        # on the CPU: the model is built on the meta device, but this table is not loaded
        inv_freq = inv_frequencies(head_dim, theta, scaling)
        positions = torch.arange(max_position, dtype=torch.float64, device="cpu")
        angles = torch.outer(positions, inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> Rope:
        """cos/sin [T, 1, D/2] for the step's positions: looked up once, used by all layers."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]
