"""Qwen3 decoder: llama's layer with an RMSNorm on each query and key head before rope
(q_norm / k_norm, weight [head_dim]); no qkv bias. The worked example of
docs/adding-a-model.md."""

from typing import ClassVar

import torch

from engine.layers.norms import HeadRMSNorm
from engine.models.config import ModelConfig
from engine.models.llama import Attention, LlamaForCausalLM
from engine.ops import TorchOps


class Qwen3Attention(Attention):
    def __init__(self, cfg: ModelConfig, ops: TorchOps) -> None:
        super().__init__(cfg, ops)
        self.q_norm = HeadRMSNorm(cfg.head_dim, cfg.rms_eps)
        self.k_norm = HeadRMSNorm(cfg.head_dim, cfg.rms_eps)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        t, q = x.shape[0], self.h * self.d
        self.q_norm(qkv[:, :q].view(t, self.h, self.d))
        self.k_norm(qkv[:, q : q + self.kvh * self.d].view(t, self.kvh, self.d))
        return qkv


class Qwen3ForCausalLM(LlamaForCausalLM):
    architectures: ClassVar[tuple[str, ...]] = ("qwen3",)
    attention: ClassVar[type[Attention]] = Qwen3Attention
