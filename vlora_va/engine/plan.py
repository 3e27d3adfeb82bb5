"""Batch plans: what the scheduler decides and the engine executes (the scheduler makes them:
serving/scheduling/base.py `make_plan`).

A `BatchPlan` is a batch of requests plus everything the engine needs to run it without deciding anything:
the LoRA mode (and so which slot the base weights must hold), one backbone forward per image size, and the
cost the scheduler expected. `Catalog` is what the scheduler knows about the engine's adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlora_va.contracts.requests import Request
from vlora_va.engine.modes import PREMERGED, UNMERGED, LoRAMode


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    slot: int
    size: int  # the image size the adapter runs at
    task: str  # its head's task (contracts.plugins.HEADS): "detection", "action", ...
    min_frames: int  # fewest frames per request its head accepts (overload may thin clips down to this)
    trained: bool
    has_lora: bool
    first_block: int = 0  # the first backbone block its LoRA touches (blocks before it are the plain backbone)
    clips: bool = False  # its head takes a request's frames as one clip (engine.heads.Head.clips)


@dataclass(frozen=True)
class Catalog:
    """The engine's adapters and what it can do, as the scheduler sees them."""

    adapters: dict[str, AdapterInfo]
    can_premerge: bool  # per-slot premerged weights are resident
    has_lora: bool  # any LoRA at all (head-only adapters need no mode)
    image_size: int  # the side of the frames ingest sends
    max_batch_images: int
    blocks: int = 12  # transformer blocks of the backbone

    @property
    def sizes(self) -> list[int]:
        return sorted({a.size for a in self.adapters.values()})

    def resting_mode(self) -> LoRAMode:
        return resting_mode(self.can_premerge)


@dataclass(frozen=True)
class PlanKey:
    """What makes two batches run the same code: warm-up runs every key once before the daemon is ready
    (and a GPU engine would capture one graph per key). bucket: the images of one forward rounded up to a
    power of two where the batch size changes the code that runs (GPU); 0 on a CPU, where it does not."""

    size: int
    mode: str  # LoRAMode.kind
    bucket: int


def resting_mode(can_premerge: bool) -> LoRAMode:
    """The mode in which the base weights hold no adapter: premerged where resident, else unmerged (ATMM). What the
    engine rests in (after warm-up, before a slot is rewritten) and what load accounting prices."""
    return LoRAMode(PREMERGED if can_premerge else UNMERGED)


def bucket(images: int) -> int:
    return 1 << max(0, (images - 1).bit_length())


@dataclass(frozen=True)
class SizeGroup:
    size: int
    members: tuple[int, ...]  # indices into BatchPlan.requests
    prefix: int = 0  # blocks [0, prefix) run once per distinct frame, for all its requests (shared prefix)


@dataclass
class BatchPlan:
    requests: list[Request]
    mode: LoRAMode
    groups: tuple[SizeGroup, ...]
    est_s: float = 0.0  # the cost model's prediction, weight switch included
    raw_s: float = 0.0  # the same before the online correction (what the correction learns from)
    switch_s: float = 0.0  # the part of est_s spent switching the base weights
    notes: dict = field(default_factory=dict)  # why this plan (for logs and tests), e.g. {"starving": 2}

    @property
    def images(self) -> int:
        return sum(r.num_images for r in self.requests)

    def keys(self, bucketed: bool = False) -> list[PlanKey]:
        return [PlanKey(g.size, self.mode.kind,
                        bucket(sum(self.requests[i].num_images for i in g.members)) if bucketed else 0)
                for g in self.groups]
