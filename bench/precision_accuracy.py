"""Accuracy gate for the backbone's precision (and cheaper inputs): paired, held-out, bootstrap 95% intervals.

Every shipped adapter is scored through the daemon's own engine (premerged weights, frames letterboxed to
daemon.image_size 336 as ingest does and resized by the engine) under fp32 and under each candidate, on the same
held-out frames / clips (pedestrians.mp4 55-79.5 s every 0.5 s; the human-checked set's frames and clips where it
has them), and each candidate's difference to fp32 gets a bootstrap 95% interval (vlora_va/training/paired.py,
2000 resamples of frames / clips, seed 0):

    detect            person F1@0.5 at the adapter's threshold (teacher labels; human boxes), person AP50
    actions           clip top-1 (teacher tracking-rule labels)
    actions-persons   per-person top-1 (teacher labels, centre rule; human persons, IoU >= 0.5), clip top-1

A precision passes for an adapter unless one of its gated metrics' interval lies wholly below -0.01
(precision.GATE_MIN_DELTA); `--write-gate` records that beside each adapter (adapters/NAME/precision.json, tied
to the adapter's sha256), which is what `daemon.precision: auto` reads. Options (`--options`, never gated): the
actions adapter on 4 frames instead of 8, and actions-persons (4 frames at 336, clip label) in place of actions.
Writes bench/results/precision_accuracy.json and .md. Needs the teacher label cache or the teachers
(`../shared/assets/teachers`); about 10-20 min on 2 shared cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.engine import precision as P  # noqa: E402
from vlora_va.engine import precision_choice as A  # noqa: E402
from vlora_va.engine.adapters import load_adapter_dir  # noqa: E402
from vlora_va.engine.backbones import load_backbone  # noqa: E402
from vlora_va.engine.backends import openvino_int8  # noqa: E402
from vlora_va.engine.executor import Engine  # noqa: E402
from vlora_va.ingest.chunker import letterbox  # noqa: E402
from vlora_va.training import paired  # noqa: E402
from vlora_va.training import precision_gate as G  # noqa: E402
from vlora_va.training.calibrate import calibrate_engine  # noqa: E402
from vlora_va.training.data import activity_clips, detection_labels, merge_labels  # noqa: E402
from vlora_va.training.evaluate import HUMAN_SET, load_human_set, sources_of  # noqa: E402
from vlora_va.training.frames import read_frames  # noqa: E402
from vlora_va.training.spec import Range, Spec  # noqa: E402

IMAGE_SIZE = 336
PED, HELD_OUT = G.PED, G.HELD_OUT  # the held-out range the gate scores (training/precision_gate.py)
# name -> (precision, int8 activations in 7 bits): the 8-bit kernel runs where the CPU has VNNI, the 7-bit one
# elsewhere (precision.reduce_range), so both are gated, under their precision.gate_key names
VARIANTS = {"fp32": ("fp32", None), "bf16": ("bf16", None), "int8": ("int8", False), "int8-7bit": ("int8", True)}
# The openvino backend's int8 (NNCF, calibrated on the training range 0-50 s) as this CPU may run it: its float parts
# at each hint the CPU runs (f32; bf16 where native: calibration measures which is faster here), weights in 7 bits
# without VNNI (openvino_int8.gate_name -> the hint); only this CPU's variants can be measured
_CAPS = P.Capabilities.detect("cpu")
OPENVINO_INT8 = {openvino_int8.gate_name(_CAPS.native_bf16, _CAPS.vnni, h): h
                 for h in openvino_int8.float_hints(_CAPS.native_bf16)}
VARIANTS.update({name: ("int8", None) for name in OPENVINO_INT8})
GATED = ("bf16", "int8", "int8-7bit", *OPENVINO_INT8)
CALIBRATION = Range(PED, 0.0, 50.0, 1.0)  # the training range, one frame a second (50 frames, as the CLI takes)


def make_scorer(backbone, adapter, precision: str, reduce_range: bool | None = None,
                backend: str = "torch") -> G.Scorer:
    """One adapter alone in an engine of one precision (premerged weights), scored as the daemon serves it."""
    engine = Engine(copy.deepcopy(backbone), {adapter.name: adapter}, IMAGE_SIZE, max_slots=1, premerge_max_mb=4096,
                    precision=precision, backend=backend)
    assert engine.backend_name == backend, f"backend {backend} does not run here"
    if backend == "openvino" and precision == "int8":  # calibrated as `vlora-va models calibrate` does
        frames = [letterbox(f.rgb, IMAGE_SIZE)[0] for f in read_frames(CALIBRATION.video, CALIBRATION.start,
                                                                      CALIBRATION.end, CALIBRATION.step)]
        calibrate_engine(engine, {adapter.name: frames}, "pedestrians.mp4 0-50 s, 1 per second")
    return G.Scorer(engine, adapter.name, reduce_range)


def spec_for(adapter, clip_len: int | None = None) -> Spec:
    return Spec(name="eval", task=adapter.task, output=Path(adapter.path), clip_len=clip_len or adapter.clip_len)


def worst_token_cosine(s: G.Scorer, ref: G.Scorer, keys: list) -> float:
    """The lowest cosine between a token's last hidden state (class token and every patch token) in this precision and
    in fp32, over the frames `keys` (both scorers have computed them)."""
    worst = 1.0
    for k in keys:
        (a, _), (b, _) = s._cache[k], ref._cache[k]
        x = torch.cat([a.cls[:, None], a.grid.flatten(2).transpose(1, 2)], 1)
        y = torch.cat([b.cls[:, None], b.grid.flatten(2).transpose(1, 2)], 1)
        worst = min(worst, float(torch.nn.functional.cosine_similarity(x, y, dim=-1).min()))
    return worst


def detect_data(adapter, hs) -> dict:
    """The held-out data with labels from the adapter's own teachers (the package's reference_data reads what
    --write-reference keeps of it)."""
    frames = read_frames(HELD_OUT.video, HELD_OUT.start, HELD_OUT.end, HELD_OUT.step)
    spec = spec_for(adapter)
    teacher = merge_labels(*(detection_labels(src, frames, spec, progress=False) for src in sources_of(adapter)))
    return G.detect_data(teacher, [f.key for f in frames], hs)


def clip_data(adapter, hs, clip_len: int) -> dict:
    spec = spec_for(adapter, clip_len)
    clips = [c for src in sources_of(adapter) for c in activity_clips(src, [HELD_OUT], spec, progress=False)]
    return G.clip_data([c.frames for c in clips], [c.label for c in clips], [c.persons for c in clips],
                       [c.start for c in clips], hs, adapter.head.persons, clip_len)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapters", default="detect,actions,actions-persons")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--options", action="store_true", help="also the size / frame options (not gated)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-gate", action="store_true", help="write adapters/NAME/precision.json")
    ap.add_argument("--write-reference", action="store_true",
                    help=f"write the teachers' held-out labels the on-machine gate scores against ({G.REFERENCE.name})")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    backbone = load_backbone("dinov2-small")
    hs = load_human_set(HUMAN_SET)
    variants = [v for v in args.variants.split(",") if v]
    assert variants[0] == "fp32", "fp32 (the reference) comes first"
    report = {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "held_out": "pedestrians.mp4 55-79.5 s every 0.5 s",
              "human_set": hs.describe(), "bootstrap": {"resamples": paired.BOOTSTRAP, "seed": paired.SEED},
              "gate_min_delta": A.GATE_MIN_DELTA, "torch": torch.__version__, "adapters": {}, "options": {}}
    references = {}
    for name in [a for a in args.adapters.split(",") if a]:
        adapter = load_adapter_dir(name, ROOT / "adapters" / name, 384)
        t0 = time.monotonic()
        data = detect_data(adapter, hs) if adapter.task == "detection" else clip_data(adapter, hs, adapter.clip_len)
        references[name] = G.teacher_labels_json(data, G.gate_kind(adapter))
        scored: dict[str, dict] = {}
        counts: dict[str, dict] = {}
        cosine: dict[str, float] = {}  # detection: the worst per-token cosine of the last hidden state vs fp32
        for v in variants:
            prec, rr = VARIANTS[v]
            openvino_int8.HINT_OVERRIDE = OPENVINO_INT8.get(v)  # read when the engine is built
            try:
                s = make_scorer(backbone, copy.deepcopy(adapter), prec, rr,
                                "openvino" if v in OPENVINO_INT8 else "torch")
            finally:
                openvino_int8.HINT_OVERRIDE = None
            scored[v] = G.score(s, data)
            print(f"{name} {v}: " + ", ".join(f"{m} {fn(items):.4f}" for m, (items, fn) in scored[v].items()), flush=True)
            if adapter.task == "detection":
                counts[v] = G.human_counts(s, data)
                print(f"  {name} {v} on the human-checked set: {counts[v]}", flush=True)
                if v == "fp32":
                    reference = s
                else:  # the held-out frames of the surveillance camera (49 at 55-79.5 s)
                    cosine[v] = round(worst_token_cosine(s, reference, data["teacher_keys"]), 4)
                    print(f"  {name} {v}: worst token cosine vs fp32 {cosine[v]} at {s.size} px", flush=True)
            if v != "fp32":
                del s
        rows = {}
        for v in variants[1:]:
            rows[v] = G.compare(scored["fp32"], scored[v])
            for m, d in rows[v].items():
                print(f"  {name} {v} - fp32 {m}: {d['delta']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]", flush=True)
        report["adapters"][name] = {"sha256": adapter.sha256, "seconds": round(time.monotonic() - t0),
                                    "fp32": {m: round(fn(items), 4) for m, (items, fn) in scored["fp32"].items()},
                                    "vs_fp32": rows, "human_counts": counts, "worst_token_cosine": cosine,
                                    "kind": G.gate_kind(adapter)}
        gate = {}
        for v in GATED:
            if v in rows:
                gate[v] = G.entry(G.gate_kind(adapter), rows[v])
                print(f"  gate {name} {v}: {'passes' if gate[v]['passes'] else 'FAILS'} ({gate[v]['summary']})")
        report["adapters"][name]["gate"] = gate
        if args.write_gate and gate:
            path = ROOT / "adapters" / name / A.GATE_FILE
            gate = {**A.shipped_gate(adapter), **{k: {**g, "created": report["created"]} for k, g in gate.items()}}
            # (the precisions not measured this time keep their entries; each entry says when it was measured)
            path.write_text(json.dumps({
                "adapter_sha256": adapter.sha256, "written_by": "bench/precision_accuracy.py --write-gate",
                "created": report["created"], "rule": f"a precision passes unless a gated metric's paired bootstrap "
                f"95% interval (vs fp32) lies wholly below {A.GATE_MIN_DELTA}", "precisions": gate}, indent=1) + "\n")
            print(f"  wrote {path}")

    if args.write_reference:
        write_reference(references, report["created"])
    if args.options:
        report["options"] = options(backbone, hs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "precision_accuracy.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "precision_accuracy.md").write_text(markdown(report) + "\n")
    print(f"wrote {args.out / 'precision_accuracy.json'} and .md")
    return 0


def write_reference(references: dict, created: str) -> None:
    """Keep the teachers' held-out labels of these adapters in G.REFERENCE (the others' entries stay): what
    `vlora-va models calibrate` scores a variant against on a machine without the teachers."""
    old = G.load_reference()
    G.REFERENCE.write_text(json.dumps({
        "format": G.REFERENCE_FORMAT, "created": created, "written_by": "bench/precision_accuracy.py --write-reference",
        "held_out": f"{G.HELD_OUT.video.name} {G.HELD_OUT.start:g}-{G.HELD_OUT.end:g} s every {G.HELD_OUT.step:g} s",
        "adapters": {**old, **references}}, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {G.REFERENCE} ({', '.join(references)})")


def options(backbone, hs) -> dict:
    """Cheaper inputs for the activity task, each against today's actions (8 frames at 224, fp32), paired by clip."""
    actions = load_adapter_dir("actions", ROOT / "adapters" / "actions", 384)
    persons = load_adapter_dir("actions-persons", ROOT / "adapters" / "actions-persons", 384)
    d8 = clip_data(actions, hs, 8)
    d4 = clip_data(actions, hs, 4)
    dp = clip_data(persons, hs, persons.clip_len)
    assert d8["starts"] == d4["starts"] == dp["starts"], "the options must score the same clips"
    ref = G.score_clips(make_scorer(backbone, copy.deepcopy(actions), "fp32"), d8, 8)["clip top-1 (teacher)"]
    out = {}
    for name, adapter, data, clip_len, prec in (("actions, 4 frames, fp32", actions, d4, 4, "fp32"),
                                               ("actions, 4 frames, int8", actions, d4, 4, "int8"),
                                               ("actions, 8 frames, int8", actions, d8, 8, "int8"),
                                               ("actions-persons (4 frames at 336), fp32", persons, dp, 4, "fp32"),
                                               ("actions-persons (4 frames at 336), int8", persons, dp, 4, "int8")):
        items, fn = G.score_clips(make_scorer(backbone, copy.deepcopy(adapter), prec), data,
                                  clip_len)["clip top-1 (teacher)"]
        out[name] = {"clip top-1 (teacher) vs actions 8 frames fp32": paired.paired(ref[0], items, fn)}
        d = out[name]["clip top-1 (teacher) vs actions 8 frames fp32"]
        print(f"option {name}: clip top-1 {d['variant']:.4f} vs {d['reference']:.4f}: {d['delta']:+.4f} "
              f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]", flush=True)
    return out


def markdown(r: dict) -> str:
    lines = [f"# Precision accuracy gate ({r['created']})", "",
             f"Held-out {r['held_out']} (and the human-checked set `{Path(r['human_set']['path']).name}`, sha256 "
             f"{r['human_set']['sha256'][:12]}{'' if r['human_set']['frozen'] else ', NOT the frozen file'}), through "
             f"the engine (premerged, frames letterboxed to {IMAGE_SIZE} px). Paired differences to fp32 on the same "
             f"frames / clips, bootstrap 95% interval ({r['bootstrap']['resamples']} resamples, seed "
             f"{r['bootstrap']['seed']}). A precision stays off for an adapter when a gated metric's interval lies "
             f"wholly below {r['gate_min_delta']}.", "",
             "| adapter | metric | fp32 | variant | variant value | Δ vs fp32 | 95% interval | gated |",
             "|---|---|---:|---|---:|---:|---|---|"]
    gated = {name: G.GATE_METRICS[a.get("kind", "detection")] for name, a in r["adapters"].items()}
    for name, a in r["adapters"].items():
        for v, metrics in a["vs_fp32"].items():
            for m, d in metrics.items():
                lines.append(f"| {name} | {m} | {d['reference']:.3f} | {v} | {d['variant']:.3f} | {d['delta']:+.3f} | "
                             f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | {'yes' if m in gated[name] else ''} |")
    lines += ["", "| adapter | precision | gate |", "|---|---|---|"]
    for name, a in r["adapters"].items():
        for prec, g in a.get("gate", {}).items():
            lines.append(f"| {name} | {prec} | {'passes' if g['passes'] else 'off: ' + ', '.join(g['failing'])} |")
    counted = [(name, v, c) for name, a in r["adapters"].items() for v, c in a.get("human_counts", {}).items()]
    if counted:
        lines += ["", "On the human-checked boxes (not gated): persons taller than 100 px found, side-by-side pairs "
                  "that came out as two boxes:", "", "| adapter | precision | persons > 100 px | pairs split |",
                  "|---|---|---:|---:|"]
        lines += [f"| {name} | {v} | {c['persons over 100 px found']} of {c['persons over 100 px']} | "
                  f"{c['side-by-side pairs split']} of {c['side-by-side pairs']} |" for name, v, c in counted]
    cosines = [(name, v, c) for name, a in r["adapters"].items() for v, c in a.get("worst_token_cosine", {}).items()]
    if cosines:
        lines += ["", "Worst per-token cosine of the last hidden state (every token) against fp32, over the held-out "
                  "frames at 55-79.5 s: " + "; ".join(f"{name} {v} {c:.4f}" for name, v, c in cosines) + "."]
    if r.get("options"):
        lines += ["", "Options for the activity task, against today's `actions` (8 frames at 224 px, fp32), clip top-1 "
                  "on the same 48 clips (teacher labels):", "", "| option | top-1 | Δ | 95% interval |", "|---|---:|---:|---|"]
        for name, o in r["options"].items():
            d = next(iter(o.values()))
            lines.append(f"| {name} | {d['variant']:.3f} | {d['delta']:+.3f} | [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
