"""Decode-only steps in one C call (engine/csrc/decode_step.c): the model's layers as
the C kernels run them from Python, without the Python in between.

Built once per runner, when every matmul weight is packed in panels (the C kernels are
loaded and the model's widths fit them), fp32 or int8 alike; otherwise `build` returns
None and every step takes the model's own forward.
"""

import ctypes
from collections.abc import Sequence

import torch

from engine.attention import AttentionContext
from engine.block_weights import BlockWeight
from engine.models.llama import LlamaForCausalLM
from engine.ops import NativeOps, Weight, is_panels
from engine.quant import Int8Weight

_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class DecodeModel(ctypes.Structure):
    """Mirrors DecodeModel in decode_step.c."""

    _fields_ = [
        *((name, _I64) for name in ("layers", "hidden", "heads", "kv_heads", "head_dim")),
        *((name, _I64) for name in ("inter", "vocab", "page_size", "page_stride")),
        ("eps", _F32),
        ("attn_scale", _F32),
        *((name, _PTR) for name in ("layer_ptrs", "embed", "final_norm", "head")),
        ("head_scale", _PTR),
        ("head_group", _I64),
        ("int8_path", _I64),
        ("w8a8_path", _I64),
        ("bf16_path", _I64),
        ("kv_bf16", _I64),
    ]


def _ptr(t: Weight | None) -> int:
    """A tensor's address (int8 weights: their values'; blocks: their records'); 0 for None."""
    if isinstance(t, Int8Weight):
        return t.q.data_ptr()
    if isinstance(t, BlockWeight):
        return t.data.data_ptr()
    return 0 if t is None else t.data_ptr()


def _scale_ptr(t: Weight | None) -> int:
    """int8 weights: their row scales' address; blocks: their panel index's; 0 for fp32
    weights (decode_step's flag)."""
    if isinstance(t, BlockWeight):
        return t.panels.data_ptr()
    return t.scale.data_ptr() if isinstance(t, Int8Weight) else 0


def _group(t: Weight | None) -> int:
    """decode_step's flag: a w8a8 weight's group (gemm_w8a8_panels), -1 for bf16 panels
    (gemm_bf16_panels), -2 for blocks (gemm_blocks), else 0."""
    if isinstance(t, BlockWeight):
        return -2
    if isinstance(t, Int8Weight):
        return t.group
    return -1 if t is not None and t.dtype == torch.bfloat16 else 0


class FusedDecode:
    def __init__(
        self,
        kernels: ctypes.CDLL,
        model: LlamaForCausalLM,
        kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.kernels = kernels
        cfg = model.config
        rows = []
        for layer, (k_pool, v_pool) in zip(model.layers, kv_caches, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            projections = [p.packed for p in (attn.qkv_proj, attn.o_proj)]
            projections += [p.packed for p in (mlp.gate_up_proj, mlp.down_proj)]
            rows.append(
                [
                    _ptr(layer.input_layernorm.weight),
                    _ptr(attn.qkv_proj.packed),
                    _ptr(attn.qkv_proj.bias),
                    _ptr(attn.o_proj.packed),
                    _ptr(layer.post_attention_layernorm.weight),
                    _ptr(mlp.gate_up_proj.packed),
                    _ptr(mlp.down_proj.packed),
                    _ptr(k_pool),
                    _ptr(v_pool),
                    *map(_scale_ptr, projections),
                    *map(_group, projections),
                ]
            )
        self._layer_ptrs = torch.tensor(rows, dtype=torch.int64)
        self._keep = (model, kv_caches)  # the addresses above stay valid while we live
        _, kv_heads, page_size, head_dim = kv_caches[0][1].shape
        self.spec = DecodeModel(
            layers=cfg.num_layers,
            hidden=cfg.hidden_size,
            heads=cfg.num_heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            inter=cfg.intermediate_size,
            vocab=cfg.vocab_size,
            page_size=page_size,
            page_stride=kv_caches[0][0].stride(0),
            eps=float(cfg.rms_eps),
            attn_scale=head_dim**-0.5,
            layer_ptrs=self._layer_ptrs.data_ptr(),
            embed=model.embed_tokens.weight.data_ptr(),
            final_norm=model.norm.weight.data_ptr(),
            head=_ptr(model.packed_head),
            head_scale=_scale_ptr(model.packed_head),
            head_group=_group(model.packed_head),
            int8_path=model.ops.int8_code if isinstance(model.ops, NativeOps) else -1,
            w8a8_path=model.ops.w8a8_code if isinstance(model.ops, NativeOps) else 0,
            bf16_path=model.ops.bf16_code if isinstance(model.ops, NativeOps) else 0,
            kv_bf16=int(kv_caches[0][0].dtype == torch.bfloat16),
        )

    @staticmethod
    def build(
        kernels: ctypes.CDLL | None,
        model: LlamaForCausalLM,
        kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> "FusedDecode | None":
        if kernels is None or not is_panels(model.packed_head):
            return None
        if not model.embed_tokens.weight.is_contiguous():
            return None
        for layer in model.layers:
            projections = (*layer.self_attn.children(), *layer.mlp.children())
            if any(not is_panels(p.packed) for p in projections):
                return None  # some width is not a whole number of panel pairs
        return FusedDecode(kernels, model, kv_caches)

    def logits(
        self,
        input_ids: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        workspace: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, vocab] for B decodes (ctx built with the kernels, decodes only), in
        `out` when given (contiguous fp32 [B, vocab]), else in a new tensor."""
        rows = ctx.decode_rows
        assert rows is not None and not ctx.prefills and not ctx.prefix_rows
        s, b = self.spec, input_ids.shape[0]
        cos, sin = rope
        assert workspace.numel() >= self.workspace_floats(b), "workspace too small"
        logits = torch.empty(b, s.vocab) if out is None else out
        assert logits.shape == (b, s.vocab) and logits.is_contiguous()
        assert logits.dtype == torch.float32
        failed = self.kernels.decode_step(
            ctypes.byref(s),
            input_ids.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            b,
            ctx.slot_pages.data_ptr(),
            ctx.slot_offsets.data_ptr(),
            rows.page_table.data_ptr(),
            rows.page_table.shape[1],
            rows.context_lens.data_ptr(),
            logits.data_ptr(),
            workspace.data_ptr(),
        )
        if failed:
            raise MemoryError("decode_step: a kernel could not allocate its scratch")
        return logits

    def workspace_floats(self, batch: int) -> int:
        """decode_step's scratch: x, residual, h, qkv, attention out, gate_up, act."""
        s = self.spec
        return batch * (3 * s.hidden + 2 * (s.heads + s.kv_heads) * s.head_dim + 3 * s.inter)
