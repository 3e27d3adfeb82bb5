"""The admission estimate: the configured load (streams x tasks) against what this machine measured it can
do, said plainly before anything runs (`vlora-va validate --profile`, the start of `vlora-va run`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlora_va.contracts.config import PipelineConfig
from vlora_va.engine.plan import Catalog
from vlora_va.serving.admission import TARGET_UTILISATION
from vlora_va.serving.costs import CostModel


@dataclass(frozen=True)
class Estimate:
    images_per_s: dict[int, float]  # configured images per second, by the size they run at
    need_s: float  # seconds of compute per second of video
    capacity_images_per_s: float  # images per second this machine serves at this mix
    message: str

    @property
    def fits(self) -> bool:
        return self.need_s <= TARGET_UTILISATION


def offered_images(config: PipelineConfig, sizes: dict[str, int]) -> tuple[dict[int, float], dict[int, set]]:
    """Images per second the pipeline sends, by image size, and the adapters at each size. sizes: each served
    adapter's image size."""
    per_size: dict[int, float] = {}
    adapters: dict[int, set] = {}
    for s in config.streams:
        for t in s.tasks:
            size = sizes.get(t.adapter)
            if size is None:  # an adapter that failed to load: its requests get error rows, no compute
                continue
            per_size[size] = per_size.get(size, 0.0) + t.frames_per_chunk / s.chunk_seconds
            adapters.setdefault(size, set()).add(t.adapter)
    return per_size, adapters


def estimate(config: PipelineConfig, catalog: Catalog, costs: CostModel, where: str = "here") -> Estimate:
    per_size, adapters = offered_images(config, {n: a.size for n, a in catalog.adapters.items()})
    mode = catalog.resting_mode()
    # One second's images per size as batches of at most the batch the daemon runs (max_batch_images, or less
    # where the profile shows larger batches cost more per image: CostModel.efficient_batch).
    need = 0.0
    batch = costs.efficient_batch(catalog.max_batch_images)
    for size, images in per_size.items():
        full, rest = divmod(images, batch)
        k = len(adapters[size])
        need += full * costs.forward_s(size, batch, mode, k) * costs.correction
        need += costs.forward_s(size, rest, mode, k) * costs.correction if rest else 0.0
    total = sum(per_size.values())
    capacity = total / need if need > 0 else float("inf")
    streams = f"{len(config.streams)} stream(s), {total:.0f} images/s"
    if need <= TARGET_UTILISATION:
        msg = (f"{streams}: needs {need:.2f} s of compute per second {where}: fits "
               f"({max(0.0, 1 - need):.0%} headroom; about {capacity:.0f} images/s at this mix)")
    else:
        shed = 1 - TARGET_UTILISATION / need
        msg = (f"{streams}: needs {need:.2f} s of compute per second {where} (about {capacity:.0f} images/s at "
               f"this mix): about {shed:.0%} of the work will be shed, lowest priority first (daemon.degrade: "
               f"{config.daemon.degrade}); lower fps or frames_per_chunk, or add a machine")
    return Estimate(per_size, need, capacity, msg)
