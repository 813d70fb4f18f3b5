"""Model classes by architecture name: each class names the architectures it serves."""

import torch
from torch import nn

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.ops import TorchOps

MODELS: dict[str, type[nn.Module]] = {
    arch: cls for cls in (LlamaForCausalLM, Qwen3ForCausalLM) for arch in cls.architectures
}


def build_model(config: ModelConfig, ops: TorchOps) -> nn.Module:
    """An uninitialised model of the config's architecture (weights come from load_weights)
    that runs its steps through ops."""
    # The meta device skips random init of hundreds of MB that load_weights overwrites anyway.
    with torch.device("meta"):
        model = MODELS[config.arch](config, ops)
    return model
