"""A ViT backbone run in two parts: the embeddings and blocks [0, split), then blocks [split, L) and the final
norm. Running both parts gives exactly the model's own forward (last_hidden_state).

Adapters with LoRA on the upper blocks only leave the lower ones untouched, so those are the same for every
adapter: the engine runs them once per frame for all the tasks that look at it (shared prefix), and training
caches them once per frame (vlora_va/training/features.py).
"""

from __future__ import annotations

import re

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


def _run(block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    out = block(hidden)
    return out[0] if isinstance(out, tuple) else out  # older transformers return a tuple


def lower(model: nn.Module, pixels: torch.Tensor, split: int) -> torch.Tensor:
    """Embeddings + blocks [0, split): [B, tokens, D]."""
    h = _base(model).embeddings(pixels)
    for block in blocks(model)[:split]:
        h = _run(block, h)
    return h


def upper(model: nn.Module, hidden: torch.Tensor, split: int) -> torch.Tensor:
    """Blocks [split, L) + the final norm: the backbone's last hidden state (what heads read)."""
    for block in blocks(model)[split:]:
        hidden = _run(block, hidden)
    return _base(model).layernorm(hidden)
