"""What each step of the refined labels is worth, against human boxes on both human-checked sets.

    python bench/label_steps.py [--out bench/results/label_steps]

Sets: traffic-a's 12 human-checked frames (adapters/eval/human-traffic-a.json; vehicles, every vehicle class counted
as one; the footage from ../shared/footage/, tests and development only) and pedestrians.mp4's 49 (human-v1.json;
persons). The background a motion step needs is made only from footage a fit there could train on (traffic-a 0-7.4 s,
pedestrians 0-54 s). From the third row on, each row adds one step to the row above it; the rows marked "left out"
add a step to the full recipe that training/refined_labels.py does not take, and say what it did. Writes OUT.json and
OUT.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.common.host import cpu_name  # noqa: E402
from vlora_va.testing.footage import second_camera  # noqa: E402
from vlora_va.contracts.boxes import pair_iou  # noqa: E402
from vlora_va.training import refined_labels as R  # noqa: E402
from vlora_va.training.evaluate import load_human_set  # noqa: E402
from vlora_va.training.frames import read_frames  # noqa: E402
from vlora_va.training.label_classes import group_of, vehicle_agnostic  # noqa: E402
from vlora_va.training.label_fusion import fuse_boxes  # noqa: E402
from vlora_va.training.metrics import detection_report  # noqa: E402
from vlora_va.training.teachers import CenterNetTeacher, NanoDetTeacher, nms  # noqa: E402

SETS = {  # name: (video, human set, class judged, footage a fit may train on: [0, end))
    "traffic-a": (second_camera() or ROOT.parent / "shared" / "footage" / "traffic-a.mp4", "human-traffic-a.json",
                  "vehicle", 7.4),
    "pedestrians": (ROOT / "sample_videos" / "pedestrians.mp4", "human-v1.json", "person", 54.0),
}
KEPT = ("person", "car", "truck", "bus")


def fused(raws: dict[str, list[dict]], grouped: bool) -> list[dict]:
    per = {}
    for name, labs in raws.items():
        labs = [lab for lab in labs if lab["score"] >= 0.1 and lab["class"] in KEPT]
        if grouped:
            labs = nms([{**lab, "class": group_of(lab["class"])} for lab in labs], 0.6)
        per[name] = labs
    return fuse_boxes(per)


def mirrored(rgb: np.ndarray, teacher) -> list[dict]:
    w = rgb.shape[1]
    found = teacher._detect(np.ascontiguousarray(rgb[:, ::-1]))
    return [{**lab, "box": [w - lab["box"][2], lab["box"][1], w - lab["box"][0], lab["box"][3]]} for lab in found]


def motion_read(labs: list[dict], mask) -> list[dict]:
    return [lab for lab in labs if lab["score"] >= R.KEEP
            or (lab["score"] >= R.IGNORE_BELOW and mask is not None and R.moving_share(mask, lab["box"]) >= R.MOVING)]


def linked(a: dict, b: dict) -> bool:
    """The same object on a neighbouring frame: overlapping, or (fast) centres within 0.75 of the diagonal."""
    if pair_iou(a["box"], b["box"]) >= 0.3:
        return True
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = a["box"], b["box"]
    d = np.hypot((ax1 + ax2 - bx1 - bx2) / 2, (ay1 + ay2 - by1 - by2) / 2)
    area_a, area_b = (ax2 - ax1) * (ay2 - ay1), max((bx2 - bx1) * (by2 - by1), 1e-6)
    return d <= 0.75 * np.hypot(ax2 - ax1, ay2 - ay1) and 1 / 1.6 <= area_a / area_b <= 1.6


def score(preds: dict, refs: dict, cls: str) -> dict:
    r = detection_report(vehicle_agnostic(preds), vehicle_agnostic(refs), [cls], 0.0)[cls]
    return {k: round(r[k], 3) for k in ("precision", "recall", "f1", "refs")}


def measure(name: str) -> list[dict]:
    video, human, cls, fit_end = SETS[name]
    if not video.is_file():
        raise SystemExit(f"{video}: missing")
    hs = load_human_set(ROOT / "adapters" / "eval" / human)
    refs = {k: [b for b in v if group_of(b["class"]) == cls or cls == "vehicle" and b["class"] in ("car", "truck")]
            for k, v in hs.boxes.items() if hs.times[k][0] == video.stem}
    times = sorted(hs.times[k][1] for k in refs)
    frames = [f for f in read_frames(video, times[0] - 0.3, times[-1] + 0.3) if f.key in refs
              or any(abs(f.t - t) < 0.3 for t in times)]
    by_key = {f.key: f for f in frames}
    labelled = [f for f in frames if f.key in refs]
    teachers = [CenterNetTeacher(None, None, 0.1), NanoDetTeacher(None, None, 0.1)]
    bg = R.background(read_frames(video, 0, fit_end, 0.25))
    t0 = time.monotonic()
    raw = {f.key: {f"{t.name}/{v}": R.detect_view(f.rgb, t, v) for t in teachers
                   for v in ("whole", "letterboxed", "tiles")}
           | {f"{t.name}/mirror": mirrored(f.rgb, t) for t in teachers} for f in frames}
    labelling_s = time.monotonic() - t0
    masks = {k: R.moving_mask(by_key[k].rgb, bg) for k in raw}

    def looks(k, views):
        return {n: v for n, v in raw[k].items() if n.split("/")[1] in views}

    def per_class(k, views, threshold):
        return [{**lab} for lab in fused(looks(k, views), grouped=False) if lab["score"] >= threshold]

    recipe = {k: motion_read(fused(looks(k, ("whole", "letterboxed")), True), masks[k]) for k in raw}
    steps = [
        ("the fit before: per class, 2 x 2 tiles, score >= 0.4", {k: per_class(k, ("tiles",), 0.4) for k in refs}),
        ("teachers fused per class, whole frame, score >= 0.3 (their usual reading)",
         {k: per_class(k, ("whole",), 0.3) for k in refs}),
        ("teachers fused per class, whole frame, score >= 0.4 (the fit's label threshold, without tiles)",
         {k: per_class(k, ("whole",), 0.4) for k in refs}),
        ("+ vehicle classes as one group (>= 0.4)",
         {k: [lab for lab in fused(looks(k, ("whole",)), True) if lab["score"] >= R.KEEP] for k in refs}),
        ("+ the letterboxed look (>= 0.4)",
         {k: [lab for lab in fused(looks(k, ("whole", "letterboxed")), True) if lab["score"] >= R.KEEP] for k in refs}),
        ("+ motion: 0.2-0.4 boxes kept where they move (the recipe)", {k: recipe[k] for k in refs}),
        ("left out: + the mirrored look",
         {k: motion_read(fused(looks(k, ("whole", "letterboxed", "mirror")), True), masks[k]) for k in refs}),
        ("left out: + 2 x 2 tiles",
         {k: motion_read(fused(looks(k, ("tiles", "letterboxed")), True), masks[k]) for k in refs}),
        ("left out: + time, one-frame flickers dropped (linked on no neighbour within 0.25 s, score < 0.5)",
         {k: [lab for lab in recipe[k] if lab["score"] >= 0.5 or any(
             linked(lab, o) for n in raw if n != k and abs(by_key[n].t - by_key[k].t) <= 0.26 for o in recipe[n])]
          for k in refs}),
        ("left out: + time, one-frame gaps filled between linked boxes", {k: recipe[k] + gap_fill(k, recipe, by_key)
                                                                           for k in refs}),
    ]
    return [{"set": name, "step": step, "frames": len(labelled), **score(preds, refs, cls),
             "teacher_runs_s_per_frame": round(labelling_s / len(frames), 2)} for step, preds in steps]


def gap_fill(k: str, labels: dict, by_key: dict) -> list[dict]:
    """Boxes linked between the nearest frames before and after k with nothing at k: the box between them."""
    t = by_key[k].t
    before = [n for n in labels if by_key[n].t < t - 1e-6]
    after = [n for n in labels if by_key[n].t > t + 1e-6]
    if not before or not after:
        return []
    a_key = max(before, key=lambda n: by_key[n].t)
    b_key = min(after, key=lambda n: by_key[n].t)
    out = []
    for a in labels[a_key]:
        for b in labels[b_key]:
            if a["class"] == b["class"] and linked(a, b):
                box = [(x + y) / 2 for x, y in zip(a["box"], b["box"])]
                if not any(pair_iou(box, o["box"]) >= 0.3 for o in labels[k] + out if o["class"] == a["class"]):
                    out.append({"box": box, "class": a["class"], "score": min(a["score"], b["score"])})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "label_steps"))
    args = ap.parse_args()
    rows = [r for name in SETS for r in measure(name)]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(), "rows": rows}
    Path(args.out).with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    lines = [f"# Refined labels, step by step ({meta['date']}, {meta['cpu']})", "",
             "| set | step | precision | recall | F1 |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['set']} ({r['frames']} frames, {r['refs']} objects) | {r['step']} | {r['precision']:.3f} | "
              f"{r['recall']:.3f} | {r['f1']:.3f} |" for r in rows]
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
