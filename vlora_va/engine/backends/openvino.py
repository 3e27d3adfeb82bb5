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
float32 model in bf16). Compiling happens on first use, which the daemon's warm-up makes happen before ready. An
adapter loaded or unloaded at run time drops its slot's models (`slot_changed`); `prepare` compiles a loaded one's
on a thread of their own while serving goes on (the daemon holds its requests until then), and a batch that needs a
model still compiling waits for that compile rather than starting another.

int8 (openvino_int8.py): each part is read from its calibrated IR (`vlora-va models calibrate`); a part nobody
calibrated (an adapter loaded at run time, a backbone changed since) runs in float at the same hint, with a warning.

Detection heads run compiled too (`head_forward`; their decoding stays in torch): the x4 grid and its detail branch
cost 25 ms per image at 336 px in torch fp32 on 2 cores, 16 compiled at f32 (the same numbers to 1e-5), 8 at bf16. At
f32 in fp32 and bf16 (their accuracy gates were measured with torch heads); in int8 at bf16 where the CPU has it
(openvino_int8.head_hint), whose gate is measured this way.

OpenVINO reports usage to Intel on import and on every conversion unless the user opted out; `import_openvino`
makes it use its own no-op stand-in, so nothing here contacts the outside.

OpenVINO on this machine (importing it, the hints, converting and compiling, the caches): openvino_runtime.py; the
plain backbone `daemon.backend: auto` times and the int8 calibration check: openvino_plain.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vlora_va.contracts.requests import frame_key
from vlora_va.engine.backbones import patch_size
from vlora_va.engine.backends import BackboneBackend, openvino_int8
from vlora_va.engine.backends.openvino_plain import PlainOpenVINO, int8_calibration, int8_gate
from vlora_va.engine.backends.openvino_runtime import (
    HINTS,
    PRECISIONS,
    BackbonePart,
    blob_dir,
    cache_dir,
    compile_config,
    convert,
    forget_old_blobs,
    hint_key,
    import_openvino,
    int8_dir,
    int8_hint,
    int8_layers,
    openvino_problem,
    openvino_version,
)
from vlora_va.engine.backends.torch_eager import model_input
from vlora_va.engine.heads.detection import DetectionHead
from vlora_va.engine.heads.features import Features, token_grid
from vlora_va.engine.lora import LoRAContext, LoRALinear
from vlora_va.engine.modes import LoRAMode
from vlora_va.engine.precision import Capabilities
from vlora_va.engine.vit import block_of, blocks

log = logging.getLogger(__name__)

# What callers import from here (the backend, and OpenVINO on this machine: openvino_runtime.py, openvino_plain.py)
__all__ = ["HINTS", "PRECISIONS", "OpenVINOBackbone", "PlainOpenVINO", "blob_dir", "cache_dir", "compile_config",
           "convert", "forget_old_blobs", "hint_key", "import_openvino", "int8_calibration", "int8_dir", "int8_gate", "int8_hint",
           "int8_layers", "openvino_problem", "openvino_version"]

class _HeadPart(nn.Module):
    """A detection head as a module OpenVINO can trace: (grid[, pixels]) -> (class logits, box distances)."""

    def __init__(self, head: DetectionHead):
        super().__init__()
        self.head = head

    def forward(self, grid: torch.Tensor, pixels: torch.Tensor | None = None):
        return self.head(Features(grid.new_zeros(grid.shape[:2]), grid, pixels))


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
        forget_old_blobs()
        self.config = compile_config(precision)
        self.patch = patch_size(backbone)
        self.prefix_tokens = 1 + int(getattr(backbone.config, "num_register_tokens", 0) or 0)
        self.n_blocks = len(blocks(backbone))
        self._lower: dict[tuple[int, int], object] = {}  # (size, split) -> compiled lower part
        self._upper: dict[tuple[int, int, int], object] = {}  # (slot, size, split) -> compiled upper part
        self.compile_s: dict[str, float] = {}  # what each model took to convert and compile (tests, logs)
        self.uncalibrated: list[str] = []  # int8: the parts that ran in float, no calibrated model found (tests, logs)
        self.serving = False
        # adapters loaded at run time compile here, one model at a time, beside serving (`prepare`)
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="openvino-compile")
        self._pending: dict[tuple, Future] = {}  # ("lower", size, split) / ("upper", slot, size, split) -> its job
        # conversions, one at a time: a part's swaps the torch backbone's LoRA layers (`_merged`)
        self._convert_lock = threading.Lock()
        self._heads: dict[tuple[int, int], object] = {}  # (slot, size) -> its detection head, compiled
        self._loras = [m for m in backbone.modules() if isinstance(m, LoRALinear)]
        caps = Capabilities.detect("cpu")
        self.overflow_fix = openvino_int8.overflow_fix(caps.vnni)  # int8: which calibrated models this CPU reads
        self.head_hint = openvino_int8.head_hint(caps.native_bf16)  # int8: its detection heads' hint

    @classmethod
    def unavailable(cls, device: torch.device, precision: str) -> str | None:
        if device.type != "cpu":
            return f"it runs on CPUs only, not {device.type}"
        if precision not in PRECISIONS:
            return f"precision {precision} is not built for it (it runs {', '.join(PRECISIONS)})"
        return openvino_problem()

    # `daemon.backend: auto`: its precisions compete with the torch engine's (BackboneBackend says how)
    auto_precisions = PRECISIONS

    @classmethod
    def auto_problem(cls) -> str | None:
        return openvino_problem()

    @classmethod
    def auto_key(cls) -> dict:
        return {"openvino": openvino_version(), "openvino_int8_hint": int8_hint()}

    @classmethod
    def auto_gates(cls, caps, backbone: nn.Module, adapters: dict, sizes: dict[str, int]) -> tuple[dict, object]:
        why, parts = int8_gate(caps, backbone, adapters, sizes)
        return {"int8": why}, parts

    @classmethod
    def gate_variants(cls, caps) -> list[str]:
        if openvino_problem() is not None:
            return []
        return [openvino_int8.gate_name(caps.native_bf16, caps.vnni, int8_hint())]

    @classmethod
    def plain(cls, backbone: nn.Module, precision: str, parts: object = None) -> PlainOpenVINO:
        return PlainOpenVINO(backbone, precision, parts)

    def warmed(self) -> None:
        self.serving = True

    def slot_changed(self, slot: int) -> None:
        """An adapter was loaded into or removed from `slot`: its compiled models are stale (a compile still running
        for it too: its result is never used)."""
        for key in [k for k in self._upper if k[0] == slot]:
            del self._upper[key]
        for key in [k for k in self._heads if k[0] == slot]:
            del self._heads[key]
        for key in [k for k in self._pending if k[0] in ("upper", "head") and k[1] == slot]:
            del self._pending[key]

    def prepare(self, slot: int, size: int, head=None) -> Future | None:
        """Compile what a batch of `slot` alone at `size` px runs (its upper part, the lower part if its split is
        new, its detection head), on the compile thread."""
        split = self.split([slot])
        jobs = []
        if isinstance(head, DetectionHead) and (slot, size) not in self._heads:
            jobs.append(("head", slot, size))
        if (size, split) not in self._lower and ("lower", size, split) not in self._pending:
            jobs.append(("lower", size, split))
        if (slot, size, split) not in self._upper:
            jobs.append(("upper", slot, size, split))
        if not jobs:
            return None

        def build() -> dict[tuple, object]:
            return {job: self._compile_head(head, size, slot) if job[0] == "head" else
                    self._compile(self._what(job), job[0], job[-2], job[-1], job[1] if job[0] == "upper" else None,
                                  background=True) for job in jobs}
        future = self._compiler.submit(build)
        for job in jobs:
            self._pending[job] = future
        return future

    def head_forward(self, slot: int, head, size: int):
        """A detection head compiled (per slot and image size, a dynamic batch): called as the module is, with its
        raw outputs as torch tensors. Other heads: None (cheap: an action head costs ~4 ms a clip)."""
        if not isinstance(head, DetectionHead):
            return None
        key = (slot, size)
        if key not in self._heads:
            self._heads[key] = self._adopt(("head", slot, size)) or self._compile_head(head, size, slot)
        compiled, detail = self._heads[key], head.detail_branch is not None

        def forward(feats: Features):
            inputs = [feats.grid.float().numpy()] + ([feats.pixels.float().numpy()] if detail else [])
            out = compiled(inputs)
            return torch.from_numpy(out[0]), torch.from_numpy(out[1])
        return forward

    def _compile_head(self, head: DetectionHead, size: int, slot: int):
        t0 = time.perf_counter()
        grid = size // self.patch
        example = [torch.zeros(1, self.backbone.config.hidden_size, grid, grid)]
        if head.detail_branch is not None:
            example.append(torch.zeros(1, 3, size, size))
        ov = import_openvino()
        # one trace at a time: the engine thread may be converting a part while the compile thread does this
        with self._convert_lock, torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            model = ov.convert_model(_HeadPart(head), example_input=tuple(example),
                                     input=[ov.PartialShape([-1] + list(x.shape[1:])) for x in example])
        # f32 in the float precisions (their gates were measured with fp32 heads); int8's own head hint
        config = {**self.config, "INFERENCE_PRECISION_HINT": "f32" if self.precision != "int8" else self.head_hint}
        compiled = self.compile_model(model, config)
        what = self._what(("head", slot, size))
        self.compile_s[what] = time.perf_counter() - t0
        log.info("openvino: %s compiled in %.1f s (%s)", what, self.compile_s[what], config["INFERENCE_PRECISION_HINT"])
        return compiled

    def _adopt(self, job: tuple):
        """The model a background compile built for `job` (waiting for it if still running), or None: none was
        started, or it failed (then the caller compiles it here)."""
        future = self._pending.pop(job, None)
        if future is None:
            return None
        try:
            return future.result()[job]
        except Exception as e:  # noqa: BLE001 - said, then compiled on this thread
            log.warning("openvino: the background compile of %s failed (%s): compiling it now", self._what(job), e)
            return None

    def _what(self, job: tuple) -> str:
        if job[0] == "head":
            return f"detection head {job[2]}px slot {job[1]}"
        if job[0] == "lower":
            return f"lower {job[1]}px blocks 0-{job[2]}"
        return f"upper {job[2]}px blocks {job[3]}-{self.n_blocks} slot {job[1]}"

    def pixels(self, frames: list[np.ndarray], size: int | None = None) -> torch.Tensor:
        return model_input(torch.from_numpy(np.stack(frames)), size)  # the torch backend's inputs

    @torch.inference_mode()
    def features(self, frames: list[np.ndarray], slots: list[int], mode: LoRAMode, size: int, prefix: int = 0,
                 keep_pixels: bool = False, keys: list | None = None, mid_layer: int = 0) -> Features:
        keys = keys if keys is not None else [frame_key(f) for f in frames]
        distinct: dict[tuple, int] = {}
        source = [distinct.setdefault(k, len(distinct)) for k in keys]  # frame i's row among the distinct frames
        unique = list({k: f for k, f in zip(keys, frames)}.values())
        pixels = self.pixels(unique, size)
        split = self.split(slots)
        below = self.infer(self.lower_model(size, split), pixels.numpy())  # once per distinct frame
        out: np.ndarray | None = None
        for slot in sorted(set(slots)):  # one sub-batch per adapter
            rows = [i for i, s in enumerate(slots) if s == slot]
            hidden_rows = below[[source[i] for i in rows]]
            got = self.infer(self.upper_model(slot, size, split), hidden_rows)
            if out is None:
                out = np.empty((len(frames),) + got.shape[1:], dtype=np.float32)
            out[rows] = got
        feats = Features.from_hidden(torch.from_numpy(out), size, self.patch, self.prefix_tokens)
        if keep_pixels:
            feats.pixels = pixels[torch.tensor(source)]
        if mid_layer and split > 0:
            # the compiled parts stop only at the split: its tokens are the LoRA-free ones nearest the block asked for
            feats.mid = token_grid(torch.from_numpy(below[source]), size, self.patch, self.prefix_tokens)
        return feats

    def split(self, slots: list[int]) -> int:
        """Where lower ends: the first block with LoRA in any of these slots (all blocks: none has LoRA). In int8, in
        any resident slot: a calibrated part must not depend on which adapters share a batch."""
        if self.precision == "int8":
            slots = list(range(self.lora_ctx.num_slots)) if self.lora_ctx is not None else []
        first = self.n_blocks
        for m in self._lora_layers():
            g, l = m._group, m._index
            if any(s >= 0 and g.rank_py[l][s] for s in set(slots)):
                first = min(first, block_of(m.name))
        return first

    @staticmethod
    def infer(compiled, x: np.ndarray) -> np.ndarray:
        """One compiled part on a float32 batch."""
        return np.asarray(compiled(np.ascontiguousarray(x, dtype=np.float32))[0], dtype=np.float32)

    # ------------------------------------------------------------------ models
    def lower_model(self, size: int, split: int):
        key = (size, split)
        if key not in self._lower:
            job = ("lower", size, split)
            self._lower[key] = self._adopt(job) or self._compile(self._what(job), "lower", size, split, None)
        return self._lower[key]

    def upper_model(self, slot: int, size: int, split: int):
        key = (slot, size, split)
        if key not in self._upper:
            job = ("upper", slot, size, split)
            self._upper[key] = self._adopt(job) or self._compile(self._what(job), "upper", size, split, slot)
        return self._upper[key]

    def int8_key(self, part: str, size: int, split: int, slot: int | None) -> dict:
        """The calibrated model's key for a part (openvino_int8.part_key): the engine sets `identity` (the base
        weights' digest) and `digests` (slot -> its adapter's)."""
        adapter = self.digests.get(slot) if slot is not None and slot >= 0 else None
        return openvino_int8.part_key(part, self.identity, size, split, adapter, self.overflow_fix,
                                      openvino_version())

    def example(self, part: str, size: int) -> torch.Tensor:
        """One input of a part at `size` px: pixels (lower) or the hidden state at the split (upper)."""
        if part == "lower":
            return torch.zeros(1, 3, size, size)
        return torch.zeros(1, self.prefix_tokens + (size // self.patch) ** 2, self.backbone.config.hidden_size)

    def float_model(self, part: str, size: int, split: int, slot: int | None):
        """A part as an OpenVINO float32 model (LoRA layers as plain linears holding slot's merged weights, or the
        base weights), with a dynamic batch."""
        with self._convert_lock, self._merged(slot):
            return convert(BackbonePart(self.backbone, split, part), self.example(part, size))

    def compile_model(self, model, config: dict):
        """`model` compiled for the CPU with `config`, through OpenVINO's blob cache (blob_dir: one per hint). Where
        the cache fails, without it: only the start is slower."""
        cache = blob_dir(config)
        try:
            return self.core.compile_model(model, "CPU", {**config, "CACHE_DIR": str(cache)})
        except RuntimeError as e:
            # OpenVINO's cache has no lock: two processes compiling the same part at once (two daemons of a cluster
            # starting on one machine) write the same blob, and the loser failed the start ("filesystem error:
            # cannot set permissions"). A cache folder that cannot be written fails the same way.
            log.warning("openvino: the compiled-model cache %s failed (%s); compiling without it", cache,
                        (str(e).strip().splitlines() or ["?"])[-1][:200])
            return self.core.compile_model(model, "CPU", config)

    def int8_model(self, part: str, size: int, split: int, slot: int | None):
        """The calibrated int8 model of `part` (`vlora-va models calibrate`), read, or None where there is none."""
        path = openvino_int8.cached(int8_dir(), self.int8_key(part, size, split, slot))
        return None if path is None else self.core.read_model(str(path))

    def _compile(self, what: str, part: str, size: int, split: int, slot: int | None, background: bool = False):
        """Compile `part` with this backend's hints: its calibrated model in int8 (float where there is none), else
        converted from the torch modules. background: on the compile thread (`prepare`), serving goes on."""
        t0 = time.perf_counter()
        if self.serving and not background:
            log.warning("openvino: compiling %s while serving (an adapter loaded at run time?)", what)
        model = None
        if self.precision == "int8":
            model = self.int8_model(part, size, split, slot)
            if model is not None:
                what += " int8"
            else:
                self.uncalibrated.append(what)
                log.warning("openvino: %s has no calibrated int8 model (vlora-va models calibrate): it runs in float",
                            what)
        if model is None:
            model = self.float_model(part, size, split, slot)
        compiled = self.compile_model(model, self.config)
        self.compile_s[what] = time.perf_counter() - t0
        layers = ""
        if self.precision == "int8":
            n8, n = int8_layers(compiled)
            layers = f", {n8} of {n} linear layers in int8"
        log.info("openvino: %s compiled in %.1f s (%s%s)%s", what, self.compile_s[what],
                 self.config["INFERENCE_PRECISION_HINT"], layers, " beside serving" if background else "")
        return compiled

    def calibrate(self, part: str, size: int, split: int, slot: int | None, samples: list[np.ndarray],
                  provenance: dict) -> Path:
        """Quantize one part to int8 with NNCF, its activation ranges from `samples` (the part's inputs, each
        [1, ...]), and write it where `_compile` reads it; the compiled part, if any, is dropped. Calibration only
        (`vlora-va models calibrate`): the daemon never calls this."""
        t0 = time.perf_counter()
        key = self.int8_key(part, size, split, slot)
        model = openvino_int8.quantize(self.float_model(part, size, split, slot), samples, self.overflow_fix)
        path = openvino_int8.save(import_openvino(), model, int8_dir(), key,
                                  {**provenance, "samples": len(samples), "nncf": openvino_int8.nncf_version(),
                                   "seconds": round(time.perf_counter() - t0, 1)})
        self._lower.pop((size, split), None) if part == "lower" else self._upper.pop((slot, size, split), None)
        log.info("openvino: %s %dpx split %d%s calibrated on %d samples in %.0f s: %s", part, size, split,
                 f" slot {slot}" if part == "upper" else "", len(samples), time.perf_counter() - t0, path)
        return path

    def _lora_layers(self) -> list[LoRALinear]:
        """The backbone's LoRA layers, found once (walking every module took ~1 ms a batch; the set never changes,
        and a conversion on the compile thread swaps them out of the tree for a while)."""
        return self._loras

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
