"""The accuracy gate of a backbone precision: paired, held-out, bootstrap 95% intervals, and where it is measured.

An adapter served in a cheaper precision (bf16, int8, OpenVINO's int8 with its float parts at a hint) must score as
fp32 does on held-out data. Both are scored through the engine on the very same frames and clips:

    detect            pedestrians.mp4 55-79.5 s every 0.5 s (teacher labels) and the human-checked frames there and
                      in bikes.mp4: person F1@0.5 at the adapter's threshold (teacher; human), person AP50
    actions           the held-out range's 1-s clips every 0.5 s: clip top-1 (teacher tracking-rule labels)
    actions-persons   per-person top-1 (teacher labels, centre rule; human persons, IoU >= 0.5)

and each metric's difference to fp32 gets a bootstrap interval (paired.py). A precision passes unless a gated metric's
interval lies wholly below precision_choice.GATE_MIN_DELTA.

Two places measure it, with the same code and the same data:
- the developers' bench (bench/precision_accuracy.py), where the teachers label the held-out range; `--write-gate`
  writes the shipped entries (adapters/NAME/precision.json), `--write-reference` the teachers' labels as REFERENCE;
- `vlora-va models calibrate` on a user's machine (`measure_missing`): the variants this CPU maps to
  (precision_choice.variants_here) that no shipped entry covers, scored against REFERENCE and the shipped
  human-checked set, no teacher needed. The result goes to the machine's cache (precision_choice.write_machine_gate),
  never into the repository. Why: a gate entry is per variant, and the shipped ones cover only the CPUs the
  developers had; a missing entry keeps that variant off, so a common cloud Xeon (VNNI, no bf16) ran torch int8 at
  twice the time OpenVINO's int8 needed, and shed 37% of the default pipeline.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

import torch

from vlora_va.engine import precision as P
from vlora_va.engine import precision_choice as A
from vlora_va.engine.backends.openvino import int8_calibration
from vlora_va.engine.executor import Engine
from vlora_va.engine.heads import Features
from vlora_va.engine.modes import PREMERGED, LoRAMode
from vlora_va.ingest.chunker import letterbox
from vlora_va.training import paired
from vlora_va.training.evaluate import HUMAN_SET, human_clip_frames, human_frames, load_human_set
from vlora_va.training.frames import TrainingFrame, iter_frames
from vlora_va.training.metrics import human_detection_report
from vlora_va.training.spec import Range

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
PED = ROOT / "sample_videos" / "pedestrians.mp4"
BIKES = ROOT / "sample_videos" / "bikes.mp4"
HELD_OUT = Range(PED, 55.0, 79.5, 0.5)
# The teachers' labels of HELD_OUT for each shipped adapter (bench/precision_accuracy.py --write-reference)
REFERENCE = ROOT / "adapters" / "eval" / "gate-reference.json"
REFERENCE_FORMAT = 1

GATE_METRICS = {"detection": ["person F1@0.5 (teacher)", "person F1@0.5 (human)"],
                "action": ["clip top-1 (teacher)"],
                "action-persons": ["person top-1 (teacher)", "person top-1 (human)"]}


class GateError(Exception):
    """A gate that cannot be measured here (no reference for the adapter, a variant that does not run)."""


def gate_kind(adapter) -> str:
    """Which metrics gate this adapter: by its task, and per-person activity where its head scores persons."""
    if adapter.task == "detection":
        return "detection"
    return "action-persons" if getattr(adapter.head, "persons", False) else "action"


# ---------------------------------------------------------------- scoring through an engine
class Scorer:
    """One adapter of an engine, scored as the daemon serves it (premerged weights; frames letterboxed to the
    engine's image size as ingest does, resized by the engine to the adapter's)."""

    def __init__(self, engine: Engine, name: str, reduce_range: bool | None = None):
        self.engine, self.name, self.reduce_range = engine, name, reduce_range
        self.adapter = engine.adapters[name]
        self.slot, self.size, self.head = engine.slots[name], engine.sizes[name], self.adapter.head
        self._cache: dict[str, tuple] = {}

    def features(self, frames: list[TrainingFrame], batch: int = 8) -> tuple[Features, list]:
        """Backbone features of the frames (cached by frame key), and their letterboxes."""
        todo = list({f.key: f for f in frames if f.key not in self._cache}.values())
        side = self.engine.image_size
        keep = P.REDUCE_RANGE
        P.REDUCE_RANGE = self.reduce_range
        try:
            for i in range(0, len(todo), batch):
                part = todo[i:i + batch]
                boxed = [letterbox(f.rgb, side) for f in part]
                feats = self.engine.features([b[0] for b in boxed], [self.slot] * len(part), LoRAMode(PREMERGED),
                                             self.size, keep_pixels=bool(self.head.detail))
                for j, (f, b) in enumerate(zip(part, boxed)):
                    self._cache[f.key] = (feats.select(slice(j, j + 1)), b[1].resized(self.size / side))
        finally:
            P.REDUCE_RANGE = keep
        parts = [self._cache[f.key] for f in frames]
        pixels = None if parts[0][0].pixels is None else torch.cat([p[0].pixels for p in parts])
        return (Features(torch.cat([p[0].cls for p in parts]), torch.cat([p[0].grid for p in parts]), pixels),
                [p[1] for p in parts])

    def detections(self, frames: list[TrainingFrame]) -> dict[str, list[dict]]:
        """{frame key: detections scoring >= 0.05} (AP needs the ranking; F1 reads it at the threshold)."""
        feats, lbs = self.features(frames)
        thr, self.head.score_threshold = self.head.score_threshold, 0.05
        # the head as the engine runs it (a backend may compile it: openvino)
        forward = self.engine.backend.head_forward(self.slot, self.head, self.size) or self.head
        try:
            dets = self.head.decode(forward(feats), lbs, [f.size for f in frames])
        finally:
            self.head.score_threshold = thr
        return {f.key: [d.to_json() for d in ds] for f, ds in zip(frames, dets)}

    def clips(self, clips: list[list[TrainingFrame]], clip_len: int) -> list[dict]:
        out = []
        for frames in clips:
            feats, lbs = self.features(frames)
            res = self.head.decode(self.head(feats, clip_len), [lbs[0]], [frames[0].size], [[f.t for f in frames]])[0]
            out.append(res.to_json())
        return out


def score_detect(s: Scorer, data: dict) -> dict:
    """{metric: (per-frame items, metric of items)} of a detection adapter on `data` (detect_data)."""
    preds = s.detections(data["frames"])
    thr = s.head.score_threshold
    teacher = paired.detection_items(preds, data["teacher"], data["teacher_keys"], "person")
    human = paired.detection_items(preds, data["human"], data["human_keys"], "person")
    return {"person F1@0.5 (teacher)": (teacher, lambda it: paired.f1_at(it, thr)),
            "person AP50 (teacher)": (teacher, paired.ap50),
            "person F1@0.5 (human)": (human, lambda it: paired.f1_at(it, thr))}


def score_clips(s: Scorer, data: dict, clip_len: int) -> dict:
    """{metric: (per-clip items, metric of items)} of an activity adapter on `data` (clip_data)."""
    preds = s.clips(data["clips"], clip_len)
    out = {"clip top-1 (teacher)": ([int(p["label"] == t) for p, t in zip(preds, data["labels"])], paired.clip_top1)}
    if s.head.persons:
        thr = s.head.score_threshold
        out["person top-1 (teacher)"] = (paired.person_items([p["persons"] for p in preds], data["persons"],
                                                             s.head.person_labels, thr), paired.persons_top1)
        hp = s.clips(data["human_clips"], clip_len)
        out["person top-1 (human)"] = (paired.person_items([p["persons"] for p in hp], data["human_persons"],
                                                           s.head.person_labels, thr, iou=0.5), paired.persons_top1)
    return out


def score(s: Scorer, data: dict) -> dict:
    return score_detect(s, data) if s.adapter.task == "detection" else score_clips(s, data, s.adapter.clip_len)


def human_counts(s: Scorer, data: dict) -> dict:
    """Counts on the human-checked boxes at the adapter's threshold (reported, not gated): persons over 100 px
    found, and side-by-side pairs that came out as two boxes."""
    preds = s.detections([f for f in data["frames"] if f.key in data["human"]])
    person = human_detection_report(preds, data["human"], s.head.classes, s.head.score_threshold)["person"]
    big = person["recall_by_height"][">100"]
    pairs = person["side_by_side"]
    return {"persons over 100 px found": big["found"], "persons over 100 px": big["refs"],
            "side-by-side pairs split": pairs["separate"], "side-by-side pairs": pairs["cases"]}


def compare(reference: dict, variant: dict) -> dict:
    """{metric: paired difference variant - reference} for two `score` results on the same data."""
    return {m: paired.paired(reference[m][0], items, fn) for m, (items, fn) in variant.items()}


def entry(kind: str, rows: dict) -> dict:
    """The gate entry of one variant from its paired differences (`compare`): the gated metrics of its kind."""
    return A.gate_entry({m: rows[m] for m in GATE_METRICS[kind] if m in rows})


# ---------------------------------------------------------------- the held-out data, from the teachers' reference
def teacher_labels_json(data: dict, kind: str) -> dict:
    """What REFERENCE keeps of an adapter's held-out data (detect_data / clip_data with teacher labels): labels and
    which frames, never pixels."""
    if kind == "detection":
        return {"kind": kind, "frames": data["teacher_keys"], "teacher": {k: data["teacher"][k] for k in data["teacher_keys"]}}
    return {"kind": kind, "clips": [{"frames": [f.key for f in c], "label": lab, "persons": p, "start": s}
                                    for c, lab, p, s in zip(data["clips"], data["labels"], data["persons"],
                                                            data["starts"])]}


def load_reference(path: Path = REFERENCE) -> dict:
    """{adapter name: its held-out labels} from REFERENCE (empty where the file is missing or of another format)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return raw.get("adapters", {}) if raw.get("format") == REFERENCE_FORMAT else {}


def _held_out_frames(keys: set[str]) -> dict[str, TrainingFrame]:
    """The frames of HELD_OUT named by `keys`, decoded once (GateError where one is not in the video)."""
    frames = {f.key: f for f in iter_frames(HELD_OUT.video, HELD_OUT.start, HELD_OUT.end + 1.0) if f.key in keys}
    missing = keys - set(frames)
    if missing:
        raise GateError(f"{len(missing)} reference frames are not in {HELD_OUT.video.name} (e.g. {sorted(missing)[0]})")
    return frames


def detect_data(teacher: dict[str, list[dict]], teacher_keys: list[str], hs) -> dict:
    """A detection adapter's held-out data: the HELD_OUT frames named by `teacher_keys` with `teacher` labels, and
    the human-checked frames of both cameras with their boxes."""
    frames = _held_out_frames(set(teacher_keys))
    hframes = human_frames(hs, HELD_OUT) + human_frames(hs, Range(BIKES, 0.0, None, 0.5))
    by_key = {**{k: frames[k] for k in teacher_keys}, **{f.key: f for f in hframes}}
    return {"frames": list(by_key.values()), "teacher": teacher, "teacher_keys": list(teacher_keys),
            "human": {f.key: hs.boxes[f.key] for f in hframes}, "human_keys": [f.key for f in hframes]}


def clip_data(clips: list[list[TrainingFrame]], labels: list, persons: list, starts: list, hs, human: bool,
              clip_len: int) -> dict:
    """An activity adapter's held-out data: its clips (the frames it sees) with their labels and persons and, for a
    per-person head (human), the human-checked clips at `clip_len` frames."""
    data = {"clips": clips, "labels": labels, "persons": persons, "starts": starts}
    if human:
        hclips, picked = human_clip_frames(hs, HELD_OUT, clip_len)
        data["human_clips"], data["human_persons"] = picked, [c["persons"] for c in hclips]
    return data


def reference_data(adapter, reference: dict, hs) -> dict:
    """An adapter's held-out data from REFERENCE (GateError where it has none for this adapter's task)."""
    ref = reference.get(adapter.name)
    kind = gate_kind(adapter)
    if ref is None or ref.get("kind") != kind:
        raise GateError(f"adapter {adapter.name}: {REFERENCE.name} holds no {kind} labels for it (it has the shipped "
                        "adapters' only: bench/precision_accuracy.py --write-reference, with the teachers, adds one)")
    if kind == "detection":
        return detect_data(ref["teacher"], ref["frames"], hs)
    clips = ref["clips"]
    if any(len(c["frames"]) != adapter.clip_len for c in clips):
        raise GateError(f"adapter {adapter.name}: the reference clips are not {adapter.clip_len} frames long")
    frames = _held_out_frames({k for c in clips for k in c["frames"]})
    return clip_data([[frames[k] for k in c["frames"]] for c in clips], [c["label"] for c in clips],
                     [c["persons"] for c in clips], [c["start"] for c in clips], hs, adapter.head.persons,
                     adapter.clip_len)


# ---------------------------------------------------------------- on a user's machine: the variants no one measured
def engine_for(variant: str, backbone, adapters: dict, image_size: int, engine_kw: dict | None = None
               ) -> tuple[Engine, bool | None]:
    """(the engine that computes `variant` as the daemon would here, the int8 activation width to force): "fp32",
    "bf16", "int8" / "int8-7bit" (torch), "openvino-int8-..." (the calibrated models at the float hint recorded
    here). engine_kw: the daemon's engine settings (max_slots, max_rank: an openvino part's key depends on them)."""
    kw = {"max_slots": max(1, len(adapters)), "premerge_max_mb": 4096, **(engine_kw or {})}
    mine = copy.deepcopy(backbone), copy.deepcopy(adapters)  # an engine rewrites both (LoRA, folded layer scale)
    if variant.startswith(A.OPENVINO_INT8):
        e = Engine(*mine, image_size, precision="int8", backend="openvino", **kw)
        if e.backend_name != "openvino":
            raise GateError(f"{variant}: the openvino backend does not run here")
        missing, _ = int8_calibration(backbone, adapters, dict(e.sizes))
        if missing:  # the engine would run float stand-ins: gating them would say nothing of the int8 models
            raise GateError(f"{variant}: {missing}")
        return e, None
    precision = {"int8-7bit": "int8"}.get(variant, variant)
    if precision not in ("fp32", "bf16", "int8"):
        raise GateError(f"{variant}: not a variant this code can compute")
    return Engine(*mine, image_size, precision=precision, **kw), {"int8": False, "int8-7bit": True}.get(variant)


def measure_missing(backbone, adapters: dict, image_size: int, variants: list[str], engine_kw: dict | None = None,
                    force: bool = False, reference_path: Path = REFERENCE) -> list[dict]:
    """Measure the gate of each of `variants` for each adapter that has no entry for it (shipped, or measured on
    this machine before; `force`: measure again) and record it on this machine. Returns one record per adapter and
    variant: {"adapter", "variant", "passes" | "error", "summary", "seconds", "kept"}."""
    records, todo = [], {}
    for name, a in adapters.items():
        for v in variants:
            have = A.gate_of(a).get(v)
            if have and not force:
                records.append({"adapter": name, "variant": v, "passes": bool(have.get("passes")), "kept": True,
                                "summary": have.get("summary", ""), "source": have.get("measured_on", "shipped")})
            else:
                todo.setdefault(name, []).append(v)
    if not todo:
        return records
    reference, hs = load_reference(reference_path), load_human_set(HUMAN_SET)
    engines: dict[str, tuple[Engine, bool | None]] = {}
    for name, wanted in todo.items():
        a = adapters[name]
        try:
            data = reference_data(a, reference, hs)
        except GateError as e:
            records += [{"adapter": name, "variant": v, "error": str(e), "kept": False} for v in wanted]
            continue
        fp32 = _scored("fp32", name, data, engines, backbone, adapters, image_size, engine_kw)
        for v in wanted:
            t1 = time.perf_counter()
            try:
                scored = _scored(v, name, data, engines, backbone, adapters, image_size, engine_kw)
            except GateError as e:
                records.append({"adapter": name, "variant": v, "error": str(e), "kept": False})
                continue
            gate = {**entry(gate_kind(a), compare(fp32, scored)), "measured_on": A.machine_gate_source(),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
            A.write_machine_gate(a, v, gate)
            records.append({"adapter": name, "variant": v, "passes": gate["passes"], "summary": gate["summary"],
                            "kept": False, "seconds": round(time.perf_counter() - t1, 1),
                            "source": gate["measured_on"]})
            log.info("gate %s %s: %s (%s)", name, v, "passes" if gate["passes"] else "FAILS", gate["summary"])
    return records


def _scored(variant: str, name: str, data: dict, engines: dict, backbone, adapters, image_size, engine_kw) -> dict:
    """`name`'s scores on `data` in `variant`; one engine per variant, shared by the adapters."""
    if variant not in engines:
        engines[variant] = engine_for(variant, backbone, adapters, image_size, engine_kw)
    engine, rr = engines[variant]
    return score(Scorer(engine, name, rr), data)
