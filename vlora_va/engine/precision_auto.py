"""How `daemon.precision: auto` picks the backbone's precision on this machine (the precisions themselves, what the
machine can do and the int8 kernels: engine/precision.py).

`auto` (the default) picks per machine: on CUDA bf16 (as `daemon.dtype: auto` always did); on a CPU the fastest
of the precisions that (1) this CPU runs natively (bf16 only with native bf16, int8 only with fbgemm), (2) every
served adapter passed the accuracy gate for (`GATE_FILE` beside the adapter, written by
`bench/precision_accuracy.py`: the held-out paired difference to fp32 whose bootstrap 95% interval must not lie
below `GATE_MIN_DELTA`, for the adapter's exact weights), and (3) measured faster than fp32 on this machine by
`SPEED_MARGIN` (`measure_speeds`: a few interleaved forwards of the pipeline's own mix of image sizes, cached
beside the cost profiles, and re-checked at each start by one fresh round of the two fastest: `ranking_holds`).
"""

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

from vlora_va.engine.precision import (
    Capabilities,
    PrecisionError,
    device_name,
    dtype_of,
    gate_key,
    precision_copy,
    reduce_range,
)

log = logging.getLogger(__name__)

GATE_FILE = "precision.json"  # an adapter's accuracy-gate results, beside its weights
GATE_MIN_DELTA = -0.01  # a precision stays off when its accuracy interval (vs fp32) lies below this
SPEED_MARGIN = 0.95  # auto takes a lower precision only when it runs in at most this share of the fp32 time


# ---------------------------------------------------------------- the accuracy gate
def adapter_digest(adapter) -> str:
    """What the gate's results belong to: the adapter's files (its sha256; recomputed for adapters loaded
    without one)."""
    if getattr(adapter, "sha256", ""):
        return adapter.sha256
    h = hashlib.sha256()
    for name in sorted(adapter.lora):
        a, b = adapter.lora[name]
        h.update(name.encode() + a.float().numpy().tobytes() + b.float().numpy().tobytes())
    return h.hexdigest()


def gate_of(adapter) -> dict:
    """{precision: {"passes": bool, ...}} from the adapter's GATE_FILE, or {} when it has none or the file was
    measured on other weights."""
    path = Path(getattr(adapter, "path", "") or ".") / GATE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("adapter_sha256") != adapter_digest(adapter):
        log.info("adapter %s: %s is missing or belongs to other weights: no precision but fp32 is gated for it",
                 adapter.name, path)
        return {}
    return data.get("precisions", {}) if isinstance(data.get("precisions"), dict) else {}


def gate_allows(adapters: dict, precision: str) -> str | None:
    """Why the accuracy gate keeps `precision` off for these adapters (None: every one passed it)."""
    if precision == "fp32":
        return None
    key = gate_key(precision)
    for name, a in adapters.items():
        entry = gate_of(a).get(key)
        if not entry:
            return f"adapter {name} has no accuracy-gate result for {key}"
        if not entry.get("passes"):
            return f"adapter {name} failed the accuracy gate for {key} ({entry.get('summary', 'see its ' + GATE_FILE)})"
    return None


def gate_entry(deltas: dict[str, dict]) -> dict:
    """An adapter's gate entry for one precision from its paired differences {metric: {"delta", "ci95"}}: it
    passes when no metric's 95% interval lies wholly below GATE_MIN_DELTA."""
    failing = [m for m, d in deltas.items() if d["ci95"][1] < GATE_MIN_DELTA]
    summary = "; ".join(f"{m} {d['delta']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" for m, d in deltas.items())
    return {"passes": not failing, "failing": failing, "summary": summary, "metrics": deltas}


# ---------------------------------------------------------------- choosing
@dataclass(frozen=True)
class Choice:
    precision: str
    reason: str


def candidates(caps: Capabilities, gate: dict[str, str | None], dtype_setting: str = "auto") -> tuple[list[str], list[str]]:
    """(the precisions auto may take on this CPU: fp32 first, why each other one may not)."""
    usable, notes = ["fp32"], []
    for p in ("bf16", "int8"):
        if p == "bf16" and dtype_setting == "float32":
            notes.append("bf16: daemon.dtype is float32")
        elif p == "bf16" and not caps.native_bf16:
            notes.append("bf16: no native bf16 on this CPU")
        elif caps.runs(p):
            notes.append(f"{p}: {caps.runs(p)}")
        elif gate.get(p):
            notes.append(f"{p}: {gate[p]}")
        else:
            usable.append(p)
    return usable, notes


def choose(setting: str, caps: Capabilities, gate: dict[str, str | None], speeds: dict[str, float] | None,
           dtype_setting: str = "auto") -> Choice:
    """The precision to run. setting: daemon.precision ("auto" or one of PRECISIONS); gate: {precision: why the
    accuracy gate keeps it off, or None}; speeds: {precision: measured seconds of the same work,
    `measure_speeds`} (None: not measured); dtype_setting: daemon.dtype (an explicit bfloat16 / float16 fixes
    the precision)."""
    if setting != "auto":
        why = caps.runs(setting)
        if why:
            raise PrecisionError(f"daemon.precision {setting}: {why}")
        notes = [] if setting != "bf16" or caps.native_bf16 else ["no native bf16 on this CPU: expect it slower than fp32"]
        if gate.get(setting):
            notes.append(f"not what auto would take: {gate[setting]}")
        return Choice(setting, "configured" + (f" ({'; '.join(notes)})" if notes else ""))
    if dtype_setting in ("bfloat16", "float16"):
        return Choice("bf16" if dtype_setting == "bfloat16" else "fp16", f"daemon.dtype {dtype_setting}")
    if caps.device == "cuda":
        return Choice("fp32" if dtype_setting == "float32" else "bf16", "CUDA: bf16 unless daemon.dtype says float32")
    usable, notes = candidates(caps, gate, dtype_setting)
    if len(usable) == 1:
        return Choice("fp32", "; ".join(notes) or "nothing else runs here")
    if not speeds or "fp32" not in speeds:
        return Choice("fp32", f"{', '.join(usable[1:])} not measured on this machine")
    timed = {p: speeds[p] for p in usable if p in speeds}
    best = min(timed, key=timed.get)
    ratios = ", ".join(f"{p} {timed[p] / speeds['fp32']:.2f}x" for p in timed if p != "fp32")
    if best == "fp32" or timed[best] > SPEED_MARGIN * speeds["fp32"]:
        return Choice("fp32", f"no precision measured faster than fp32 here ({ratios})")
    return Choice(best, f"fastest here ({ratios} of fp32), accuracy gate passed")


# ---------------------------------------------------------------- measuring speed (auto on a CPU)
PROBE_MAX_IMAGES = 4  # images per size in one timed forward (CPU time is near linear in images: scaled up)
RECHECK_MARGIN = 1.10  # a cached ranking holds while its fastest runs within this of the runner-up, measured now


def speed_key(caps: Capabilities, backbone_id: str, backbone: nn.Module, workload: dict[int, float]) -> dict:
    cfg = backbone.config
    return {"version": 2, "kind": "precision-speeds", "device": device_name(torch.device(caps.device)),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "backbone": backbone_id,
            "backbone_shape": [getattr(cfg, k, None) for k in ("hidden_size", "num_hidden_layers", "intermediate_size")],
            "workload": {str(s): round(n, 3) for s, n in sorted(workload.items())}, "reduce_range": reduce_range()}


def _speed_path(directory: Path, key: dict) -> Path:
    return directory / f"precision-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"


def measure_speeds(backbone: nn.Module, precisions: list[str], workload: dict[int, float],
                   rounds: int = 3) -> dict[str, float]:
    """Seconds of backbone compute one second of the pipeline's images takes in each precision.

    workload: images per second the pipeline sends, by image size. Per size one plain-backbone forward of
    min(PROBE_MAX_IMAGES, ceil(images/s)) random images, scaled to the images per second, summed over sizes:
    the mix decides (on this project's reference CPU the plain backbone ran bf16 ahead at 224 px and int8 ahead
    at 336, so equal weights per size can rank them wrong for a pipeline's mix). The fastest of `rounds` interleaved rounds: the machine's own cost, as
    the cost profile takes it (`profiling._timed`); a burst of other load slows precisions unevenly (int8 ran 1.7x,
    bf16 1.2x slower in a start-up probe on a busy host) and would otherwise decide."""
    models = {p: precision_copy(backbone, p) for p in precisions}
    batches = [(torch.randn(min(PROBE_MAX_IMAGES, max(1, math.ceil(n))), 3, s, s), n) for s, n in workload.items()]

    def run(p: str) -> float:
        total = 0.0
        with torch.inference_mode():
            for x, per_s in batches:
                t0 = time.perf_counter()
                models[p](pixel_values=x.to(dtype_of(p)))
                total += (time.perf_counter() - t0) * per_s / len(x)
        return total

    times: dict[str, list[float]] = {p: [] for p in precisions}
    for p in precisions:
        run(p)  # warm-up: first touches, packing, kernel selection
    for _ in range(rounds):
        for p in precisions:
            times[p].append(run(p))
    return {p: min(t) for p, t in times.items()}


def ranking_holds(speeds: dict[str, float], measure) -> bool:
    """Whether cached speeds still rank right here: one fresh round (`measure(precisions)`) of the cached fastest
    and the runner-up. A cache taken while other work shared the cores can rank them wrong (int8 and bf16 suffer
    differently from a neighbour), and the choice would then stay wrong for every later start."""
    if len(speeds) < 2:
        return True
    first, second = sorted(speeds, key=speeds.get)[:2]
    fresh = measure([first, second])
    return fresh[first] <= RECHECK_MARGIN * fresh[second]


def cached_speeds(directory: Path, key: dict, measure, still_holds=None) -> dict[str, float]:
    """The speeds measured for `key` (this machine, threads, torch, backbone, workload) while `still_holds(speeds)`
    agrees with them; otherwise measure() and cache."""
    path = _speed_path(directory, key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") == key:
            speeds = {p: float(s) for p, s in data["speeds"].items()}
            if still_holds is None or still_holds(speeds):
                return speeds
            log.warning("cached precision speeds (%s) no longer rank the precisions right here: measuring again",
                        path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    speeds = measure()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "speeds": speeds}, indent=1))
        tmp.rename(path)
    except OSError as e:
        log.warning("precision speeds not cached (%s)", e)
    return speeds


def pick(setting: str, dtype_setting: str, device: str, backbone: nn.Module, backbone_id: str, adapters: dict,
         workload: dict[int, float], cache_dir: Path) -> Choice:
    """The daemon's precision for this machine, adapter set and workload (images per second by image size; see
    the module docstring)."""
    caps = Capabilities.detect(device)
    gate = {p: gate_allows(adapters, p) for p in ("bf16", "int8")}
    if setting != "auto" or caps.device != "cpu" or dtype_setting in ("bfloat16", "float16"):
        return choose(setting, caps, gate, None, dtype_setting)
    usable, _ = candidates(caps, gate, dtype_setting)
    if len(usable) == 1:
        return choose(setting, caps, gate, None, dtype_setting)
    key = speed_key(caps, backbone_id, backbone, workload)
    t0 = time.perf_counter()
    speeds = cached_speeds(cache_dir, key, lambda: measure_speeds(backbone, usable, workload),
                           lambda cached: ranking_holds(cached, lambda ps: measure_speeds(backbone, ps, workload, 1)))
    mix = ", ".join(f"{n:g}/s at {s} px" for s, n in sorted(workload.items()))
    log.info("precision speeds (%.1f s; seconds of backbone compute per second of the pipeline's images, %s): %s",
             time.perf_counter() - t0, mix, ", ".join(f"{p} {s:.3f}" for p, s in speeds.items()))
    return choose(setting, caps, gate, speeds, dtype_setting)
