"""Llama-family decoder (llama, qwen2) over paged KV, fp32.

Q/K/V and gate/up projections are fused into one matmul each: at small batch sizes on
CPU, fewer and larger GEMMs run closer to the machine's peak. Every module runs its steps
through the ops object it was built with (engine/ops.py: the C kernels or torch, chosen
once by the runner), which also packs the projections and the LM head (pack_weights) and
binds each projection's matmul to its format's kernel (engine/quantization/matmuls.py).
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engine.attention import AttentionContext, paged_attention
from engine.models.config import ModelConfig
from engine.models.rope import inv_frequencies
from engine.ops import Rope, TorchOps
from engine.quantization.block_weights import BlockWeight
from engine.quantization.packing import Weight, is_panels
from engine.quantization.quant import Int8Weight


class Direct(nn.Module):
    """A module whose calls go straight to forward: nothing here uses hooks, and
    nn.Module.__call__'s bookkeeping costs ~3 us a call (~0.3 s in a 6,000-token run)."""

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)


class Linear(Direct, nn.Linear):
    packed: Weight | None = None  # the weight in ops.pack_weight's layout (and format)
    matmul: Callable[..., torch.Tensor] | None = None  # (x, bias) -> x @ packed.T (+ bias)
    # the GGUF's own blocks of it (w8a8's int8 ones, or "blocks" weights'), until packed
    blocks: Int8Weight | BlockWeight | None = None

    def __init__(self, ops: TorchOps, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.ops = ops

    def pack(self, batch_hint: int) -> None:
        """Pack the weight once (same results); forward uses only the packed copy."""
        if self.packed is None:
            self.packed = self.ops.pack_weight(self.weight, batch_hint, self.blocks)
            self.matmul = self.ops.bound(self.packed)  # its kernel, chosen once
            self.blocks = None

    def drop_plain_weight(self) -> None:
        """Forget .weight when the packed copy is what forward uses and can give it back:
        C GEMM panels (a re-layout) or int8 weights (the format asked for); oneDNN's
        blocked layout is opaque, so that weight stays."""
        if is_panels(self.packed) or isinstance(self.packed, Int8Weight):
            self.weight = None

    def plain_weight(self) -> torch.Tensor:
        """The [out, in] weight forward multiplies by, rebuilt from the packed copy when it
        was dropped (int8: the dequantized weight)."""
        if self.weight is not None:
            return self.weight
        assert self.packed is not None
        return self.ops.method_of(self.packed).plain(self.packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.matmul is None:
            return self.ops.linear(x, self.weight, self.bias)
        return self.matmul(x, self.bias)


KVCache = tuple[torch.Tensor, torch.Tensor]  # (K pool, V pool) of one layer


class RMSNorm(Direct):
    def __init__(self, ops: TorchOps, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.ops = eps, ops

    def forward(self, residual: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """residual += x in place (the residual stream, when x is given), then the norm."""
        return self.ops.add_rms_norm(residual, x, self.weight, self.eps)


class Rotary(Direct):
    """Half-split (NEOX / Hugging Face) rotary embedding with a precomputed table."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # on the CPU: the model is built on the meta device, but this table is not loaded
        inv_freq = inv_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        positions = torch.arange(cfg.max_position, dtype=torch.float64, device="cpu")
        angles = torch.outer(positions, inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> Rope:
        """cos/sin [T, 1, D/2] for the step's positions: looked up once, used by all layers."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


class Attention(Direct):
    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv_out = (self.h + 2 * self.kvh) * self.d
        self.qkv_proj = Linear(ops, cfg.hidden_size, qkv_out, bias=cfg.attention_bias)
        self.o_proj = Linear(ops, self.h * self.d, cfg.hidden_size, bias=False)
        self.ops = ops

    def forward(
        self, x: torch.Tensor, rope: Rope, ctx: AttentionContext, kv: KVCache
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.ops.rope_store_kv(self.qkv_proj(x), rope, kv, ctx, self.h, self.kvh)
        out = paged_attention(q, k, v, kv[0], kv[1], ctx)
        return self.o_proj(out.view(t, self.h * self.d))


class MLP(Direct):
    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = Linear(ops, cfg.hidden_size, 2 * self.inter, bias=False)
        self.down_proj = Linear(ops, self.inter, cfg.hidden_size, bias=False)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_mul(self.gate_up_proj(x)))


class DecoderLayer(Direct):
    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(ops, cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg, ops)
        self.post_attention_layernorm = RMSNorm(ops, cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg, ops)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: Rope,
        ctx: AttentionContext,
        kv: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) -> (mlp output, residual stream); the residual sums are folded
        into the norms (residual None: x is the embedding, the stream starts there)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h = self.input_layernorm(residual, x)
        h = self.post_attention_layernorm(residual, self.self_attn(h, rope, ctx, kv))
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__()
        self.config, self.ops = cfg, ops
        self.rotary = Rotary(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, ops) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(ops, cfg.hidden_size, cfg.rms_eps)
        self.lm_head = None
        self.packed_head: torch.Tensor | None = None  # set by pack_weights
        self.head_blocks: Int8Weight | BlockWeight | None = None  # tied head: embedding's blocks
        if not cfg.tie_embeddings:
            self.lm_head = Linear(ops, cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """input_ids, positions [T] -> final-normed hidden states [T, D]."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary(positions)
        residual = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, ctx, kv)
        return self.norm(residual, x)

    def pack_weights(self, batch_hint: int) -> None:
        """Pack the projections and the LM head (see Linear.pack). The head at batch 24,
        one thread: 23 ms plain vs 17 ms packed for oneDNN."""
        for lin in self._linears():
            lin.pack(batch_hint)
        if self.lm_head is not None:
            self.packed_head = self.lm_head.packed
        elif self.packed_head is None:
            embed, blocks = self.embed_tokens.weight, self.head_blocks
            self.packed_head = self.ops.pack_weight(embed, batch_hint, blocks)
            self.head_blocks = None

    def drop_plain_weights(self) -> None:
        """After pack_weights: forget the plain projections the panels hold (see
        Linear.drop_plain_weight) and copy what stays (embedding, norms, biases) out of
        the weight cache's file mapping, which then closes: the whole fp32 file stops
        counting as resident (SmolLM2: ~1.43 GB -> ~1.0 GB with a 64 MiB pool)."""
        for lin in self._linears():
            lin.drop_plain_weight()
        for param in self.parameters():
            param.data = param.data.clone()

    def _linears(self) -> list[Linear]:
        """The projections of every layer and the untied LM head."""
        return [m for m in self.modules() if isinstance(m, Linear)]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_head is not None:
            return self.ops.linear(hidden, self.packed_head)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return self.ops.linear(hidden, head.weight)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Take Hugging Face names (no "model." prefix), fusing q/k/v and gate/up."""
        fused = {}
        for i in range(self.config.num_layers):
            p = f"layers.{i}."
            qkv = [state.pop(f"{p}self_attn.{n}_proj.weight") for n in "qkv"]
            fused[f"{p}self_attn.qkv_proj.weight"] = torch.cat(qkv)
            if self.config.attention_bias:
                bias = [state.pop(f"{p}self_attn.{n}_proj.bias") for n in "qkv"]
                fused[f"{p}self_attn.qkv_proj.bias"] = torch.cat(bias)
            gate_up = [state.pop(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up")]
            fused[f"{p}mlp.gate_up_proj.weight"] = torch.cat(gate_up)
        state = {**state, **fused}
        if self.lm_head is None:
            state.pop("lm_head.weight", None)
        elif "lm_head.weight" not in state:  # some "untied" exports still omit the head
            state["lm_head.weight"] = state["embed_tokens.weight"]
        self.load_state_dict(state, strict=True, assign=True)  # built on meta
