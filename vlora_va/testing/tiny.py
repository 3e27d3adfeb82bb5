"""A tiny random-weight DINOv2 (4x4 patches, 2 blocks) and adapters that fit it: what the tests and the benchmarks
that need no real weights run on (seconds to build, milliseconds a forward)."""

from __future__ import annotations

import functools

import torch
from transformers import Dinov2Config, Dinov2Model

from vlora_va.engine.adapters import init_untrained, load_adapter_dir, save_adapter_dir

TINY_IMAGE = 56  # 4x4 patches of 14 px


def make_backbone(path):
    """The tiny backbone saved in `path` (a Hugging Face model directory), the same weights every time."""
    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=4,
                       patch_size=14, image_size=TINY_IMAGE)
    model = Dinov2Model(cfg)
    with torch.no_grad():  # LayerScale far from 1 (as in real DINOv2), so folding it wrongly shows everywhere
        for block in model.encoder.layer:
            block.layer_scale1.lambda1.uniform_(0.2, 1.5)
            block.layer_scale2.lambda1.uniform_(0.2, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return path


def _shapes(targets):
    return {f"encoder.layer.{i}.{t}": ((128, 32) if t.endswith("fc1") else (32, 128) if t.endswith("fc2") else (32, 32))
            for i in range(2) for t in targets}


def make_adapter(path, task, names, targets=("attention.q_proj", "attention.v_proj"), rank=4, seed=0, nonzero=True,
                 image_size=TINY_IMAGE, clip_len=2):
    """An adapter for the tiny backbone; nonzero=True gives B random weights so the LoRA changes outputs."""
    init_untrained(path, task=task, names=list(names), base_model="tiny", hidden=32,
                   target_modules=[t.rsplit(".", 1)[-1] for t in targets], module_shapes=_shapes(targets),
                   rank=rank, alpha=rank, image_size=image_size, clip_len=clip_len, seed=seed)
    if nonzero:
        a = load_adapter_dir("x", path, 32)
        g = torch.Generator().manual_seed(seed + 1)
        lora = {m: (A, torch.randn(B.shape, generator=g) * 0.1) for m, (A, B) in a.lora.items()}
        save_adapter_dir(path, lora=lora, rank=rank, alpha=rank, target_modules=[m.rsplit(".", 1)[-1] for m in lora],
                         base_model="tiny", head=a.head, head_config={k: v for k, v in a.head_config.items()
                                                                        if k not in ("format", "version")})
    return path


def make_adapters(root) -> dict:
    """The two adapters most tests use: detect (person, car) and actions (standing, walking; 2-frame clips)."""
    return {
        "detect": make_adapter(root / "detect", "detection", ["person", "car"], seed=1),
        "actions": make_adapter(root / "actions", "action", ["standing", "walking"],
                                targets=("attention.q_proj", "mlp.fc1", "mlp.fc2"), rank=8, seed=2),
    }


@functools.cache
def _routed(cls: type, routes: tuple[tuple[str, str], ...]) -> type:
    """cls whose forward still finds attribute `name` at the dotted path `route` (from the attention block)."""
    def get(route):
        def follow(module):
            obj = getattr(module, "_block", module)
            for part in route.split("."):
                obj = getattr(obj, part)
            return obj
        return property(follow)

    return type(f"Renamed{cls.__name__}", (cls,), {name: get(route) for name, route in routes})


def as_naming(model: torch.nn.Module, naming: str) -> torch.nn.Module:
    """A Dinov2Model given, in place, the module tree of the other transformers releases when it lacks `naming`:
    "legacy" (< 5.18, read from the 5.17 wheel): encoder.layer.N.attention.attention.{query,key,value} and
    .attention.output.dense; "canonical" (>= 5.18): encoder.layer.N.attention.{q,k,v,o}_proj. Same weights and
    forward, so named_modules, state_dict, peft and LoRA injection see the requested names."""
    legacy_now = hasattr(model.encoder.layer[0].attention, "output")
    if (naming == "legacy") == legacy_now:
        return model
    for layer in model.encoder.layer:
        att = layer.attention
        if naming == "legacy":  # the linears move into attention.attention / attention.output
            inner, output = torch.nn.Module(), torch.nn.Module()
            inner.query, inner.key, inner.value = (att._modules.pop(n) for n in ("q_proj", "k_proj", "v_proj"))
            output.dense = att._modules.pop("o_proj")
            att.attention, att.output = inner, output
            att.__class__ = _routed(type(att), (("q_proj", "attention.query"), ("k_proj", "attention.key"),
                                                ("v_proj", "attention.value"), ("o_proj", "output.dense")))
        else:  # the linears move up to the attention block; the inner modules' forwards reach them there
            inner, output = att.attention, att.output
            att.q_proj, att.k_proj, att.v_proj = (inner._modules.pop(n) for n in ("query", "key", "value"))
            att.o_proj = output._modules.pop("dense")
            for m in (inner, output):
                object.__setattr__(m, "_block", att)  # a plain reference, not a submodule
            inner.__class__ = _routed(type(inner), (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")))
            output.__class__ = _routed(type(output), (("dense", "o_proj"),))
    return model
