"""The inference engine: executes batch plans. One backbone, adapters in LoRA slots, their task heads.

`Engine.execute(plan)` makes the base weights hold what the plan's LoRA mode needs (a one-shot switch of all
layers), runs ONE backbone forward per image size over all the plan's frames (each frame through its own
adapter, as the mode says), then each adapter's head on its requests' features, and returns each request's
typed result. It decides nothing: the scheduler chose the requests, the mode and the grouping.

Frames arrive letterboxed to the daemon's `image_size`; an adapter trained at a smaller size (its
head_config `image_size`) gets them resized to that size, so tasks that need detail (small objects) and
tasks that do not share one daemon.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from vlora_va.contracts.plugins import BACKBONE_BACKENDS
from vlora_va.contracts.results import Payload
from vlora_va.engine import precision as precision_mod
from vlora_va.engine.adapters import Adapter, AdapterError, adapter_digest, fit_module_names
from vlora_va.engine.backbones import patch_size, tensor_digest
from vlora_va.engine.backends import BackboneBackend
from vlora_va.engine.heads import Clip, Features
from vlora_va.engine.heads.appearance import EMBED_LAYER
from vlora_va.engine.lora import (
    LoRALinear,
    clear_slot,
    enable_premerge,
    inject_lora,
    load_adapter,
    premerge_bytes,
    switch_weights,
)
from vlora_va.engine.modes import MIXTURE, LoRAMode
from vlora_va.engine.plan import AdapterInfo, BatchPlan, Catalog, PlanKey, SizeGroup, resting_mode
from vlora_va.engine.vit import block_of, fold_layer_scale, num_blocks

log = logging.getLogger(__name__)


def premerge_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why premerged mode cannot serve on this device and dtype (None: it can). On CUDA its grouped GEMM
    (torch._grouped_mm) has a kernel for bfloat16 only: other dtypes fall back to a loop that reads the group
    offsets on the host, which a CUDA graph cannot capture (seen on an H200 with torch 2.11, 2026-11-26)."""
    if device.type == "cuda" and dtype != torch.bfloat16:
        return f"on CUDA the grouped GEMM needs bfloat16 (the backbone runs in {str(dtype).removeprefix('torch.')})"
    return None


def lora_blocks(adapter: Adapter) -> list[int]:
    """The backbone blocks an adapter's LoRA modules sit in (one entry per module inside a block)."""
    return [b for m in adapter.lora if (b := block_of(m)) is not None]


class Engine:
    def __init__(self, backbone: torch.nn.Module, adapters: dict[str, Adapter], image_size: int,
                 max_slots: int = 8, max_rank: int = 64, device: str | torch.device = "cpu",
                 premerge_max_mb: int = 0, max_batch_images: int = 16, dtype: torch.dtype = torch.float32,
                 fixed_layout: bool | None = None, precision: str | None = None, backend: str = "torch"):
        if len(adapters) > max_slots:
            raise ValueError(f"{len(adapters)} adapters configured but daemon.max_slots is {max_slots}")
        self.device = torch.device(device)
        # fp32 / bf16 / int8 (engine/precision.py); None: what the dtype says. bf16 is the dtype; int8 swaps the GEMMs
        self.precision, dtype = precision_mod.resolve(precision, dtype, self.device)
        self.backend_name = backend
        backend_cls = BACKBONE_BACKENDS.load(backend)
        why = backend_cls.unavailable(self.device, self.precision)
        if why:  # a missing or broken library must not stop the daemon: torch computes the same
            log.warning("backbone backend %s cannot run here (%s): using torch", backend, why)
            self.backend_name, backend_cls = "torch", BACKBONE_BACKENDS.load("torch")
        if backend_cls.owns_precision:  # it converts a float32 torch model and computes in self.precision itself
            dtype, premerge_max_mb = torch.float32, 0
        self.dtype = dtype  # the backbone's (and its LoRA's); heads run in float32
        self.backbone_digest = tensor_digest(backbone.state_dict())  # the weights rows say they came from
        self.backbone = backbone.to(self.device, dtype).eval()
        self.image_size = image_size
        self.max_batch_images = max_batch_images
        self.patch = patch_size(backbone)
        self.max_slots, self.max_rank = max_slots, max_rank
        self.adapters: dict[str, Adapter] = {}
        self.slots: dict[str, int] = {}
        self.sizes: dict[str, int] = {}
        self.lora_ctx = None
        self.premerged = False
        self.backend: BackboneBackend | None = None  # made once the adapters are in (below)
        # Every linear layer of the blocks takes LoRA, with max_slots slots: an adapter loaded at run time
        # (any targets, any free slot) needs no new wrapping, so captured forwards stay valid.
        targets = [n for n, m in self.backbone.named_modules() if isinstance(m, torch.nn.Linear) and block_of(n) is not None]
        targets = targets or sorted({m for a in adapters.values() for m in a.lora})
        folded = fold_layer_scale(self.backbone)  # exact, and two fewer elementwise passes per block
        if targets:
            self.lora_ctx = inject_lora(self.backbone, targets, num_slots=max_slots, max_rank=max_rank,
                                        out_scales=folded)
        # An adapter that does not fit this backbone is rejected alone: the others still serve.
        self.rejected: dict[str, str] = {}
        for name, a in adapters.items():
            try:
                self.load(name, a)
            except AdapterError as e:
                self.rejected[name] = str(e)
                log.error("adapter %s rejected: %s", name, e)
        if self.lora_ctx is not None:
            self._maybe_premerge(premerge_max_mb)
        if not backend_cls.owns_precision:
            precision_mod.apply(self.backbone, self.precision)
        # What runs the forward (daemon.backend). Fixed layouts (what CUDA graphs replay) by default on a GPU,
        # where per-layer host work costs more than the LoRA math.
        self.backend = backend_cls(
            self.backbone, self.lora_ctx, self.device, self.dtype, max_batch_images,
            fixed_layout=self.device.type == "cuda" if fixed_layout is None else fixed_layout, precision=self.precision)
        self.backend.identity = self.backbone_digest
        self.backend.digests = {slot: adapter_digest(self.adapters[name]) for name, slot in self.slots.items()}
        # Each plan key's first execution (time.monotonic()): the daemon's warm-up must have run every key before
        # it says ready, so no request pays a first call's costs (tests check this). Keys as warm-up counts them.
        self.first_runs: dict[PlanKey, float] = {}

    def _maybe_premerge(self, max_mb: int) -> None:
        # Per-slot merged weights replace the LoRA GEMMs with one GEMM per run of rows (bench/atmm.py): the
        # cost model then decides when that mode serves a batch best.
        mb = premerge_bytes(self.backbone) / 2**20
        problem = premerge_unsupported(self.device, self.dtype)
        if problem and max_mb > 0:
            log.info("LoRA: no premerged weights: %s", problem)
        elif 0 < mb <= max_mb:
            enable_premerge(self.backbone)
            self.premerged = True
            log.info("LoRA: premerged weights for %d slot(s), %.0f MB", len(self.slots), mb)
        else:
            log.info("LoRA: no premerged weights (they would take %.0f MB, daemon.premerge_max_mb %d)", mb, max_mb)

    # ------------------------------------------------------------------ adapters in slots
    def free_slots(self) -> list[int]:
        used = set(self.slots.values())
        return [s for s in range(self.max_slots) if s not in used]

    def load(self, name: str, adapter: Adapter) -> int:
        """Put an adapter in a slot: its own slot when the name is loaded already (a reload replaces weights
        and head entirely), else the first free one. Raises AdapterError (it does not fit this backbone, or
        no slot is free) and then changes nothing. The base weights must not hold that slot."""
        problem = self.misfit(adapter)
        if problem:
            raise AdapterError(problem)
        slot = self.slots.get(name)
        if slot is None:
            free = self.free_slots()
            if not free:
                raise AdapterError(f"no free slot for {name!r}: all {self.max_slots} (daemon.max_slots) are in use")
            slot = free[0]
        if self.lora_ctx is not None:
            if self.lora_ctx.weights_slot == slot:
                raise AdapterError(f"slot {slot} of {name!r} is merged into the base weights: switch first")
            if adapter.lora:
                load_adapter(self.backbone, slot, adapter.lora, adapter.scale)  # premerged weights refreshed too
            else:
                clear_slot(self.backbone, slot)
        adapter.head.to(self.device).eval()
        if self.backend is not None:
            self.backend.digests[slot] = adapter_digest(adapter)
            self.backend.slot_changed(slot)
        self.adapters[name], self.slots[name] = adapter, slot
        self.sizes[name] = int(adapter.head_config.get("image_size", self.image_size))
        if self.sizes[name] > self.image_size:
            log.warning("adapter %s was trained at %d px but frames arrive at %d px (daemon.image_size): "
                        "it will see upscaled frames", name, self.sizes[name], self.image_size)
        return slot

    def prepare(self, name: str):
        """Start building what the backend needs to serve a loaded adapter (its compiled models), off this thread;
        a Future that is done when it may serve, or None when there is nothing to build."""
        return self.backend.prepare(self.slots[name], self.sizes[name], self.adapters[name].head)

    def unload(self, name: str) -> int:
        """Free an adapter's slot for real (its stacks zeroed, its premerged weights back to the base)."""
        slot = self.slots.pop(name)
        del self.adapters[name], self.sizes[name]
        if self.lora_ctx is not None:
            clear_slot(self.backbone, slot)
        if self.backend is not None:
            self.backend.digests.pop(slot, None)
            self.backend.slot_changed(slot)
        return slot

    def misfit(self, a: Adapter) -> str | None:
        """Why this adapter cannot run on this backbone (its layers, shapes, rank, image size), or None."""
        max_rank = self.max_rank
        linear = {n: m for n, m in self.backbone.named_modules()
                  if isinstance(m, (torch.nn.Linear, LoRALinear)) and not n.endswith(".base")}
        try:  # adapters name layers as transformers >= 5.18 does; an older one names them otherwise
            a.lora = fit_module_names(a.lora, linear)
        except AdapterError as e:
            return str(e)
        for module, (A, B) in a.lora.items():
            layer = linear.get(module)
            if layer is None:
                return f"LoRA targets {module!r}, which is not a linear layer of this backbone (another backbone?)"
            if A.shape[1] != layer.in_features or B.shape[0] != layer.out_features:
                return (f"{module}: LoRA A {tuple(A.shape)} / B {tuple(B.shape)} do not fit the layer "
                        f"({layer.in_features} -> {layer.out_features})")
        if a.lora and a.rank > max_rank:
            return f"rank {a.rank} > daemon.max_rank {max_rank}"
        size = a.head_config.get("image_size", self.image_size)
        if not isinstance(size, int) or size <= 0 or size % self.patch:
            return f"head_config image_size {size!r} is not a positive multiple of the patch size {self.patch}"
        return None

    def embed_layer(self, adapter: str) -> int:
        """The block whose input tokens an adapter's appearance embeddings pool: EMBED_LAYER, or earlier where the
        adapter's LoRA starts earlier (the tokens must be the plain backbone's, the same whatever adapter runs)."""
        return max(1, min([EMBED_LAYER, num_blocks(self.backbone), *lora_blocks(self.adapters[adapter])]))

    def catalog(self) -> Catalog:
        infos = {}
        blocks = num_blocks(self.backbone)
        for name, a in self.adapters.items():
            touched = lora_blocks(a)
            # LoRA outside the blocks (none in our adapters) would change the embeddings: no prefix to share
            first = min(touched) if len(touched) == len(a.lora) and touched else (0 if a.lora else blocks)
            infos[name] = AdapterInfo(name, self.slots[name], self.sizes[name], a.head.task,
                                      a.head.min_frames(a.head_config), a.trained, bool(a.lora), first,
                                      a.head.clips)
        has_lora = self.lora_ctx is not None and any(a.lora for a in self.adapters.values())
        return Catalog(infos, self.premerged, has_lora, self.image_size, self.max_batch_images, blocks)

    # ------------------------------------------------------------------ modes
    @property
    def weights_slot(self) -> int | None:
        return self.lora_ctx.weights_slot if self.lora_ctx is not None else None

    def switch(self, mode: LoRAMode) -> float:
        """Make the base weights hold what `mode` needs; seconds spent (0 when nothing changed)."""
        if self.lora_ctx is None or self.lora_ctx.weights_slot == mode.weights_slot:
            return 0.0
        t0 = time.perf_counter()
        switch_weights(self.backbone, mode.weights_slot)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ execution
    def pixels(self, frames: list[np.ndarray], size: int | None = None) -> torch.Tensor:
        """uint8 [H, W, 3] frames → the backend's model input [N, 3, size, size]."""
        return self.backend.pixels(frames, size)

    def features(self, frames: list[np.ndarray], slots: list[int], mode: LoRAMode | None = None,
                 size: int | None = None, prefix: int = 0, keep_pixels: bool = False) -> Features:
        """Backbone features of the frames (see BackboneBackend.features); mode defaults to the cheapest mode that
        needs no weight switch, size to the frames' own."""
        return self.backend.features(frames, slots, mode or self.default_mode(), size or frames[0].shape[0], prefix,
                                     keep_pixels)

    def default_mode(self) -> LoRAMode:
        """Without a plan (tools, tests): premerged when resident, else unmerged through ATMM (mixture while
        the base weights hold a slot)."""
        if self.lora_ctx is not None and self.lora_ctx.weights_slot is not None:
            return LoRAMode(MIXTURE, self.lora_ctx.weights_slot)
        return resting_mode(self.premerged)

    @torch.inference_mode()
    def execute(self, plan: BatchPlan) -> list[Payload]:
        """Run a plan: each request's typed result, in the plan's order."""
        now = time.monotonic()
        for key in plan.keys(bucketed=self.device.type == "cuda"):
            self.first_runs.setdefault(key, now)
        self.switch(plan.mode)
        results: list[Payload | None] = [None] * len(plan.requests)
        for group in plan.groups:
            self._run_size(plan, group, results)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return results

    def _run_size(self, plan: BatchPlan, group: SizeGroup, results: list) -> None:
        """One backbone forward for the group's requests (all at its image size), then each adapter's head on its
        requests' rows."""
        batch = plan.requests
        frames, keys, slots, rows = [], [], [], {}
        for i in group.members:
            r = batch[i]
            rows[i] = range(len(frames), len(frames) + r.num_images)
            frames.extend(r.frames)
            keys.extend(r.frame_keys)
            slots.extend([self.slots[r.adapter]] * r.num_images)
        # the model input rides along only for heads that read it (one copy per frame otherwise wasted), and the
        # tokens of a middle layer only for requests that want appearance embeddings
        embed = [i for i in group.members if batch[i].embed]
        keep_pixels = bool(embed) or any(self.adapters[batch[i].adapter].head.detail for i in group.members)
        mid_layer = min((self.embed_layer(batch[i].adapter) for i in embed), default=0)
        feats = self.backend.features(frames, slots, plan.mode, group.size, group.prefix, keep_pixels, keys, mid_layer)
        by_adapter: dict[str, list[int]] = {}
        for i in group.members:
            by_adapter.setdefault(batch[i].adapter, []).append(i)
        for name, idxs in by_adapter.items():
            mine = torch.tensor([j for i in idxs for j in rows[i]], device=self.device)
            # Each request's letterbox at the size the adapter runs at: heads place results in original pixels.
            clips = [Clip(batch[i].num_images, batch[i].letterbox.resized(group.size / batch[i].frames[0].shape[0]),
                          batch[i].orig_size, tuple(batch[i].frame_ts), batch[i].embed) for i in idxs]
            head = self.adapters[name].head
            forward = self.backend.head_forward(self.slots[name], head, group.size)  # None: the torch module
            # passed only when there is one: a plug-in head written to serve(feats, clips) keeps working
            served = head.serve(feats.select(mine), clips) if forward is None else \
                head.serve(feats.select(mine), clips, forward)
            for i, result in zip(idxs, served):
                results[i] = result
