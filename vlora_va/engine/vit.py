"""A ViT backbone run in two parts: the embeddings and blocks [0, split), then blocks [split, L) and the final
norm. Running both parts gives exactly the model's own forward (last_hidden_state).

Adapters with LoRA on the upper blocks only leave the lower ones untouched, so those are the same for every
adapter: the engine runs them once per frame for all the tasks that look at it (shared prefix), and training
caches them once per frame (vlora_va/training/features.py).

For serving, `fold_layer_scale` folds DINOv2's LayerScale into the linear layers before it (exact; two fewer
elementwise passes over the hidden states per block).
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

_LAYER = re.compile(r"(?:^|\.)(?:encoder\.layer|layers)\.(\d+)\.")


def _base(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a (possibly peft-wrapped) Hugging Face DINOv2 / ViT."""
    return _base(model).encoder.layer


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


def _run(block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    out = block(hidden)
    return out[0] if isinstance(out, tuple) else out  # older transformers return a tuple


def lower(model: nn.Module, pixels: torch.Tensor, split: int) -> torch.Tensor:
    """Embeddings + blocks [0, split): [B, tokens, D]."""
    return middle(model, _base(model).embeddings(pixels), 0, split)


def middle(model: nn.Module, hidden: torch.Tensor, start: int, stop: int | None = None) -> torch.Tensor:
    """Blocks [start, stop) (stop None: to the last), without the final norm."""
    for block in blocks(model)[start:stop]:
        hidden = _run(block, hidden)
    return hidden


def upper(model: nn.Module, hidden: torch.Tensor, split: int) -> torch.Tensor:
    """Blocks [split, L) + the final norm: the backbone's last hidden state (what heads read)."""
    return _base(model).layernorm(middle(model, hidden, split))


def forward(model: nn.Module, pixels: torch.Tensor, split: int,
            at_split: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The whole forward, with `at_split` applied to the hidden state between blocks [0, split) and the rest
    (where a caller forks shared-prefix rows and turns the LoRA on): upper(at_split(lower(pixels)))."""
    return upper(model, at_split(lower(model, pixels, split)), split)
