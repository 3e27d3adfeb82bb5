"""The "openvino" backbone backend (`daemon.backend: openvino`, CPU): the backbone compiled by OpenVINO, one compiled
model per resident adapter with its LoRA merged into the weights (premerged), below a shared, LoRA-free prefix.

Per image size, the backbone is cut at `split`, the first block any resident adapter at that size puts LoRA on:

    lower[size]          embeddings + blocks [0, split): the same for every adapter, compiled once, run once per
                         distinct frame of a batch (tasks that look at one frame share it)
    upper[slot, size]    blocks [split, L) + the final norm with that slot's W + scale * B A in every layer, compiled
                         per slot; a batch's rows run as one sub-batch per slot (`mode` only decides how the torch
                         backend computes the same thing: here every mode gives each row its own adapter's weights)

Models are converted from the engine's own torch modules (their LoRA layers swapped for plain linears holding the
merged weights while OpenVINO traces them), with a static image size and a dynamic batch, and compiled with the
precision hint set explicitly (`INFERENCE_PRECISION_HINT`: on CPUs with bf16, OpenVINO would otherwise run a
float32 model in bf16). Compiling happens on first use, which the daemon's warm-up makes happen before ready; an
adapter loaded or unloaded at run time drops its slot's models (`slot_changed`), and its first batch compiles them.

OpenVINO reports usage to Intel on import and on every conversion unless the user opted out; `import_openvino`
makes it use its own no-op stand-in, so nothing here contacts the outside.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vlora_va.contracts.requests import frame_key
from vlora_va.engine.backbones import patch_size
from vlora_va.engine.backends import BackboneBackend
from vlora_va.engine.backends.torch_eager import lower, normalise, upper
from vlora_va.engine.heads.features import Features
from vlora_va.engine.lora import LoRAContext, LoRALinear
from vlora_va.engine.modes import LoRAMode
from vlora_va.engine.vit import block_of, blocks

log = logging.getLogger(__name__)

HINTS = {"fp32": "f32", "bf16": "bf16"}  # engine precision -> OpenVINO's INFERENCE_PRECISION_HINT


def import_openvino():
    """`import openvino`, without its usage reporting. Importing openvino sends an event to Google Analytics unless
    the user opted out (openvino/tools/ovc/__init__.py, via the openvino-telemetry package), and converting a model
    sends more; with that package unimportable, OpenVINO uses its own no-op stand-in. Every import of openvino in
    vlora-va goes through here, before anything else imports it."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # None: `import openvino_telemetry` raises ImportError
    import openvino

    return openvino


def openvino_problem() -> str | None:
    """Why OpenVINO cannot run on this machine (None: it can)."""
    try:
        ov = import_openvino()
        if "CPU" not in ov.Core().available_devices:
            return "OpenVINO sees no CPU device"
    except Exception as e:  # an ImportError, or a broken install failing in its own way
        return f"OpenVINO does not load: {type(e).__name__}: {e}"
    return None


def openvino_version() -> str:
    return import_openvino().__version__


def compile_config(precision: str) -> dict:
    """How every model here is compiled: the precision hint explicit (OpenVINO would run a float32 model in bf16 on
    a CPU with bf16), one stream of the engine's thread count (the daemon runs one batch at a time, and ingest
    shares the cores)."""
    return {"INFERENCE_PRECISION_HINT": HINTS[precision], "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}


def convert(module: nn.Module, example: torch.Tensor):
    """An OpenVINO model of `module` traced at `example`'s shape with a dynamic batch (float32, torch weights)."""
    ov = import_openvino()
    shape = ov.PartialShape([-1] + list(example.shape[1:]))
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # the tracer warns of every Python branch on a shape; with a static image size they are constants
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return ov.convert_model(module, example_input=example, input=[shape])


class PlainOpenVINO:
    """The plain (LoRA-free) backbone compiled by OpenVINO, called as the Hugging Face model is
    (`model(pixel_values=x)`), one compiled model per image size: what `daemon.backend: auto` times against the
    torch precisions (precision_auto.measure_speeds)."""

    def __init__(self, backbone: nn.Module, precision: str):
        self.backbone, self.config = backbone, compile_config(precision)  # a float32 backbone
        self.core = import_openvino().Core()
        self._compiled: dict[int, object] = {}

    def __call__(self, pixel_values: torch.Tensor) -> np.ndarray:
        size = pixel_values.shape[-1]
        if size not in self._compiled:
            self._compiled[size] = self.core.compile_model(
                convert(_Part(self.backbone, 0, "whole"), pixel_values[:1].float()), "CPU", self.config)
        return self._compiled[size](pixel_values.float().numpy())[0]


def cache_dir() -> Path:
    """Where OpenVINO keeps compiled blobs ($VLORA_VA_OPENVINO_CACHE, else ~/.cache/vlora-va/openvino)."""
    return Path(os.environ.get("VLORA_VA_OPENVINO_CACHE", Path.home() / ".cache" / "vlora-va" / "openvino"))


class _Part(nn.Module):
    """One part of the backbone as a module OpenVINO can trace: lower (pixels -> hidden at split), upper (hidden at
    split -> last hidden state) or whole (pixels -> last hidden state)."""

    def __init__(self, backbone: nn.Module, split: int, part: str):
        super().__init__()
        self.backbone, self.split, self.part = backbone, split, part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.part == "lower":
            return lower(self.backbone, x, self.split)
        if self.part == "whole":
            return upper(self.backbone, lower(self.backbone, x, 0), 0)
        return upper(self.backbone, x, self.split)


class OpenVINOBackbone(BackboneBackend):
    owns_precision = True

    def __init__(self, backbone: nn.Module, lora_ctx: LoRAContext | None, device: torch.device, dtype: torch.dtype,
                 max_batch_images: int, fixed_layout: bool = False, precision: str = "fp32"):
        super().__init__(backbone, lora_ctx, device, dtype, max_batch_images)
        problem = self.unavailable(device, precision)
        if problem:
            raise RuntimeError(problem)
        self.core = import_openvino().Core()
        self.precision = precision
        self.core.set_property("CPU", {"CACHE_DIR": str(cache_dir())})
        self.config = compile_config(precision)
        self.patch = patch_size(backbone)
        self.prefix_tokens = 1 + int(getattr(backbone.config, "num_register_tokens", 0) or 0)
        self.n_blocks = len(blocks(backbone))
        self._lower: dict[tuple[int, int], object] = {}  # (size, split) -> compiled lower part
        self._upper: dict[tuple[int, int, int], object] = {}  # (slot, size, split) -> compiled upper part
        self.compile_s: dict[str, float] = {}  # what each model took to convert and compile (tests, logs)
        self.serving = False

    @classmethod
    def unavailable(cls, device: torch.device, precision: str) -> str | None:
        if device.type != "cpu":
            return f"it runs on CPUs only, not {device.type}"
        if precision not in HINTS:
            return f"precision {precision} is not built for it (it runs {' or '.join(HINTS)})"
        return openvino_problem()

    def warmed(self) -> None:
        self.serving = True

    def slot_changed(self, slot: int) -> None:
        """An adapter was loaded into or removed from `slot`: its compiled models are stale."""
        for key in [k for k in self._upper if k[0] == slot]:
            del self._upper[key]

    def pixels(self, frames: list[np.ndarray], size: int | None = None) -> torch.Tensor:
        x = normalise(torch.from_numpy(np.stack(frames)))
        if size is not None and size != x.shape[-1]:  # same resize as the torch backend: the same inputs
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                                align_corners=False)
        return x

    @torch.inference_mode()
    def features(self, frames: list[np.ndarray], slots: list[int], mode: LoRAMode, size: int, prefix: int = 0,
                 keep_pixels: bool = False, keys: list | None = None) -> Features:
        keys = keys if keys is not None else [frame_key(f) for f in frames]
        distinct: dict[tuple, int] = {}
        source = [distinct.setdefault(k, len(distinct)) for k in keys]  # frame i's row among the distinct frames
        unique = list({k: f for k, f in zip(keys, frames)}.values())
        pixels = self.pixels(unique, size)
        split = self.split(slots)
        below = self._run(self.lower_model(size, split), pixels.numpy())  # once per distinct frame
        out: np.ndarray | None = None
        for slot in sorted(set(slots)):  # one sub-batch per adapter
            rows = [i for i, s in enumerate(slots) if s == slot]
            hidden_rows = below[[source[i] for i in rows]]
            got = self._run(self.upper_model(slot, size, split), hidden_rows)
            if out is None:
                out = np.empty((len(frames),) + got.shape[1:], dtype=np.float32)
            out[rows] = got
        feats = Features.from_hidden(torch.from_numpy(out), size, self.patch, self.prefix_tokens)
        if keep_pixels:
            feats.pixels = pixels[torch.tensor(source)]
        return feats

    def split(self, slots: list[int]) -> int:
        """Where lower ends: the first block with LoRA in any of these slots (all blocks: none has LoRA)."""
        first = self.n_blocks
        for m in self._lora_layers():
            g, l = m._group, m._index
            if any(s >= 0 and g.rank_py[l][s] for s in set(slots)):
                first = min(first, block_of(m.name))
        return first

    @staticmethod
    def _run(compiled, x: np.ndarray) -> np.ndarray:
        return np.asarray(compiled(np.ascontiguousarray(x, dtype=np.float32))[0], dtype=np.float32)

    # ------------------------------------------------------------------ models
    def lower_model(self, size: int, split: int):
        key = (size, split)
        if key not in self._lower:
            self._lower[key] = self._compile(f"lower {size}px blocks 0-{split}", _Part(self.backbone, split, "lower"),
                                             torch.zeros(1, 3, size, size), None)
        return self._lower[key]

    def upper_model(self, slot: int, size: int, split: int):
        key = (slot, size, split)
        if key not in self._upper:
            tokens = self.prefix_tokens + (size // self.patch) ** 2
            example = torch.zeros(1, tokens, self.backbone.config.hidden_size)
            self._upper[key] = self._compile(f"upper {size}px blocks {split}-{self.n_blocks} slot {slot}",
                                             _Part(self.backbone, split, "upper"), example, slot)
        return self._upper[key]

    def _compile(self, what: str, part: _Part, example: torch.Tensor, slot: int | None):
        """Convert `part` (its LoRA layers as plain linears holding slot's merged weights, or the base weights)
        with a dynamic batch, and compile it with this backend's hints."""
        t0 = time.perf_counter()
        if self.serving:
            log.warning("openvino: compiling %s while serving (an adapter loaded at run time?)", what)
        with self._merged(slot):
            model = convert(part, example)
        compiled = self.core.compile_model(model, "CPU", self.config)
        self.compile_s[what] = time.perf_counter() - t0
        log.info("openvino: %s compiled in %.1f s (%s)", what, self.compile_s[what],
                 self.config["INFERENCE_PRECISION_HINT"])
        return compiled

    def _lora_layers(self) -> list[LoRALinear]:
        return [m for m in self.backbone.modules() if isinstance(m, LoRALinear)]

    @contextlib.contextmanager
    def _merged(self, slot: int | None):
        """The backbone with each LoRA layer replaced by an nn.Linear holding the pristine base weight plus `slot`'s
        scale * B A (slot None or -1: the base weight), in float32; put back afterwards."""
        swapped = []
        for parent in list(self.backbone.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, LoRALinear):
                    swapped.append((parent, name, child))
        try:
            for parent, name, m in swapped:
                setattr(parent, name, self._plain(m, slot))
            yield
        finally:
            for parent, name, m in swapped:
                setattr(parent, name, m)

    @staticmethod
    def _plain(m: LoRALinear, slot: int | None) -> nn.Linear:
        g, l = m._group, m._index
        w = (g.W0 if g.W0 is not None else g.W)[l].detach().float().clone()  # pristine: merged mode edits g.W
        r = g.rank_py[l][slot] if slot is not None and slot >= 0 else 0
        if r:
            w += g.scale_py[l][slot] * (g.B[l, slot, :, :r].float() @ g.A[l, slot, :r].float())
        lin = nn.Linear(m.in_features, m.out_features, bias=m.base.bias is not None)
        lin.weight = nn.Parameter(w, requires_grad=False)
        if m.base.bias is not None:
            lin.bias = nn.Parameter(m.base.bias.detach().float().clone(), requires_grad=False)
        return lin
