"""How `daemon.precision: auto` picks the backbone's precision on this machine (the precisions themselves, what the
machine can do and the int8 kernels: engine/precision.py).

`auto` (the default) picks per machine: on CUDA bf16 (as `daemon.dtype: auto` always did); on a CPU the fastest
of the precisions that (1) this CPU runs natively (bf16 only with native bf16, int8 only with fbgemm), (2) every
served adapter passed the accuracy gate for (`GATE_FILE` beside the adapter, written by
`bench/precision_accuracy.py`: the held-out paired difference to fp32 whose bootstrap 95% interval must not lie
below `GATE_MIN_DELTA`, for the adapter's exact weights), and (3) measured faster than fp32 on this machine by
`SPEED_MARGIN` (`measure_speeds`: a few interleaved forwards of the pipeline's own mix of image sizes).

The choice is stable from one start to the next (`decide`). The speeds and the choice are cached beside the cost
profiles, keyed by what changes them (CPU, threads, torch, backbone, workload, int8 activation width: a changed
key is a cache miss, measured afresh). Each later start re-times the previous choice against the cached runner-up
(one round) and keeps the previous choice unless the runner-up is at least `SWITCH_MARGIN` faster there and again
in a full measurement, both on a quiet machine (`others_share`: other processes took at most `QUIET_MAX_SHARE`
of the CPUs while it ran). Why: bf16 and int8 can run within a few percent of each other, and taking whichever
was ahead at each start flipped the precision, and with it the detections, between runs; a probe on a busy
machine ranks them wrong (a neighbour slows int8 more than bf16).
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

from vlora_va.common import machine_load
from vlora_va.engine.adapters import adapter_digest
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
# A later start leaves its previous choice only for a precision measured at least this much faster (its time at most
# 1 / 1.10 of the previous one's): start-to-start noise on a CPU is ~5%, and a flip changes detections.
SWITCH_MARGIN = 0.10


# ---------------------------------------------------------------- the accuracy gate
def gate_of(adapter) -> dict:
    """{precision: {"passes": bool, ...}}: the adapter's shipped GATE_FILE entries, and for the variants it has
    none for, the ones measured on this machine (`read_machine_gates`); {} for a precision measured nowhere. A
    GATE_FILE measured on other weights counts as none."""
    return {**read_machine_gates(adapter), **shipped_gate(adapter)}


def shipped_gate(adapter) -> dict:
    """{precision: entry} from the adapter's GATE_FILE, or {} when it has none or the file was measured on other
    weights."""
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


# ---------------------------------------------------------------- gates measured on this machine
# `vlora-va models calibrate` measures the variants this CPU maps to that an adapter's GATE_FILE lacks
# (training/precision_gate.py) and records them here, per machine: the repository's files are never written.
MACHINE_GATE_FORMAT = 1
MEASURE_COMMAND = "vlora-va models calibrate pipelines.yaml"  # what measures a missing gate (the set-up runs it)


def machine_gate_dir() -> Path:
    """$VLORA_VA_GATES, else ~/.cache/vlora-va/gates."""
    return Path(os.environ.get("VLORA_VA_GATES", Path.home() / ".cache" / "vlora-va" / "gates"))


def machine_gate_key(adapter, variant: str) -> dict:
    """What a gate measured here is valid for: the adapter's exact weights, the variant, and the libraries that
    compute it (torch; OpenVINO and NNCF, which calibrated the int8 models)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {"format": MACHINE_GATE_FORMAT, "adapter_sha256": adapter_digest(adapter), "variant": variant,
            "torch": torch.__version__, "openvino": v("openvino"), "nncf": v("nncf")}


def _machine_gate_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return machine_gate_dir() / f"gate-{key['variant']}-{digest}.json"


def machine_gate_source() -> str:
    """What a machine-measured entry says it was measured on."""
    return f"this machine ({device_name(torch.device('cpu'))})"


def write_machine_gate(adapter, variant: str, entry: dict) -> Path:
    key = machine_gate_key(adapter, variant)
    path = _machine_gate_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "entry": entry}, indent=1))
    tmp.rename(path)  # whole or not at all: a daemon starting meanwhile never reads half a record
    return path


def read_machine_gates(adapter) -> dict:
    """{variant: entry} measured on this machine for this adapter's weights and today's libraries."""
    out = {}
    directory = machine_gate_dir()
    if not directory.is_dir():
        return out
    mine = machine_gate_key(adapter, "")  # (the weights and libraries: one digest and version look-up)
    for path in directory.glob("gate-*.json"):
        try:
            data = json.loads(path.read_text())
            key, entry = data["key"], data["entry"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(entry, dict) and isinstance(key, dict) and key == {**mine, "variant": key.get("variant")}:
            out[key["variant"]] = entry
    return out


def variants_here(caps: Capabilities, openvino: bool = False) -> list[str]:
    """The gate entries `auto` may need on this CPU: torch bf16 where it is native, torch int8 at this CPU's
    activation width, and the openvino backend's int8 as this CPU runs it (its float hint, its overflow fix)."""
    out = []
    if caps.native_bf16:
        out.append("bf16")
    if not caps.runs("int8"):
        out.append(gate_key("int8"))
    if openvino:
        from vlora_va.engine.backends import openvino_int8  # noqa: PLC0415
        from vlora_va.engine.backends.openvino import int8_hint, openvino_problem  # noqa: PLC0415

        if openvino_problem() is None:
            out.append(openvino_int8.gate_name(caps.native_bf16, caps.vnni, int8_hint()))
    return out


def gate_allows(adapters: dict, precision: str) -> str | None:
    """Why the accuracy gate keeps `precision` off for these adapters (None: every one passed it)."""
    if precision == "fp32":
        return None
    key = gate_key(precision)
    for name, a in adapters.items():
        entry = gate_of(a).get(key)
        if not entry:
            return f"adapter {name} has no accuracy-gate result for {key} (`{MEASURE_COMMAND}` measures it here)"
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


OPENVINO = "openvino-"  # a candidate computed by the openvino backbone backend: "openvino-fp32", "-bf16", "-int8"
OPENVINO_INT8 = OPENVINO + "int8"  # NNCF-calibrated (backends/openvino_int8.py): gated under its own key


def split_choice(label: str) -> tuple[str, str]:
    """(daemon.backend, precision) of a candidate: "openvino-bf16" -> ("openvino", "bf16"), "int8" -> ("torch", ...)."""
    return ("openvino", label.removeprefix(OPENVINO)) if label.startswith(OPENVINO) else ("torch", label)


def candidates(caps: Capabilities, gate: dict[str, str | None], dtype_setting: str = "auto",
               openvino: bool = False) -> tuple[list[str], list[str]]:
    """(the precisions auto may take on this CPU: fp32 first, why each other one may not). openvino: the openvino
    backend's precisions compete too (`daemon.backend: auto`): its bf16 under the same gate as torch's, its int8
    where it is calibrated and its own gate passed (gate[OPENVINO_INT8] says why not)."""
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
    if openvino:
        from vlora_va.engine.backends.openvino import openvino_problem

        problem = openvino_problem()
        if problem:
            notes.append(f"openvino: {problem}")
        else:
            usable.append(OPENVINO + "fp32")
            if "bf16" in usable:  # native bf16, gate passed, dtype allows
                usable.append(OPENVINO + "bf16")
            if gate.get(OPENVINO_INT8, "not asked"):
                notes.append(f"{OPENVINO_INT8}: {gate.get(OPENVINO_INT8, 'not asked')}")
            else:
                usable.append(OPENVINO_INT8)
    return usable, notes


def choose(setting: str, caps: Capabilities, gate: dict[str, str | None], speeds: dict[str, float] | None,
           dtype_setting: str = "auto", previous: str | None = None, openvino: bool = False) -> Choice:
    """The precision to run. setting: daemon.precision ("auto" or one of PRECISIONS); gate: {precision: why the
    accuracy gate keeps it off, or None}; speeds: {precision: measured seconds of the same work,
    `measure_speeds`} (None: not measured); dtype_setting: daemon.dtype (an explicit bfloat16 / float16 fixes
    the precision); previous: auto's choice at the last start, kept unless another precision measured at least
    SWITCH_MARGIN faster (`stay_or_switch`)."""
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
    usable, notes = candidates(caps, gate, dtype_setting, openvino)
    if len(usable) == 1:
        return Choice("fp32", "; ".join(notes) or "nothing else runs here")
    if not speeds or "fp32" not in speeds:
        return Choice("fp32", f"{', '.join(usable[1:])} not measured on this machine")
    timed = {p: speeds[p] for p in usable if p in speeds}
    best = min(timed, key=timed.get)
    ratios = ", ".join(f"{p} {timed[p] / speeds['fp32']:.2f}x" for p in timed if p != "fp32")
    if previous in timed:
        return stay_or_switch(previous, timed, f"{ratios} of fp32")
    if best == "fp32" or timed[best] > SPEED_MARGIN * speeds["fp32"]:
        return Choice("fp32", f"no precision measured faster than fp32 here ({ratios})")
    return Choice(best, f"fastest here ({ratios} of fp32), accuracy gate passed")


def float_precision(caps: Capabilities, gate: dict[str, str | None]) -> Choice:
    """`auto` among a backend's float precisions (the openvino backend where its int8 is not calibrated or not
    gated): bf16 where the CPU computes it natively and the adapters' bf16 gate passed, else fp32."""
    if not caps.native_bf16:
        return Choice("fp32", "no native bf16 on this CPU")
    if gate.get("bf16"):
        return Choice("fp32", gate["bf16"])
    return Choice("bf16", "native bf16 on this CPU, accuracy gate passed (measured on the torch engine)")


def stay_or_switch(previous: str, speeds: dict[str, float], detail: str = "") -> Choice:
    """The previous choice, unless the fastest of `speeds` (seconds, measured now) beats it by SWITCH_MARGIN; the
    reason gives the margin measured."""
    best = min(speeds, key=speeds.get)
    if best == previous:
        return Choice(previous, "kept from the last start: still the fastest here" + (f" ({detail})" if detail else ""))
    margin = speeds[previous] / speeds[best] - 1
    verdict = f"{best} measured {margin:.1%} faster; a switch needs {SWITCH_MARGIN:.0%}"
    verdict += f"; {detail}" if detail else ""
    if margin < SWITCH_MARGIN:
        return Choice(previous, f"kept from the last start ({verdict})")
    return Choice(best, f"switched from {previous} ({verdict})")


# ---------------------------------------------------------------- measuring speed (auto on a CPU)
PROBE_MAX_IMAGES = 4  # images per size in one timed forward (CPU time is near linear in images: scaled up)
FULL_ROUNDS = 3  # interleaved rounds of a full measurement (the fastest counts); a re-check times one


def speed_key(caps: Capabilities, backbone_id: str, backbone: nn.Module, workload: dict[int, float],
              openvino: bool = False) -> dict:
    cfg = backbone.config
    key = {"version": 2, "kind": "precision-speeds", "device": device_name(torch.device(caps.device)),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "backbone": backbone_id,
            "backbone_shape": [getattr(cfg, k, None) for k in ("hidden_size", "num_hidden_layers", "intermediate_size")],
            "workload": {str(s): round(n, 3) for s, n in sorted(workload.items())}, "reduce_range": reduce_range()}
    if openvino:  # the openvino backend's candidates too: a key of its own (its version, its int8's float hint)
        from vlora_va.engine.backends.openvino import int8_hint, openvino_version

        key["openvino"] = openvino_version()
        key["openvino_int8_hint"] = int8_hint()
    return key


def _speed_path(directory: Path, key: dict) -> Path:
    return directory / f"precision-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"


def measure_speeds(backbone: nn.Module, precisions: list[str], workload: dict[int, float],
                   rounds: int = FULL_ROUNDS, int8_parts: dict | None = None) -> dict[str, float]:
    """Seconds of backbone compute one second of the pipeline's images takes in each precision.

    workload: images per second the pipeline sends, by image size. Per size one plain-backbone forward of
    min(PROBE_MAX_IMAGES, ceil(images/s)) random images, scaled to the images per second, summed over sizes:
    the mix decides (on this project's reference CPU the plain backbone ran bf16 ahead at 224 px and int8 ahead
    at 336, so equal weights per size can rank them wrong for a pipeline's mix). The fastest of `rounds` interleaved rounds: the machine's own cost, as
    the cost profile takes it (`profiling._timed`); a burst of other load slows precisions unevenly (int8 ran 1.7x,
    bf16 1.2x slower in a start-up probe on a busy host) and would otherwise decide. int8_parts: the calibrated
    models "openvino-int8" runs (openvino.int8_calibration)."""
    models = {p: _plain(backbone, p, int8_parts) for p in precisions}
    batches = [(torch.randn(min(PROBE_MAX_IMAGES, max(1, math.ceil(n))), 3, s, s), n) for s, n in workload.items()]

    def run(p: str) -> float:
        total = 0.0
        with torch.inference_mode():
            for x, per_s in batches:
                t0 = time.perf_counter()
                models[p](pixel_values=x if p.startswith(OPENVINO) else x.to(dtype_of(p)))
                total += (time.perf_counter() - t0) * per_s / len(x)
        return total

    times: dict[str, list[float]] = {p: [] for p in precisions}
    for p in precisions:
        run(p)  # warm-up: first touches, packing, kernel selection
    for _ in range(rounds):
        for p in precisions:
            times[p].append(run(p))
    return {p: min(t) for p, t in times.items()}


def _plain(backbone: nn.Module, label: str, int8_parts: dict | None = None):
    """The backbone computing as a candidate does: a torch copy in that precision, or compiled by OpenVINO (int8:
    the calibrated parts)."""
    if label.startswith(OPENVINO):
        from vlora_va.engine.backends.openvino import PlainOpenVINO

        return PlainOpenVINO(backbone, label.removeprefix(OPENVINO), int8_parts)
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
    path = _speed_path(directory, key)
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
    path = _speed_path(directory, key)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "speeds": probe.speeds, "choice": choice, "others_share": probe.others},
                                  indent=1))
        tmp.rename(path)
    except OSError as e:
        log.warning("precision speeds not cached (%s)", e)


# ---------------------------------------------------------------- deciding at a start
def decide(caps: Capabilities, gate: dict[str, str | None], dtype_setting: str, cache_dir: Path, key: dict,
           probe, openvino: bool = False) -> Choice:
    """auto's choice on a CPU: the cached previous choice unless another usable precision is at least SWITCH_MARGIN
    faster in a one-round re-check against the cached runner-up and again in a full measurement, both quiet.
    Nothing cached for `key` (first start, or a stale key): a full measurement decides. probe(precisions, rounds)
    -> Probe."""
    usable, _ = candidates(caps, gate, dtype_setting, openvino)
    if len(usable) == 1:
        return choose("auto", caps, gate, None, dtype_setting, openvino=openvino)
    cached = read_cache(cache_dir, key)
    previous = cached.choice if cached and cached.choice in usable else None
    if previous is None or not set(usable) <= set(cached.speeds):  # first start, stale, or the gate changed
        return _measure_all(caps, gate, dtype_setting, cache_dir, key, probe, usable, previous, openvino)
    rival = min((p for p in usable if p != previous), key=cached.speeds.get)
    check = probe([previous, rival], 1)
    if not check.quiet:
        return Choice(previous, f"kept from the last start: the machine was busy during the re-check ({check.load}); "
                                "a switch is measured on a quiet machine only")
    kept = stay_or_switch(previous, check.speeds, "timed in a one-round re-check")
    if kept.precision == previous:
        return kept
    return _measure_all(caps, gate, dtype_setting, cache_dir, key, probe, usable, previous, openvino)


def _measure_all(caps, gate, dtype_setting, cache_dir, key, probe, usable, previous, openvino=False) -> Choice:
    """A full measurement of every usable precision decides (and is cached); with a previous choice, only a quiet
    one may change it."""
    full = probe(usable, FULL_ROUNDS)
    if previous is not None and not full.quiet:
        return Choice(previous, f"kept from the last start: the machine was busy while measuring ({full.load}); "
                                "a switch is measured on a quiet machine only")
    choice = choose("auto", caps, gate, full.speeds, dtype_setting, previous, openvino)
    if not full.quiet:  # used for this run, never kept as the machine's truth: the next start measures again
        log.warning("precision speeds measured on a busy machine (%s): %s serves this run, and nothing is cached; "
                    "the next start measures again", full.load, choice.precision)
        return Choice(choice.precision, choice.reason + f"; measured on a busy machine ({full.load}), not cached")
    write_cache(cache_dir, key, full, choice.precision)
    return choice


def prober(backbone: nn.Module, workload: dict[int, float], int8_parts: dict | None = None):
    """probe(precisions, rounds) -> Probe: `measure_speeds` of this backbone and workload, with the machine's load
    meanwhile; each probe is logged."""
    mix = ", ".join(f"{n:g}/s at {s} px" for s, n in sorted(workload.items()))

    def probe(precisions: list[str], rounds: int) -> Probe:
        t0 = time.perf_counter()
        speeds, others = machine_load.others_share(
            lambda: measure_speeds(backbone, precisions, workload, rounds, int8_parts))
        measured = Probe(speeds, others)
        log.info("precision speeds (%d round%s, %.1f s, %s; seconds of backbone compute per second of the "
                 "pipeline's images, %s): %s", rounds, "s" * (rounds > 1), time.perf_counter() - t0, measured.load,
                 mix, ", ".join(f"{p} {t:.3f}" for p, t in speeds.items()))
        return measured

    return probe


def pick(setting: str, dtype_setting: str, device: str, backbone: nn.Module, backbone_id: str, adapters: dict,
         workload: dict[int, float], cache_dir: Path, openvino: bool = False,
         sizes: dict[str, int] | None = None) -> Choice:
    """The daemon's precision for this machine, adapter set and workload (images per second by image size; see
    the module docstring). openvino: `daemon.backend: auto`, the openvino backend's precisions compete
    ("openvino-fp32", "openvino-bf16", "openvino-int8": `split_choice`); sizes: each adapter's image size."""
    caps = Capabilities.detect(device)
    gate = {p: gate_allows(adapters, p) for p in ("bf16", "int8")}
    if setting != "auto" or caps.device != "cpu" or dtype_setting in ("bfloat16", "float16"):
        return choose(setting, caps, gate, None, dtype_setting)
    parts = None
    if openvino:
        gate[OPENVINO_INT8], parts = openvino_int8_gate(caps, backbone, adapters, sizes or {})
    say_unmeasured(caps, adapters, openvino)
    key = speed_key(caps, backbone_id, backbone, workload, openvino)
    return decide(caps, gate, dtype_setting, cache_dir, key, prober(backbone, workload, parts), openvino)


def unmeasured(caps: Capabilities, adapters: dict, openvino: bool = False) -> dict[str, list[str]]:
    """{variant this CPU maps to: the adapters with no gate entry for it, shipped or measured here}."""
    out: dict[str, list[str]] = {}
    for v in variants_here(caps, openvino):
        names = sorted(n for n, a in adapters.items() if v not in gate_of(a))
        if names:
            out[v] = names
    return out


def say_unmeasured(caps: Capabilities, adapters: dict, openvino: bool = False) -> None:
    """One line where a variant this CPU runs has no gate entry: auto leaves it out (it chooses among the measured
    ones), and the line names the command that measures it."""
    missing = unmeasured(caps, adapters, openvino)
    if missing:
        log.warning("precision auto: no accuracy gate for %s on this CPU: `%s` measures it here (about a minute); "
                    "until then auto chooses among the measured precisions",
                    "; ".join(f"{v} (adapters {', '.join(n)})" for v, n in missing.items()), MEASURE_COMMAND)


def openvino_int8_gate(caps: Capabilities, backbone: nn.Module, adapters: dict,
                       sizes: dict[str, int]) -> tuple[str | None, dict]:
    """(why the openvino backend's int8 may not serve these adapters: not calibrated, or its accuracy gate for this
    CPU's variant (openvino_int8.gate_name) not passed; None: it may; its calibrated parts for the speed probe)."""
    from vlora_va.engine.backends import openvino_int8
    from vlora_va.engine.backends.openvino import int8_calibration, int8_hint, openvino_problem

    problem = openvino_problem()  # (it builds an OpenVINO Core: once)
    if problem:
        return problem, {}
    missing, parts = int8_calibration(backbone, adapters, sizes)
    if missing:
        return missing, {}
    return gate_allows(adapters, openvino_int8.gate_name(caps.native_bf16, caps.vnni, int8_hint())), parts
