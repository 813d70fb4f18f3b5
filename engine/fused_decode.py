"""Decode-only steps in one C call (engine/csrc/decode_step.c): the model's layers as
the C kernels run them from Python, without the Python in between.

Built once per runner, for the architectures whose layer decode_step.c computes (ARCHS:
llama's, with or without a qkv bias) when every matmul weight is packed in panels (the C
kernels are loaded and the model's widths fit them), fp32 or int8 alike; otherwise `build`
returns None and every step takes the model's own forward (a Qwen3 layer's q / k norms,
say, which the C step has not got).
"""

import ctypes
from collections.abc import Sequence

import torch

from engine.attention import AttentionContext
from engine.kv.pages import KV_KINDS
from engine.models.llama import LlamaForCausalLM
from engine.quantization.packing import is_panels

_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
# what decode_step.c's layer is: RMSNorm, fused q|k|v (+ bias), rope, attention, o; RMSNorm,
# fused gate|up, SiLU x up, down. A subclass of LlamaForCausalLM with more is not in here.
ARCHS = ("llama", "qwen2")


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
        ("kv_kind", _I64),
    ]


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


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
            projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            views = [model.ops.method_of(p.packed).decode_view(p.packed) for p in projections]
            (qkv, o, gate_up, down), scales, kinds = zip(*views, strict=True)
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            bias = _ptr(attn.qkv_proj.bias)
            rows.append([_ptr(norms[0]), qkv, bias, o, _ptr(norms[1]), gate_up, down])
            rows[-1] += [_ptr(k_pool), _ptr(v_pool), *scales, *kinds]
        self._layer_ptrs = torch.tensor(rows, dtype=torch.int64)
        self._keep = (model, kv_caches)  # the addresses above stay valid while we live
        _, kv_heads, page_size, head_dim = kv_caches[0][1].shape
        head = model.ops.method_of(model.packed_head).decode_view(model.packed_head)
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
            head=head[0],
            head_scale=head[1],
            head_group=head[2],
            int8_path=model.ops.methods["int8"].code,  # built with the kernels only
            w8a8_path=model.ops.methods["w8a8"].code,
            bf16_path=model.ops.methods["bf16"].code,
            kv_kind=KV_KINDS[kv_caches[0][0].dtype],
        )

    @staticmethod
    def build(
        kernels: ctypes.CDLL | None,
        model: LlamaForCausalLM,
        kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> "FusedDecode | None":
        if model.config.arch not in ARCHS or kernels is None:
            return None
        if not is_panels(model.packed_head) or not model.embed_tokens.weight.is_contiguous():
            return None
        if any(not is_panels(p.packed) for p in model.projections().values()):
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
