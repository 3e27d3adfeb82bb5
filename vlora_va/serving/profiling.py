"""Profiling: measuring what batches cost on THIS machine, at start-up, and keeping the result.

`measure_profile` times the real engine on the actual device, a coarse grid that stays within ~15-25 s on 2 CPU cores
(what it measures: serving/costs.py). The profile is cached (`profile_path`), keyed by the CPU or GPU model, thread
count, torch, backbone and adapter set, so a restart reuses it, once one batch per size agrees with it
(`stale_ratio`: a profile taken while other work shared the cores is measured again). Only a profile measured on a
quiet machine is cached (common/machine_load.py): one measured under load serves its run, and the next start
measures again (`load_or_measure`). `warm_up` runs every plan key the daemon will use once before it says it is
ready.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from vlora_va.common import machine_load
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode
from vlora_va.engine.plan import BatchPlan, Catalog, SizeGroup
from vlora_va.engine.precision import device_name, precision_of
from vlora_va.serving.costs import CostProfile, mode_name

log = logging.getLogger(__name__)

PROFILE_VERSION = 2  # 2: CPU profiles measure batches up to max_batch_images (profile_batches), not only 1 and 4
# A cached profile is checked against one batch per size at start-up and measured again when it is this far off
# (taken while other work shared the cores, or on a faster day) by at least STALE_MIN_S a batch: the online
# correction would get there too, but only after shedding work the machine could have served.
STALE_RATIO = 1.5
STALE_MIN_S = 0.05


# ---------------------------------------------------------------- the cache
def profile_key(device: torch.device, backbone_id: str, backbone: torch.nn.Module, catalog: Catalog,
                adapter_ranks: dict[str, int], modes: list[str], backend: str = "torch", precision: str = "") -> dict:
    """What a cost profile is valid for. backend: the engine's backbone backend; precision: what it computes in
    where the backend applies it itself (the torch model then stays float32)."""
    cfg = backbone.config
    return {
        "version": PROFILE_VERSION, "device": device_name(device), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "backbone": backbone_id,
        "backbone_shape": [getattr(cfg, k, None) for k in ("hidden_size", "num_hidden_layers", "intermediate_size")],
        "adapters": sorted([a.name, a.size, a.task, adapter_ranks.get(a.name, 0)] for a in catalog.adapters.values()),
        "premerged": catalog.can_premerge, "image_size": catalog.image_size, "max_batch": catalog.max_batch_images,
        "modes": sorted(modes), "dtype": str(next(backbone.parameters()).dtype).removeprefix("torch."),
        "precision": precision_of(backbone) if backend == "torch" else precision, "backend": backend,
    }


def profile_dir(configured: str = "") -> Path:
    """configured (daemon.profile_cache), else $VLORA_VA_PROFILES, else ~/.cache/vlora-va/profiles."""
    if configured:
        return Path(configured)
    return Path(os.environ.get("VLORA_VA_PROFILES", Path.home() / ".cache" / "vlora-va" / "profiles"))


def profile_path(directory: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return directory / f"profile-{digest}.json"


def load_cached(directory: Path, key: dict) -> CostProfile | None:
    path = profile_path(directory, key)
    try:
        profile = CostProfile.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("cost profile %s unreadable (%s): measuring again", path, e)
        return None
    return profile if profile.key == key else None


def save(directory: Path, profile: CostProfile) -> Path:
    path = profile_path(directory, profile.key)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(profile.to_json(), indent=1))
    tmp.rename(path)  # atomic: two daemons starting together never read half a file
    return path


# ---------------------------------------------------------------- measuring
def synthetic_requests(catalog: Catalog, adapter: str, n: int, seed: int = 0) -> list[Request]:
    """n one-image requests for `adapter` with random frames at the size ingest sends (the engine's resize
    is part of the cost). An adapter whose head reads clips gets its images as one clip."""
    side = catalog.image_size
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 255, (side, side, 3), dtype=np.uint8) for _ in range(n)]
    now = time.time()
    info = catalog.adapters[adapter]
    per = [frames] if info.clips else [[f] for f in frames]
    return [Request("profile", i, adapter, adapter, fs, [0.1 * j for j in range(len(fs))], Letterbox(1.0, 0.0, 0.0),
                    (side, side), now, now, now + 60.0) for i, fs in enumerate(per)]


def _timed(fn, repeats: int, sync, warm: bool = True) -> float:
    """The fastest of `repeats` runs: the machine's own cost, without the bursts other processes add (the
    online correction follows those)."""
    if warm:
        fn()  # first touches, allocations
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def batch_sizes(device: torch.device, max_batch: int) -> list[int]:
    """Where to measure the base cost and warm up. CPU time is close to linear in images: two points. GPU
    time is not, and each batch bucket is its own compiled code there."""
    if device.type == "cuda":
        return sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= max_batch} | {max_batch})
    return sorted({1, min(4, max_batch)})


def profile_batches(device: torch.device, max_batch: int) -> list[int]:
    """Where the base cost is measured. On a CPU, 1 and 4 give the per-image slope, and 8 and the largest batch
    say where that slope stops holding: DINOv2-S in float32 on 2 cores costs ~12% more per image at 16 than at 4-8
    (its activations outgrow the caches), which a line through 1 and 4 cannot show (CostModel.efficient_batch)."""
    if device.type == "cuda":
        return batch_sizes(device, max_batch)
    return sorted({n for n in (1, 4, 8) if n <= max_batch} | {max_batch})


def measure_profile(engine, catalog: Catalog, key: dict, modes: list[str] | None = None) -> CostProfile:
    """Time the engine on this device (see the module docstring). `modes`: which LoRA mode names (see
    `mode_name`) to measure factors for (default: every mode the engine can run)."""
    t_start = time.perf_counter()
    cuda = engine.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(engine.device)) if cuda else (lambda: None)
    repeats = 5 if cuda else 3
    names = list(catalog.adapters)
    slots = {n: catalog.adapters[n].slot for n in names}
    base: dict[int, list[tuple[int, float]]] = {}
    for size in catalog.sizes:
        rep = next(n for n in names if catalog.adapters[n].size == size)
        mode = LoRAMode(MERGED, slots[rep]) if catalog.has_lora else LoRAMode(UNMERGED)
        points = []
        for i, n in enumerate(profile_batches(engine.device, catalog.max_batch_images)):
            reqs = synthetic_requests(catalog, rep, n)
            plan = BatchPlan(reqs, mode, (SizeGroup(size, tuple(range(len(reqs)))),))
            # large CPU batches take seconds each: two runs of them (the start-up stays within ~15-25 s)
            times = repeats if cuda or n <= 4 else 2
            points.append((n, _timed(lambda: engine.execute(plan), times, sync, warm=i == 0 or cuda)))
        base[size] = points
    factors, switch_s = {}, 0.0
    if catalog.has_lora:
        factors, switch_s = _measure_modes(engine, catalog, slots, modes, repeats, sync)
    engine.switch(catalog.resting_mode())
    profile = CostProfile(key, base, factors, switch_s, measured_s=time.perf_counter() - t_start,
                          created=time.strftime("%Y-%m-%dT%H:%M:%S"))
    log.info("cost profile measured in %.1f s: %s", profile.measured_s, describe(profile))
    return profile


def _measure_modes(engine, catalog: Catalog, slots: dict[str, int], modes, repeats: int, sync):
    """Mode factors on the backbone forward alone, at the smallest size, one image per adapter (up to 4)."""
    size = catalog.sizes[0]
    lora = [s for name, s in slots.items() if catalog.adapters[name].has_lora] or list(slots.values())
    k_max = max(1, min(len(lora), 4))
    n = k_max if engine.device.type != "cuda" else max(k_max, min(32, catalog.max_batch_images))
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 255, (catalog.image_size,) * 2 + (3,), dtype=np.uint8) for _ in range(n)]
    mixed = [lora[i * k_max // n] for i in range(n)]  # k_max adapters, equal shares
    one = [lora[0]] * n

    def once(mode, row_slots) -> float:
        engine.switch(mode)  # untimed: switches are measured below
        return _timed(lambda: engine.features(frames, row_slots, mode, size), 1, sync, warm=False)

    merged_mode = LoRAMode(MERGED, lora[0])
    once(merged_mode, one)  # warm-up

    def ratio(mode, row_slots) -> float:
        """Time in `mode` over the merged time, runs interleaved (merged, mode, merged, mode, ...): a burst
        of load from another process hits both, and the fastest of each is compared."""
        once(mode, row_slots)  # warm-up of this mode
        pairs = [(once(merged_mode, one), once(mode, row_slots)) for _ in range(repeats + 1)]
        return min(m for _, m in pairs) / min(b for b, _ in pairs)

    wanted = set(modes) if modes is not None else None
    # (mode, whether one adapter alone costs more than merged weights: premerged and mixture do not)
    candidates = [(LoRAMode(UNMERGED), True), (LoRAMode(UNMERGED, impl="einsum"), True),
                  (LoRAMode(MIXTURE, lora[0]), False)]
    if catalog.can_premerge:
        candidates.insert(0, (LoRAMode(PREMERGED), False))
    factors: dict[str, dict[int, float]] = {}
    for mode, one_costs in candidates:
        name = mode_name(mode)
        if wanted is not None and name not in wanted:
            continue
        f = {1: ratio(mode, one) if one_costs else 1.0}
        if k_max > 1:
            f[k_max] = ratio(mode, mixed)
        factors[name] = f
    factors[MERGED] = {1: 1.0}
    switches = []
    for target in (lora[-1], None, lora[0], None):
        t0 = time.perf_counter()
        engine.switch(LoRAMode(MERGED, target) if target is not None else LoRAMode(UNMERGED))
        sync()
        switches.append(time.perf_counter() - t0)
    return factors, statistics.median(switches)


def describe(p: CostProfile) -> str:
    sizes = ", ".join(f"{s} px {pts[-1][1] / pts[-1][0] * 1000:.0f} ms/image" for s, pts in sorted(p.base.items()))
    modes = ", ".join(f"{m} x{max(f.values()):.2f}" for m, f in sorted(p.factors.items()) if m != MERGED)
    return f"{sizes}; modes {modes or 'n/a'}; switch {p.switch_s * 1000:.1f} ms"


def load_or_measure(engine, catalog: Catalog, key: dict, directory: Path, modes: list[str] | None = None,
                    remeasure: bool = False, load=None) -> CostProfile:
    """The cached profile while it holds (`stale_ratio`), else one measured now. A profile measured while other
    processes took more than the quiet share of the CPUs serves this run (the online correction follows the
    load) but is not cached: the next start measures again. A cached profile faster than the machine now, checked
    while it is busy, is kept: it is the quiet measurement, and the load is what the online correction follows. One
    slower than the machine now is wrong whatever the load, and is measured again. load: how the load is read
    (default machine_load.others_share)."""
    load = load or machine_load.others_share
    cached = None if remeasure else load_cached(directory, key)
    if cached is not None:
        log.info("cost profile from %s (%s)", profile_path(directory, key), describe(cached))
        ratio, share = load(lambda: stale_ratio(engine, catalog, cached))
        if ratio is None:
            return cached
        if ratio < 1 and not machine_load.quiet(share):  # faster than now only because others take the cores now
            log.info("the cached cost profile is %.2fx this machine's speed now, but the machine is busy (%s): "
                     "keeping it (the online correction follows the load)", ratio, machine_load.describe(share))
            return cached
        log.warning("the cached cost profile is %.2fx this machine's speed now (it was measured %s, under other "
                    "load or on another day): measuring again", ratio, cached.created)
    profile, share = load(lambda: measure_profile(engine, catalog, key, modes))
    if not machine_load.quiet(share):
        log.warning("cost profile measured on a busy machine (%s): it serves this run and is not cached; the next "
                    "start measures again", machine_load.describe(share))
        return profile
    try:
        path = save(directory, profile)
        log.info("cost profile cached in %s", path)
    except OSError as e:
        log.warning("cost profile not cached (%s): the next start measures again", e)
    return profile


def stale_ratio(engine, catalog: Catalog, profile: CostProfile) -> float | None:
    """Cached over observed time of the largest measured batch at each size (merged, as measured, fastest of 2),
    the median over sizes; None while the profile holds (within STALE_RATIO, or off by less than STALE_MIN_S)."""
    cuda = engine.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(engine.device)) if cuda else (lambda: None)
    names = list(catalog.adapters)
    ratios, gaps = [], []
    for size in catalog.sizes:
        points = profile.base.get(size)
        if not points:
            return None
        n, cached_s = points[-1]
        rep = next(a for a in names if catalog.adapters[a].size == size)
        mode = LoRAMode(MERGED, catalog.adapters[rep].slot) if catalog.has_lora else LoRAMode(UNMERGED)
        reqs = synthetic_requests(catalog, rep, n)
        plan = BatchPlan(reqs, mode, (SizeGroup(size, tuple(range(len(reqs)))),))
        now_s = _timed(lambda: engine.execute(plan), 2, sync)
        ratios.append(cached_s / now_s)
        gaps.append(abs(cached_s - now_s))
    engine.switch(catalog.resting_mode())
    ratio = statistics.median(ratios)
    off = not (1 / STALE_RATIO <= ratio <= STALE_RATIO) and statistics.median(gaps) >= STALE_MIN_S
    return ratio if off else None


# ---------------------------------------------------------------- warm-up
def warm_up(engine, catalog: Catalog, modes_by_size: dict[int, list[LoRAMode]], images: list[int],
            bucketed: bool = False) -> set:
    """Run every plan key the daemon will use once (size x mode x batch bucket), so no request pays a first
    call's costs (allocations, kernel selection; on a GPU, compilation). Outside merged mode the batches mix
    every adapter served at that size, so the multi-adapter paths run too (an adapter never runs at another size:
    warming it there built models nothing uses, for the openvino backend float ones, uncalibrated, ~1 s and ~100 MB
    each). Returns the keys run."""
    by_slot = {a.slot: n for n, a in catalog.adapters.items()}
    done = set()
    for size, modes in modes_by_size.items():
        names = [n for n, a in catalog.adapters.items() if a.size == size] or list(catalog.adapters)
        for mode in modes:
            for n in images:
                if mode.kind == MERGED:
                    mine = [by_slot[mode.slot]] * n
                else:
                    mine = [names[i % len(names)] for i in range(n)]
                reqs = [synthetic_requests(catalog, a, 1, seed=i)[0] for i, a in enumerate(mine)]
                plan = BatchPlan(reqs, mode, (SizeGroup(size, tuple(range(len(reqs)))),))
                engine.execute(plan)
                done.update(plan.keys(bucketed))
    return done
