"""A ViT backbone's structure: its transformer blocks, which block a layer is in, and `fold_layer_scale`, which folds
DINOv2's LayerScale into the linear layers before it for serving (exact; two fewer elementwise passes over the hidden
states per block). How PyTorch runs the blocks (in two parts, for a shared prefix) is in engine/backends/torch_eager.py.
"""

from __future__ import annotations

import re

import torch
from torch import nn

_LAYER = re.compile(r"(?:^|\.)(?:encoder\.layer|layers)\.(\d+)\.")


def base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a (possibly peft-wrapped) Hugging Face DINOv2 / ViT."""
    return base_model(model).encoder.layer


def num_blocks(model: nn.Module) -> int:
    return len(blocks(model))


def block_of(module_name: str) -> int | None:
    """The block index in a layer name such as encoder.layer.8.attention.q_proj (None: not in a block)."""
    m = _LAYER.search(module_name)
    return int(m.group(1)) if m else None


# A block's LayerScale -> the linear layer whose output it scales (transformers >= 5.18 names first, then
# the older ones; SwiGLU MLPs under both schemes).
_SCALED_OUTPUTS = {"layer_scale1": ("attention.o_proj", "attention.output.dense"),
                   "layer_scale2": ("mlp.fc2", "mlp.down_proj", "mlp.weights_out")}


def fold_layer_scale(model: nn.Module) -> dict[str, torch.Tensor]:
    """Fold every block's LayerScale (`h * lambda` after the attention and after the MLP) into the linear layer
    that produces h: W <- diag(lambda) W, b <- lambda * b, and the LayerScale becomes an identity. The model
    computes the same function with two fewer elementwise passes per block. Returns {that linear's qualified
    name: lambda}: a LoRA on those layers must scale its B rows the same way (lora.inject_lora `out_scales`).
    Blocks without LayerScale, or whose output layer is not found, are left as they are."""
    names = {id(m): n for n, m in model.named_modules()}
    folded: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for block in blocks(model):
            for scale_name, candidates in _SCALED_OUTPUTS.items():
                scale = getattr(block, scale_name, None)
                lam = getattr(scale, "lambda1", None)
                linear = next((block.get_submodule(c) for c in candidates if _has(block, c)), None)
                if lam is None or not isinstance(linear, nn.Linear) or linear.out_features != lam.numel():
                    continue
                lam = lam.detach().clone()
                linear.weight.mul_(lam[:, None])
                if linear.bias is not None:
                    linear.bias.mul_(lam)
                setattr(block, scale_name, nn.Identity())
                folded[names[id(linear)]] = lam
    return folded


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
        return True
    except AttributeError:
        return False
