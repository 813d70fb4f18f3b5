"""Llama-family decoder (llama, qwen2) over paged KV, fp32; a family that differs in one
step subclasses it (models/qwen3.py: Attention.project), built of engine/layers/.

Q/K/V and gate/up projections are fused into one matmul each: at small batch sizes on
CPU, fewer and larger GEMMs run closer to the machine's peak. Every module runs its steps
through the ops object it was built with (engine/ops.py: the C kernels or torch, chosen
once by the runner), which also packs the projections and the LM head (pack_weights) and
binds each projection's matmul to its format's kernel (engine/quantization/matmuls.py).
"""

from typing import ClassVar

import torch
from torch import nn

from engine.attention import AttentionContext, paged_attention
from engine.layers.direct import Direct
from engine.layers.linear import Linear
from engine.layers.norms import RMSNorm
from engine.layers.rotary import Rope, Rotary
from engine.models.config import ModelConfig
from engine.ops import TorchOps
from engine.quantization.block_weights import BlockWeight
from engine.quantization.quant import Int8Weight

KVCache = tuple[torch.Tensor, torch.Tensor]  # (K pool, V pool) of one layer


class Attention(Direct):
    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, kv = self.h * self.d, self.kvh * self.d
        parts = (("q_proj", q), ("k_proj", kv), ("v_proj", kv))
        self.qkv_proj = Linear(ops, cfg.hidden_size, q + 2 * kv, cfg.attention_bias, parts)
        self.o_proj = Linear(ops, self.h * self.d, cfg.hidden_size, bias=False)
        self.ops = ops

    def forward(
        self, x: torch.Tensor, rope: Rope, ctx: AttentionContext, kv: KVCache
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.ops.rope_store_kv(self.project(x), rope, kv, ctx, self.h, self.kvh)
        out = paged_attention(q, k, v, kv[0], kv[1], ctx)
        return self.o_proj(out.view(t, self.h * self.d))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> q|k|v [T, (heads + 2 kv_heads) * D], before rope."""
        return self.qkv_proj(x)


class MLP(Direct):
    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        parts = (("gate_proj", self.inter), ("up_proj", self.inter))
        self.gate_up_proj = Linear(ops, cfg.hidden_size, 2 * self.inter, False, parts)
        self.down_proj = Linear(ops, self.inter, cfg.hidden_size, bias=False)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_mul(self.gate_up_proj(x)))


class DecoderLayer(Direct):
    def __init__(self, cfg: ModelConfig, ops: TorchOps, attention: type[Attention]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(ops, cfg.hidden_size, cfg.rms_eps)
        self.self_attn = attention(cfg, ops)
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
    architectures: ClassVar[tuple[str, ...]] = ("llama", "qwen2")  # served (models/__init__)
    attention: ClassVar[type[Attention]] = Attention  # a family's own attention subclasses it

    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__()
        self.config, self.ops = cfg, ops
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layers = (DecoderLayer(cfg, ops, self.attention) for _ in range(cfg.num_layers))
        self.layers = nn.ModuleList(layers)
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

    def projections(self) -> dict[str, Linear]:
        """Every layer's projections by module name (engine/layers/linear.py)."""
        return {n: m for n, m in self.named_modules() if isinstance(m, Linear) and n != "lm_head"}

    def _linears(self) -> list[Linear]:
        """The projections of every layer and the untied LM head."""
        return [m for m in self.modules() if isinstance(m, Linear)]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_head is not None:
            return self.ops.linear(hidden, self.packed_head)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return self.ops.linear(hidden, head.weight)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Take Hugging Face names (no "model." prefix), fusing each projection's parts."""
        fused = {}
        for name, lin in self.projections().items():
            if not lin.parts:
                continue
            sources = [source for source, _ in lin.sources(name)]
            fused[f"{name}.weight"] = torch.cat([state.pop(f"{s}.weight") for s in sources])
            if lin.bias is not None:
                fused[f"{name}.bias"] = torch.cat([state.pop(f"{s}.bias") for s in sources])
        state = {**state, **fused}
        if self.lm_head is None:
            state.pop("lm_head.weight", None)
        elif "lm_head.weight" not in state:  # some "untied" exports still omit the head
            state["lm_head.weight"] = state["embed_tokens.weight"]
        self.load_state_dict(state, strict=True, assign=True)  # built on meta
