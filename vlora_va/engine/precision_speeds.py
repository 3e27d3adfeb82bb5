"""Measuring the precisions `daemon.precision: auto` chooses among (engine/precision_choice.py chooses): which
backend computes each candidate, how fast each runs the pipeline's mix of image sizes on this machine, and the cache
of the last start's speeds and choice, keyed by what changes them."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vlora_va.common import machine_load
from vlora_va.contracts.plugins import BACKBONE_BACKENDS
from vlora_va.engine.precision import Capabilities, device_name, dtype_of, precision_copy, reduce_range

# auto's logger: the probes are part of what it says at a start
log = logging.getLogger("vlora_va.engine.precision_choice")


# ---------------------------------------------------------------- which backend computes a candidate
def competing() -> list[tuple[str, type]]:
    """(name, class) of every registered backbone backend whose precisions compete in `daemon.backend: auto`
    (BackboneBackend.auto_precisions), in registry order: a backend a plug-in registers competes too."""
    out = []
    for name in BACKBONE_BACKENDS.names():
        backend = BACKBONE_BACKENDS.load(name)
        if backend.auto_precisions:
            out.append((name, backend))
    return out


def split_choice(label: str) -> tuple[str, str]:
    """(daemon.backend, precision) of a candidate: "openvino-bf16" -> ("openvino", "bf16"), "int8" -> ("torch", ...)."""
    for name, _ in competing():
        if label.startswith(name + "-"):
            return name, label.removeprefix(name + "-")
    return "torch", label


# ---------------------------------------------------------------- measuring speed (auto on a CPU)
PROBE_MAX_IMAGES = 4  # images per size in one timed forward (CPU time is near linear in images: scaled up)
FULL_ROUNDS = 3  # interleaved rounds of a full measurement (the fastest counts); a re-check times one


def speed_key(caps: Capabilities, backbone_id: str, backbone: nn.Module, workload: dict[int, float],
              auto_backend: bool = False) -> dict:
    cfg = backbone.config
    key = {"version": 2, "kind": "precision-speeds", "device": device_name(torch.device(caps.device)),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "backbone": backbone_id,
            "backbone_shape": [getattr(cfg, k, None) for k in ("hidden_size", "num_hidden_layers", "intermediate_size")],
            "workload": {str(s): round(n, 3) for s, n in sorted(workload.items())}, "reduce_range": reduce_range()}
    if auto_backend:  # the competing backends' candidates too: what their speeds depend on (openvino: its version, its
        # int8's float hint)
        for _, backend in competing():
            key.update(backend.auto_key())
    return key


def speed_path(directory: Path, key: dict) -> Path:
    return directory / f"precision-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"


def measure_speeds(backbone: nn.Module, precisions: list[str], workload: dict[int, float],
                   rounds: int = FULL_ROUNDS, parts: dict | None = None) -> dict[str, float]:
    """Seconds of backbone compute one second of the pipeline's images takes in each precision.

    workload: images per second the pipeline sends, by image size. Per size one plain-backbone forward of
    min(PROBE_MAX_IMAGES, ceil(images/s)) random images, scaled to the images per second, summed over sizes:
    the mix decides (on this project's reference CPU the plain backbone ran bf16 ahead at 224 px and int8 ahead
    at 336, so equal weights per size can rank them wrong for a pipeline's mix). The fastest of `rounds` interleaved rounds: the machine's own cost, as
    the cost profile takes it (`profiling._timed`); a burst of other load slows precisions unevenly (int8 ran 1.7x,
    bf16 1.2x slower in a start-up probe on a busy host) and would otherwise decide. parts: {backend name: what its
    `auto_gates` returned for its `plain` backbone} (openvino: the calibrated int8 models "openvino-int8" runs)."""
    models = {p: _plain(backbone, p, parts or {}) for p in precisions}
    batches = [(torch.randn(min(PROBE_MAX_IMAGES, max(1, math.ceil(n))), 3, s, s), n) for s, n in workload.items()]

    def run(p: str) -> float:
        total = 0.0
        with torch.inference_mode():
            for x, per_s in batches:
                t0 = time.perf_counter()
                models[p](pixel_values=x if split_choice(p)[0] != "torch" else x.to(dtype_of(p)))
                total += (time.perf_counter() - t0) * per_s / len(x)
        return total

    times: dict[str, list[float]] = {p: [] for p in precisions}
    for p in precisions:
        run(p)  # warm-up: first touches, packing, kernel selection
    for _ in range(rounds):
        for p in precisions:
            times[p].append(run(p))
    return {p: min(t) for p, t in times.items()}


def _plain(backbone: nn.Module, label: str, parts: dict):
    """The backbone computing as a candidate does: a torch copy in that precision, or the plain backbone of the
    backend that computes it (openvino: compiled by OpenVINO; int8: the calibrated parts)."""
    backend, precision = split_choice(label)
    if backend != "torch":
        return BACKBONE_BACKENDS.load(backend).plain(backbone, precision, parts.get(backend))
    return precision_copy(backbone, label)


@dataclass(frozen=True)
class Probe:
    """Speeds measured now (`measure_speeds`), and how busy the rest of the machine was meanwhile."""
    speeds: dict[str, float]
    others: float | None  # share of the CPUs other processes took while measuring (None: not readable here)

    @property
    def quiet(self) -> bool:
        return machine_load.quiet(self.others)

    @property
    def load(self) -> str:
        return machine_load.describe(self.others)


# ---------------------------------------------------------------- the cache: last start's speeds and choice
@dataclass(frozen=True)
class Cached:
    speeds: dict[str, float]
    choice: str | None  # None: a cache written before choices were kept


def read_cache(directory: Path, key: dict) -> Cached | None:
    """What the last start measured and chose for `key`; None when nothing is cached for it (a changed key: other
    threads, torch, backbone, workload ... names another file) or the file is unreadable or holds another key."""
    path = speed_path(directory, key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            log.info("%s holds precision speeds for another key: measuring again", path)
            return None
        choice = data.get("choice")
        return Cached({p: float(t) for p, t in data["speeds"].items()}, choice if isinstance(choice, str) else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_cache(directory: Path, key: dict, probe: Probe, choice: str) -> None:
    path = speed_path(directory, key)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "speeds": probe.speeds, "choice": choice, "others_share": probe.others},
                                  indent=1))
        tmp.rename(path)
    except OSError as e:
        log.warning("precision speeds not cached (%s)", e)


def prober(backbone: nn.Module, workload: dict[int, float], parts: dict | None = None):
    """probe(precisions, rounds) -> Probe: `measure_speeds` of this backbone and workload, with the machine's load
    meanwhile; each probe is logged."""
    mix = ", ".join(f"{n:g}/s at {s} px" for s, n in sorted(workload.items()))

    def probe(precisions: list[str], rounds: int) -> Probe:
        t0 = time.perf_counter()
        speeds, others = machine_load.others_share(
            lambda: measure_speeds(backbone, precisions, workload, rounds, parts))
        measured = Probe(speeds, others)
        log.info("precision speeds (%d round%s, %.1f s, %s; seconds of backbone compute per second of the "
                 "pipeline's images, %s): %s", rounds, "s" * (rounds > 1), time.perf_counter() - t0, measured.load,
                 mix, ", ".join(f"{p} {t:.3f}" for p, t in speeds.items()))
        return measured

    return probe
