"""Model classes by architecture name."""

import torch
from torch import nn

from engine.models.llama import LlamaForCausalLM
from engine.weights import ModelConfig

MODELS: dict[str, type[nn.Module]] = {"llama": LlamaForCausalLM, "qwen2": LlamaForCausalLM}


def build_model(config: ModelConfig) -> nn.Module:
    """An uninitialised model of the config's architecture (weights come from load_weights)."""
    # The meta device skips random init of hundreds of MB that load_weights overwrites anyway.
    with torch.device("meta"):
        model = MODELS[config.arch](config)
    return model
