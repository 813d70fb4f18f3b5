"""Model classes by architecture name."""

import torch
from torch import nn

from engine.models.config import SUPPORTED_ARCHS, ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.ops import TorchOps

MODELS: dict[str, type[nn.Module]] = dict.fromkeys(SUPPORTED_ARCHS, LlamaForCausalLM)


def build_model(config: ModelConfig, ops: TorchOps) -> nn.Module:
    """An uninitialised model of the config's architecture (weights come from load_weights)
    that runs its steps through ops."""
    # The meta device skips random init of hundreds of MB that load_weights overwrites anyway.
    with torch.device("meta"):
        model = MODELS[config.arch](config, ops)
    return model
