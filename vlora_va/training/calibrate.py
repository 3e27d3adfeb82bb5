"""`vlora-va models calibrate [pipelines.yaml]`: the openvino backend's int8 models for a pipeline, quantized by NNCF
ahead of time (never in the daemon's start-up), cached as IR where the daemon reads them (engine/backends/
openvino_int8.py says what a part is and what its key holds).

Calibration frames come from the pipeline's own cameras over `--range` (default 0-50 s: the shipped adapters'
training range, so the held-out 55-79.5 s of pedestrians.mp4 is never calibrated on), one frame per step so that
SUBSET (50) spread over the range, letterboxed to daemon.image_size as ingest sends them:
- the shared prefix (lower) of each image size on the frames of every camera whose tasks run at that size;
- each adapter's suffix (upper) on the frames of the cameras that use it, pushed through the int8 prefix (so its
  ranges are those it sees when serving).
Idempotent: a part already calibrated for the same key is kept (`--force`: calibrate again).

Then, on a CPU with native bf16, which float hint runs these int8 models faster here (`measure_float_hint`): the
daemon reads that choice, so it is measured once, on the machine, and never flips between starts.

Last, the accuracy gate of each variant this CPU maps to that no adapter entry covers (`measure_gates`): a gate entry
is per variant (precision_choice.variants_here), the shipped ones were measured on the developers' CPUs, and a missing
one keeps that variant off `precision: auto`.
"""

from __future__ import annotations

import copy
import logging
import os
import statistics
import time

import numpy as np
import torch

from vlora_va.contracts.config import PipelineConfig
from vlora_va.engine import precision_choice
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.backends import openvino_int8
from vlora_va.engine.backends.openvino import hint_key, int8_dir, openvino_problem
from vlora_va.engine.executor import Engine
from vlora_va.engine.precision import Capabilities
from vlora_va.ingest.chunker import letterbox
from vlora_va.serving.capacity import offered_images
from vlora_va.serving.startup import load_adapters
from vlora_va.training import precision_gate
from vlora_va.training.frames import read_frames

log = logging.getLogger(__name__)


class CalibrationError(Exception):
    pass


def camera_frames(config: PipelineConfig, adapter: str, start: float, end: float, n: int) -> list[np.ndarray]:
    """n frames of the file cameras whose tasks use `adapter`, evenly over their frames in [start, end) (n per
    camera read at most), letterboxed to the daemon's image size (what ingest sends)."""
    sources = [s.source for s in config.streams if s.scheme == "file" and any(t.adapter == adapter for t in s.tasks)]
    if not sources:
        raise CalibrationError(f"adapter {adapter}: no file camera of the pipeline uses it, nothing to calibrate on")
    frames = [f.rgb for src in sources for f in read_frames(src, start, end, (end - start) / n)]
    if len(frames) < 8:
        raise CalibrationError(f"adapter {adapter}: {len(frames)} frames in {start:g}-{end:g} s of {sources}")
    return [letterbox(frames[i], config.daemon.image_size)[0] for i in _evenly(len(frames), n)]


def _evenly(total: int, n: int) -> list[int]:
    return sorted(set(np.linspace(0, total - 1, min(total, n)).astype(int).tolist()))


def calibrate(config: PipelineConfig, start: float = 0.0, end: float = 50.0, force: bool = False,
              gates: bool = True) -> list[dict]:
    """Calibrate every part the pipeline's int8 openvino engine runs, then (gates) measure the accuracy gate of
    each variant this CPU runs that no adapter entry covers yet (`measure_gates`); returns one record per part
    and per gate."""
    problem = openvino_problem()
    if problem:
        raise CalibrationError(problem)
    if openvino_int8.nncf_version() is None:
        raise CalibrationError("nncf is not installed (pip install nncf==3.4.0, part of the default set-up)")
    d = config.daemon
    torch.set_num_threads(d.threads or os.cpu_count() or 1)
    backbone = load_backbone(d.backbone, d.allow_download, "cpu")
    adapters, failed = load_adapters(config, backbone.config.hidden_size)
    if failed:
        raise CalibrationError("adapters not loaded: " + "; ".join(f"{n}: {why}" for n, why in failed.items()))
    pristine = copy.deepcopy(backbone), copy.deepcopy(adapters)  # (an engine rewrites what it is given)
    engine = Engine(backbone, adapters, d.image_size, d.max_slots, d.max_rank, "cpu", 0, d.max_batch_images,
                    torch.float32, precision="int8", backend="openvino")
    frames = {n: camera_frames(config, n, start, end, openvino_int8.SUBSET) for n in engine.adapters}
    per_size, _ = offered_images(config, dict(engine.sizes))  # one second's images: the batches the daemon runs
    batches = {size: max(1, min(d.max_batch_images, round(n))) for size, n in per_size.items()}
    records = calibrate_engine(engine, frames, f"{start:g}-{end:g} s", force, batches)
    del engine
    if gates:
        records += measure_gates(config, *pristine, force)
    return records


def measure_gates(config: PipelineConfig, backbone, adapters: dict, force: bool = False) -> list[dict]:
    """The accuracy gate of every variant `precision: auto` may pick on this CPU (precision_choice.variants_here)
    that an adapter has no entry for, measured here against the shipped reference (training/precision_gate.py)
    and recorded in this machine's cache; entries that exist are kept (force: measured again)."""
    d = config.daemon
    variants = precision_choice.variants_here(Capabilities.detect("cpu"),
                                              auto_backend=d.backend in ("auto", "openvino"))
    t0 = time.perf_counter()
    records = precision_gate.measure_missing(backbone, adapters, d.image_size, variants,
                                             {"max_slots": d.max_slots, "max_rank": d.max_rank,
                                              "max_batch_images": d.max_batch_images}, force)
    measured = [r for r in records if not r["kept"]]
    if measured:
        log.info("calibrate: %d accuracy gate%s measured in %.0f s", len(measured), "s" * (len(measured) > 1),
                 time.perf_counter() - t0)
    return records


def calibrate_engine(engine: Engine, frames: dict[str, list[np.ndarray]], where: str, force: bool = False,
                     batches: dict[int, int] | None = None) -> list[dict]:
    """Calibrate the parts an int8 openvino engine runs for its resident adapters, on `frames` (adapter -> frames
    as ingest sends them; `where`: what they are, for the provenance), then measure its float hint (batches: the
    batch per image size to time it at, as the pipeline sends them; default 4)."""
    if engine.backend_name != "openvino" or engine.precision != "int8":
        raise CalibrationError(f"the engine runs {engine.backend_name} {engine.precision}, not openvino int8")
    be = engine.backend
    split = be.split([])  # int8: the first block any resident adapter puts LoRA on
    records = []
    for size in sorted(set(engine.sizes.values())):
        names = sorted(n for n, s in engine.sizes.items() if s == size)
        mixed = [f for n in names for f in frames[n]]
        mixed = [mixed[i] for i in _evenly(len(mixed), openvino_int8.SUBSET)]
        records.append(_part(be, "lower", size, split, None, lambda: _pixels(be, mixed, size), force,
                             {"frames": f"{len(mixed)} frames of {', '.join(names)}'s cameras, {where}"}))
        for n in names:
            slot = engine.slots[n]
            records.append(_part(be, "upper", size, split, slot, lambda n=n: _hidden(be, frames[n], size, split),
                                 force, {"adapter": n, "frames": f"{len(frames[n])} frames, {where}"}))
    records.append(measure_float_hint(engine, frames, force, batches))
    return records


def measure_float_hint(engine: Engine, frames: dict[str, list[np.ndarray]], force: bool = False,
                       batches: dict[int, int] | None = None, rounds: int = 5) -> dict:
    """Which float hint runs the engine's calibrated int8 models faster on this machine, recorded for the daemon
    (openvino_int8.write_hint): each part (every size's prefix, every resident adapter's suffix) compiled at each
    hint the CPU runs and timed on a batch of its own frames (batches[size], default 4: which hint wins depends on
    the batch, so the pipeline's own), the hints interleaved in alternating order; per hint, the parts' medians
    summed. Kept where already measured for this CPU, OpenVINO and thread count (force: again)."""
    be, key, directory = engine.backend, hint_key(), int8_dir()
    hints = openvino_int8.float_hints(Capabilities.detect("cpu").native_bf16)
    record = {"part": "float hint", "path": str(directory / openvino_int8.HINT_FILE), "kept": True}
    if len(hints) == 1:
        return {**record, "hint": hints[0], "path": "the only one this CPU runs"}
    recorded = openvino_int8.recorded_hint(directory, key)
    if recorded is not None and not force:
        log.info("calibrate: the float hint %s was measured here already", recorded)
        return {**record, "hint": recorded}
    split, runs = be.split([]), []
    for size in sorted(set(engine.sizes.values())):
        names = sorted(n for n, s in engine.sizes.items() if s == size)
        pool = [f for n in names for f in frames[n]]
        batch = (batches or {}).get(size, 4)
        x = be.pixels((pool * batch)[:batch], size).numpy()
        lower = {h: _compiled(be, "lower", size, split, None, h) for h in hints}
        runs.append((lower, x))
        hidden = be.infer(lower["f32"], x)
        runs += [({h: _compiled(be, "upper", size, split, engine.slots[n], h) for h in hints}, hidden) for n in names]
    times: dict[str, list[list[float]]] = {h: [[] for _ in runs] for h in hints}
    for r in range(rounds):
        for i, (models, x) in enumerate(runs):
            for h in (hints if r % 2 == 0 else hints[::-1]):  # each hint first in half the rounds
                # an untimed call first: the first call after another model's run pays for the caches, and timed
                # that way the second hint of a pair would find them warm (5-10% in its favour, measured)
                models[h](x)
                t0 = time.perf_counter()
                models[h](x)
                times[h][i].append(time.perf_counter() - t0)
    seconds = {h: sum(statistics.median(t) for t in times[h]) for h in hints}
    hint = openvino_int8.write_hint(directory, key, seconds,
                                    {str(size): (batches or {}).get(size, 4) for size in set(engine.sizes.values())})
    log.info("calibrate: int8 float parts at %s here (%s)", hint,
             ", ".join(f"{h} {1e3 * t:.1f} ms" for h, t in seconds.items()))
    return {**record, "hint": hint, "kept": False, "times_s": {h: round(t, 4) for h, t in seconds.items()}}


def describe(record: dict) -> str:
    """One line for a record of `calibrate_engine` or `measure_gates` (the CLI's output)."""
    if "variant" in record:
        what = f"accuracy gate {record['adapter']} {record['variant']}"
        if "error" in record:
            return f"{what}: not measured ({record['error']}): auto leaves {record['variant']} off for it"
        verdict = "passes" if record["passes"] else "FAILS (auto leaves it off)"
        how = "kept" if record["kept"] else f"measured here in {record['seconds']:.0f} s"
        return f"{what}: {verdict} ({how}; {record.get('source', '')}; {record['summary']})"
    if "hint" in record:
        times = ", ".join(f"{h} {1e3 * t:.0f} ms" for h, t in record.get("times_s", {}).items())
        return (f"{record['part']}: {record['hint']} ({'kept' if record['kept'] else 'measured: ' + times}; "
                f"{record['path']})")
    return f"{record['part']}: {'kept' if record['kept'] else 'calibrated in %.0f s' % record['seconds']} ({record['path']})"


def _compiled(be, part: str, size: int, split: int, slot: int | None, hint: str):
    return be.compile_model(be.int8_model(part, size, split, slot), {**be.config, "INFERENCE_PRECISION_HINT": hint})


def _part(be, part: str, size: int, split: int, slot: int | None, samples, force: bool, provenance: dict) -> dict:
    key = be.int8_key(part, size, split, slot)
    path = openvino_int8.cached(int8_dir(), key)
    what = f"{part} {size}px split {split}" + (f" ({provenance['adapter']})" if "adapter" in provenance else "")
    if path is not None and not force:
        log.info("calibrate: %s already calibrated (%s)", what, path.name)
        return {"part": what, "path": str(path), "kept": True}
    t0 = time.perf_counter()
    path = be.calibrate(part, size, split, slot, samples(), provenance)
    return {"part": what, "path": str(path), "kept": False, "seconds": round(time.perf_counter() - t0, 1)}


def _pixels(be, frames: list[np.ndarray], size: int) -> list[np.ndarray]:
    x = be.pixels(frames, size).numpy()
    return [x[i:i + 1] for i in range(len(x))]


def _hidden(be, frames: list[np.ndarray], size: int, split: int) -> list[np.ndarray]:
    """The upper part's inputs: the frames through the (int8, just calibrated) prefix, as the daemon computes them."""
    lower = be.lower_model(size, split)
    out = []
    for i in range(0, len(frames), 8):
        h = be.infer(lower, be.pixels(frames[i:i + 8], size).numpy())
        out += [h[j:j + 1] for j in range(len(h))]
    return out
