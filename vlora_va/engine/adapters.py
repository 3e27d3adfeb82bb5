"""The adapter format: a PEFT LoRA directory with a vision task head saved beside it.

    ADAPTER_DIR/
      adapter_config.json        PEFT LoraConfig (peft_type LORA, r, lora_alpha, target_modules, ...)
      adapter_model.safetensors  PEFT keys: base_model.model.<module>.lora_A.weight [r, in] / .lora_B.weight [out, r]
      head_config.json           {"format": "vlora-va-head", "version": 1, "task": "detection" | "action",
                                  "classes" | "labels": [...], "params": {...}, "trained": bool,
                                  "image_size": 224, "clip_len": 8 (action), "metrics": {...}}
      head.safetensors           the head's state dict
      README.md                  the adapter card (optional)

An adapter trained with plain peft (`model.save_pretrained`) plus a head in this format loads unchanged.
Only safetensors are read: never pickle.

Module names: adapters are written under the canonical names of transformers >= 5.18 (`attention.q_proj`, ...),
whichever version trained them; files with the legacy names (`attention.attention.query`, ...) load too.
`fit_module_names` translates an adapter's names to the backbone it meets (see engine/backbones.py, "two namings").
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from vlora_va.common import jsonfmt
from vlora_va.engine.backbones import canonical_name, legacy_name, renamed_for
from vlora_va.engine.heads import HEAD_FORMAT, HEAD_FORMAT_VERSION, build_head

_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter directory that is missing, malformed or does not fit the backbone."""


@dataclass
class Adapter:
    name: str
    path: Path
    rank: int
    scale: float  # lora_alpha / r (or / sqrt(r) with rslora)
    lora: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module -> (A [r, in], B [out, r])
    head: torch.nn.Module
    head_config: dict = field(default_factory=dict)
    sha256: str = ""  # of the adapter's four files: which weights served a row (rows carry its first 16 hex)

    @property
    def version(self) -> str | None:
        """An optional human version the trainer wrote (head_config "adapter_version")."""
        v = self.head_config.get("adapter_version")
        return str(v) if v is not None else None

    @property
    def task(self) -> str:
        return self.head_config["task"]

    @property
    def trained(self) -> bool:
        return bool(self.head_config.get("trained", False))

    @property
    def clip_len(self) -> int:
        return int(self.head_config.get("clip_len", 1))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterError(f"{path}: missing") from None
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"{path}: unreadable JSON: {e}") from None
    if not isinstance(data, dict):
        raise AdapterError(f"{path}: expected a JSON object")
    return data


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise AdapterError(f"{path}: missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise AdapterError(f"{path}: not a valid safetensors file: {e}") from None


def read_lora(path: Path) -> tuple[int, float, list[str], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """(rank, scale, target_modules, {module: (A, B)}) from a PEFT LoRA directory."""
    cfg = _read_json(path / "adapter_config.json")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}/adapter_config.json: peft_type {cfg.get('peft_type')!r} is not LORA")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)):
        raise AdapterError(f"{path}/adapter_config.json: r must be a positive int and lora_alpha a number")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    tensors = _read_safetensors(path / "adapter_model.safetensors")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"{path}/adapter_model.safetensors: unexpected tensor {key!r} (only LoRA A/B weights)")
        pairs.setdefault(m["module"], {})[m["ab"]] = t.float()
    lora = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{path}: module {module!r} has lora_{'A' if 'A' in ab else 'B'} but not its pair")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"{path}: module {module!r}: A {tuple(a.shape)} and B {tuple(b.shape)} do not chain")
        if a.shape[0] > r:
            raise AdapterError(f"{path}: module {module!r} has rank {a.shape[0]} > r={r} in adapter_config.json")
        lora[module] = (a, b)
    return r, scale, targets, lora


def fit_module_names(lora: dict[str, tuple[torch.Tensor, torch.Tensor]],
                     linear_names: Iterable[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The LoRA dict with each module named as the backbone names it (legacy or canonical DINOv2 naming).

    linear_names: the backbone's nn.Linear qualified names (models.linear_names). Names that already match
    stay; a module that is not a linear layer under either naming raises AdapterError naming it."""
    available = set(linear_names)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, ab in lora.items():
        name = renamed_for(module, available)
        if name is None:
            raise AdapterError(f"LoRA targets {module!r}, which is not a linear layer of this backbone (another backbone?)")
        if name in out:
            raise AdapterError(f"LoRA targets {name!r} twice (under both its legacy and its canonical name)")
        out[name] = ab
    return out


def canonical_module_names(
        lora: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The LoRA dict under canonical (transformers >= 5.18) module names, as adapters are saved."""
    out = {canonical_name(m): ab for m, ab in lora.items()}
    if len(out) != len(lora):
        raise AdapterError("LoRA names some modules twice (under both their legacy and their canonical name)")
    return out


def _suffix_match(name: str, target: str) -> bool:
    """PEFT's rule for a target_modules list entry: the full name, or a suffix of whole dotted segments."""
    return name == target or name.endswith("." + target)


def _fit_target(target: str, names: list[str]) -> list[str] | None:
    """target as one or more target_modules entries selecting the same layers among names; None: none fits."""
    def selects(entry: str) -> set[str]:
        return {n for n in names if _suffix_match(n, entry)}

    if selects(target):
        return [target]
    want = {n for n in names if any(_suffix_match(alt, target) for alt in {canonical_name(n), legacy_name(n)} - {n})}
    if not want:
        return None
    # The entry renamed whole (e.g. a full name), else the shortest suffix that selects exactly these layers.
    segments = min(want).split(".")
    suffixes = (".".join(segments[-k:]) for k in range(1, len(segments)))
    candidates = (canonical_name(target), legacy_name(target), *suffixes)
    fit = next((c for c in candidates if selects(c) == want), None)
    return [fit] if fit is not None else sorted(want)


def fit_target_modules(targets: Iterable[str], linear_names: Iterable[str]) -> list[str]:
    """PEFT-style target_modules entries (`q_proj`, `attention.q_proj`, full names) as this backbone names them.

    An entry that matches a linear layer stays. One that matches only under the other naming is replaced by
    entries that select exactly those layers here (e.g. `q_proj` -> `query` on transformers < 5.18, and
    back). An entry that matches under neither raises AdapterError naming it."""
    names = list(linear_names)
    out: list[str] = []
    for t in targets:
        fit = _fit_target(t, names)
        if fit is None:
            raise AdapterError(f"LoRA target module {t!r} matches no linear layer of this backbone (another backbone?)")
        out += fit
    return out


def load_adapter_dir(name: str, path: str | Path, hidden: int) -> Adapter:
    """Read an adapter directory fully (LoRA + head) or raise AdapterError naming the problem."""
    p = Path(path)
    if not p.is_dir():
        raise AdapterError(f"adapter {name!r}: directory {p} does not exist")
    rank, scale, _, lora = read_lora(p)
    head_cfg = _read_json(p / "head_config.json")
    if head_cfg.get("format") != HEAD_FORMAT or head_cfg.get("version") != HEAD_FORMAT_VERSION:
        raise AdapterError(f"{p}/head_config.json: expected format {HEAD_FORMAT!r} version {HEAD_FORMAT_VERSION}")
    try:
        head = build_head(head_cfg, hidden)
    except (KeyError, TypeError, ValueError) as e:
        raise AdapterError(f"{p}/head_config.json: {e}") from None
    state = _read_safetensors(p / "head.safetensors")
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise AdapterError(f"{p}/head.safetensors does not fit the head in head_config.json: {detail}") from None
    return Adapter(name, p, rank, scale, lora, head.eval(), head_cfg, content_sha256(p))


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "head_config.json", "head.safetensors")


def content_sha256(path: Path) -> str:
    """SHA-256 over an adapter directory's four files (names and bytes, in a fixed order)."""
    h = hashlib.sha256()
    for name in ADAPTER_FILES:
        h.update(name.encode() + b"\0")
        h.update((path / name).read_bytes())
    return h.hexdigest()


def save_adapter_dir(path: str | Path, *, lora: dict[str, tuple[torch.Tensor, torch.Tensor]], rank: int, alpha: float,
                     target_modules: list[str], base_model: str, head: torch.nn.Module, head_config: dict) -> Path:
    """Write an adapter in the format above (PEFT-compatible LoRA part), under canonical module names."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    lora = canonical_module_names(lora)
    # Entries spelled the legacy way (`query`) become the canonical ones that select the same saved modules.
    targets = {e for t in target_modules for e in (_fit_target(t, list(lora)) or [canonical_name(t)])}
    peft_cfg = {
        "peft_type": "LORA", "task_type": None, "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
        "target_modules": sorted(targets), "bias": "none", "use_rslora": False,
        "base_model_name_or_path": base_model, "inference_mode": True, "fan_in_fan_out": False,
        "modules_to_save": None, "init_lora_weights": True,
    }
    (p / "adapter_config.json").write_text(json.dumps(peft_cfg, indent=2) + "\n")
    tensors = {}
    for module, (a, b) in lora.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.detach().float().contiguous().cpu()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.detach().float().contiguous().cpu()
    save_file(tensors, str(p / "adapter_model.safetensors"))
    cfg = {"format": HEAD_FORMAT, "version": HEAD_FORMAT_VERSION, **head_config}
    (p / "head_config.json").write_text(jsonfmt.dumps(cfg, indent=2) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}, str(p / "head.safetensors"))
    return p


def init_untrained(path: str | Path, *, task: str, names: list[str], base_model: str, hidden: int,
                   target_modules: list[str], module_shapes: dict[str, tuple[int, int]], rank: int = 8,
                   alpha: float = 16, image_size: int = 224, clip_len: int = 8, seed: int = 0) -> Path:
    """An adapter with PEFT's default init (B = 0, so no change to the backbone) and a random head.

    Marked `"trained": false`: every result it produces says `untrained`."""
    g = torch.Generator().manual_seed(seed)
    lora = {}
    for module, (out_f, in_f) in module_shapes.items():
        a = torch.empty(rank, in_f)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=g)
        lora[module] = (a, torch.zeros(out_f, rank))
    torch.manual_seed(seed)
    key = "classes" if task == "detection" else "labels"
    head_cfg = {"task": task, key: names, "params": {}, "trained": False, "image_size": image_size}
    if task == "action":
        head_cfg["clip_len"] = clip_len
    head = build_head(head_cfg | {"format": HEAD_FORMAT, "version": HEAD_FORMAT_VERSION}, hidden)
    if task == "detection":
        head.image_size = image_size
        head_cfg["params"] = {"image_size": image_size}
    return save_adapter_dir(path, lora=lora, rank=rank, alpha=alpha, target_modules=target_modules,
                            base_model=base_model, head=head, head_config=head_cfg)


def adapter_digest(adapter) -> str:
    """Which adapter this is, for what is measured or built from it (accuracy-gate results, calibrated models): its
    files' sha256, recomputed from the weights for adapters loaded without one."""
    if getattr(adapter, "sha256", ""):
        return adapter.sha256
    h = hashlib.sha256()
    for name in sorted(adapter.lora):
        a, b = adapter.lora[name]
        h.update(name.encode() + a.float().numpy().tobytes() + b.float().numpy().tobytes())
    return h.hexdigest()
