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

With `daemon.backend: auto` every registered backbone backend with `auto_precisions` competes too (openvino today:
"openvino-fp32", ...; BackboneBackend says how). Measuring the candidates and the cache: precision_speeds.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vlora_va.contracts.plugins import BACKBONE_BACKENDS
from vlora_va.engine.adapters import adapter_digest
from vlora_va.engine.precision import Capabilities, PrecisionError, device_name, gate_key
from vlora_va.engine.precision_speeds import (
    FULL_ROUNDS,
    PROBE_MAX_IMAGES,
    Cached,
    Probe,
    competing,
    measure_speeds,
    prober,
    read_cache,
    speed_key,
    speed_path,
    split_choice,
    write_cache,
)

log = logging.getLogger(__name__)

# Measuring lives in precision_speeds.py; its names are importable from here too (tests, bench, serving)
__all__ = ["FULL_ROUNDS", "PROBE_MAX_IMAGES", "Cached", "Probe", "measure_speeds", "prober", "read_cache", "speed_key",
           "speed_path", "split_choice", "write_cache"]

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


def variants_here(caps: Capabilities, auto_backend: bool = False) -> list[str]:
    """The gate entries `auto` may need on this CPU: torch bf16 where it is native, torch int8 at this CPU's
    activation width, and with `auto_backend` (daemon.backend auto or openvino) those of every competing backend's
    precisions as this CPU runs them (openvino: its int8, with its float hint and overflow fix)."""
    out = []
    if caps.native_bf16:
        out.append("bf16")
    if not caps.runs("int8"):
        out.append(gate_key("int8"))
    if auto_backend:
        for _, backend in competing():
            out += backend.gate_variants(caps)
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


# The openvino backend's NNCF-calibrated int8 candidate (backends/openvino_int8.py): gated under its own key
# (training/precision_gate.py reads it). Every competing backend's candidates are "<name>-<precision>".
OPENVINO_INT8 = "openvino-int8"


def candidates(caps: Capabilities, gate: dict[str, str | None], dtype_setting: str = "auto",
               auto_backend: bool = False) -> tuple[list[str], list[str]]:
    """(the precisions auto may take on this CPU: fp32 first, why each other one may not). auto_backend
    (`daemon.backend: auto`): every competing backend's precisions compete too (`backend_candidates`)."""
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
    if auto_backend:
        for name, backend in competing():
            more, why = backend_candidates(name, backend, "bf16" in usable, gate)
            usable += more
            notes += why
    return usable, notes


def backend_candidates(name: str, backend, torch_bf16: bool, gate: dict[str, str | None]) -> tuple[list, list]:
    """(a competing backend's candidates "<name>-<precision>", why each other one may not): fp32; bf16 where the
    torch engine's bf16 is usable (native, gate passed, dtype allows); any other precision where its own gate
    passed (gate["<name>-<precision>"] None; missing: not asked)."""
    problem = backend.auto_problem()
    if problem:
        return [], [f"{name}: {problem}"]
    usable, notes = [], []
    for p in backend.auto_precisions:
        label = f"{name}-{p}"
        if p == "fp32" or (p == "bf16" and torch_bf16):
            usable.append(label)
        elif p != "bf16" and gate.get(label, "not asked"):
            notes.append(f"{label}: {gate.get(label, 'not asked')}")
        elif p != "bf16":
            usable.append(label)
    return usable, notes


def choose(setting: str, caps: Capabilities, gate: dict[str, str | None], speeds: dict[str, float] | None,
           dtype_setting: str = "auto", previous: str | None = None, auto_backend: bool = False) -> Choice:
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
    usable, notes = candidates(caps, gate, dtype_setting, auto_backend)
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


# ---------------------------------------------------------------- deciding at a start
def decide(caps: Capabilities, gate: dict[str, str | None], dtype_setting: str, cache_dir: Path, key: dict,
           probe, auto_backend: bool = False) -> Choice:
    """auto's choice on a CPU: the cached previous choice unless another usable precision is at least SWITCH_MARGIN
    faster in a one-round re-check against the cached runner-up and again in a full measurement, both quiet.
    Nothing cached for `key` (first start, or a stale key): a full measurement decides. probe(precisions, rounds)
    -> Probe."""
    usable, _ = candidates(caps, gate, dtype_setting, auto_backend)
    if len(usable) == 1:
        return choose("auto", caps, gate, None, dtype_setting, auto_backend=auto_backend)
    cached = read_cache(cache_dir, key)
    previous = cached.choice if cached and cached.choice in usable else None
    if previous is None or not set(usable) <= set(cached.speeds):  # first start, stale, or the gate changed
        return _measure_all(caps, gate, dtype_setting, cache_dir, key, probe, usable, previous, auto_backend)
    rival = min((p for p in usable if p != previous), key=cached.speeds.get)
    check = probe([previous, rival], 1)
    if not check.quiet:
        return Choice(previous, f"kept from the last start: the machine was busy during the re-check ({check.load}); "
                                "a switch is measured on a quiet machine only")
    kept = stay_or_switch(previous, check.speeds, "timed in a one-round re-check")
    if kept.precision == previous:
        return kept
    return _measure_all(caps, gate, dtype_setting, cache_dir, key, probe, usable, previous, auto_backend)


def _measure_all(caps, gate, dtype_setting, cache_dir, key, probe, usable, previous, auto_backend=False) -> Choice:
    """A full measurement of every usable precision decides (and is cached); with a previous choice, only a quiet
    one may change it."""
    full = probe(usable, FULL_ROUNDS)
    if previous is not None and not full.quiet:
        return Choice(previous, f"kept from the last start: the machine was busy while measuring ({full.load}); "
                                "a switch is measured on a quiet machine only")
    choice = choose("auto", caps, gate, full.speeds, dtype_setting, previous, auto_backend)
    if not full.quiet:  # used for this run, never kept as the machine's truth: the next start measures again
        log.warning("precision speeds measured on a busy machine (%s): %s serves this run, and nothing is cached; "
                    "the next start measures again", full.load, choice.precision)
        return Choice(choice.precision, choice.reason + f"; measured on a busy machine ({full.load}), not cached")
    write_cache(cache_dir, key, full, choice.precision)
    return choice


def pick(setting: str, dtype_setting: str, device: str, backbone: nn.Module, backbone_id: str, adapters: dict,
         workload: dict[int, float], cache_dir: Path, auto_backend: bool = False,
         sizes: dict[str, int] | None = None) -> Choice:
    """The daemon's precision for this machine, adapter set and workload (images per second by image size; see
    the module docstring). auto_backend: `daemon.backend: auto`, every competing backend's precisions compete
    ("openvino-fp32", "openvino-bf16", "openvino-int8": `split_choice`); sizes: each adapter's image size."""
    caps = Capabilities.detect(device)
    gate = {p: gate_allows(adapters, p) for p in ("bf16", "int8")}
    if setting != "auto" or caps.device != "cpu" or dtype_setting in ("bfloat16", "float16"):
        return choose(setting, caps, gate, None, dtype_setting)
    parts = {}
    if auto_backend:  # each competing backend's own gates (openvino: its int8's), and what its probe needs
        for name, backend in competing():
            gates, parts[name] = backend.auto_gates(caps, backbone, adapters, sizes or {})
            gate.update({f"{name}-{p}": why for p, why in gates.items()})
    say_unmeasured(caps, adapters, auto_backend)
    key = speed_key(caps, backbone_id, backbone, workload, auto_backend)
    return decide(caps, gate, dtype_setting, cache_dir, key, prober(backbone, workload, parts), auto_backend)


def unmeasured(caps: Capabilities, adapters: dict, auto_backend: bool = False) -> dict[str, list[str]]:
    """{variant this CPU maps to: the adapters with no gate entry for it, shipped or measured here}."""
    out: dict[str, list[str]] = {}
    for v in variants_here(caps, auto_backend):
        names = sorted(n for n, a in adapters.items() if v not in gate_of(a))
        if names:
            out[v] = names
    return out


def say_unmeasured(caps: Capabilities, adapters: dict, auto_backend: bool = False) -> None:
    """One line where a variant this CPU runs has no gate entry: auto leaves it out (it chooses among the measured
    ones), and the line names the command that measures it."""
    missing = unmeasured(caps, adapters, auto_backend)
    if missing:
        log.warning("precision auto: no accuracy gate for %s on this CPU: `%s` measures it here (about a minute); "
                    "until then auto chooses among the measured precisions",
                    "; ".join(f"{v} (adapters {', '.join(n)})" for v, n in missing.items()), MEASURE_COMMAND)


def openvino_int8_gate(caps: Capabilities, backbone: nn.Module, adapters: dict,
                       sizes: dict[str, int]) -> tuple[str | None, dict]:
    """`daemon.backend: openvino` with `precision: auto`: (why its int8 may not serve these adapters, None: it may;
    its calibrated parts for the speed probe). The backend's own `auto_gates`."""
    gates, parts = BACKBONE_BACKENDS.load("openvino").auto_gates(caps, backbone, adapters, sizes)
    return gates["int8"], parts
