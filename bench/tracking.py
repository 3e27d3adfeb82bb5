"""Tracking and counting on real footage, against the hand-made identity ground truth; and the cost per frame.

1. Accuracy. The shipped `detect` adapter's boxes on sample_videos/pedestrians.mp4 55.0-79.5 s (every frame, 10 fps;
   computed once and cached in bench/results/tracking_detections.json) are fed to each tracker the project can use
   (Roboflow `trackers`: ByteTrack, SORT, OC-SORT) through vlora_va.analytics.tracking.StreamTracker, exactly as the
   daemon feeds a tracked task, at 10 fps and at 2 fps (every 0.5 s, what pipelines.yaml's tracked task takes).
   Scored on the frozen identity ground truth (adapters/eval/human-v1-tracks.json: persons, every 0.5 s) with
   vlora_va.training.track_metrics: IDF1, MOTA, ID switches. The confirmed tracks' feet then go through
   vlora_va.analytics.rules.SceneRules with the ground truth's lines; the counts are compared with the hand counts
   (in / out per line).
2. Cost. Tracker + rules per frame with 50 objects walking (3 lines, 2 zones), median over repeats, per tracker.

    python bench/tracking.py [--trackers bytetrack,sort,ocsort] [--repeats 5]

Writes bench/results/tracking.json and tracking.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.analytics.rules import SceneRules, TrackPoint  # noqa: E402
from vlora_va.analytics.tracking import StreamTracker, TrackIds  # noqa: E402
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections  # noqa: E402
from vlora_va.contracts.scene import LineConfig, TrackingConfig, ZoneConfig  # noqa: E402
from vlora_va.testing.host import cpu_name  # noqa: E402
from vlora_va.training.track_metrics import identity_truth, score_tracks  # noqa: E402

VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"
START, END = 55.0, 79.5
DETECTIONS = ROOT / "bench" / "results" / "tracking_detections.json"
OUT = ROOT / "bench" / "results"
# frames of the 10-fps video between two tracked frames. The ground truth has a frame every 0.5 s: 10 and 2 fps see
# all of them; 5 fps (0.0, 0.2, ... 0.8 s) only those on whole seconds, and is scored on those.
RATES = {"10 fps": 1, "5 fps": 2, "2 fps": 5}
MATCHES = ("iou", "diou")


def detections(adapter_dir: Path) -> dict:
    """{"adapter_sha256", "frames": {t: [[x1, y1, x2, y2, score, class], ...]}}: the adapter's boxes at its own
    score threshold, every frame of the range (cached)."""
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.training.evaluate import detection_predictions, merged_backbone
    from vlora_va.training.frames import read_frames

    adapter = load_adapter_dir("detect", adapter_dir, load_backbone("dinov2-small").config.hidden_size)
    if DETECTIONS.exists():
        cached = json.loads(DETECTIONS.read_text())
        if cached.get("adapter_sha256") == adapter.sha256:
            return cached
    model = merged_backbone("dinov2-small", adapter)
    threshold = adapter.head.score_threshold
    out = {}
    frames = read_frames(VIDEO, START, END + 0.05)
    for i in range(0, len(frames), 16):
        batch = frames[i:i + 16]
        preds = detection_predictions(adapter, model, batch)
        for f in batch:
            out[f"{f.t:.1f}"] = [[*p["box"], p["score"], p["class"]] for p in preds[f.key] if p["score"] >= threshold]
        print(f"  detections: {min(i + 16, len(frames))}/{len(frames)} frames", flush=True)
    doc = {"adapter_sha256": adapter.sha256, "threshold": threshold, "video": str(VIDEO.relative_to(ROOT)),
           "range": [START, END], "frames": out}
    DETECTIONS.write_text(json.dumps(doc))
    return doc


def track(dets: dict, cfg: TrackingConfig, every: int) -> dict[float, list[tuple[str, list[float], str]]]:
    """{t: [(track_id, box, class)]} of confirmed tracks, the tracker fed every `every`-th frame."""
    times = sorted(float(t) for t in dets["frames"])
    times = [t for i, t in enumerate(times) if i % every == 0]
    fps = 10.0 / every
    tracker = StreamTracker(cfg, fps, TrackIds("b"))
    out = {}
    for t in times:
        frame = FrameDetections(t, tuple(Detection(tuple(d[:4]), d[5], d[4]) for d in dets["frames"][f"{t:.1f}"]))
        result, _ = tracker.track(DetectionResult((frame,)))
        out[t] = [(d.track_id, list(d.box), d.cls) for d in result.frames[0].detections if d.track_id]
    return out


def counts(tracked: dict, lines: list[dict]) -> dict:
    rules = SceneRules(tuple(LineConfig(l["name"], tuple(map(tuple, l["points"])), cooldown_s=0.0) for l in lines), ())
    for t in sorted(tracked):
        rules.update(t, [TrackPoint(tid, cls, tuple(box)) for tid, box, cls in tracked[t] if cls == "person"])
    return {name: {d: sum(c.get(d, {}).values()) for d in ("in", "out")} for name, c in rules.counts()["lines"].items()}


def accuracy(dets: dict, kinds: list[str]) -> list[dict]:
    truth = identity_truth()
    want = {line["name"]: line["counts"] for line in truth.lines}
    out = []
    for kind in kinds:
        for match in MATCHES:
            for rate, every in RATES.items():
                tracked = track(dets, TrackingConfig(tracker=kind, match=match), every)
                persons = {t: [(tid, box) for tid, box, cls in v if cls == "person"] for t, v in tracked.items()}
                seen = {t: v for t, v in truth.gt.items() if any(abs(t - u) < 1e-6 for u in tracked)}
                s = score_tracks(seen, persons, truth.ignore)
                got = counts(tracked, truth.lines)
                worst = max(abs(got[n][d] - want[n][d]) for n in want for d in ("in", "out"))
                out.append({"tracker": kind, "match": match, "rate": rate, "scored_frames": s.frames,
                            "idf1": round(s.idf1, 3), "mota": round(s.mota, 3), "id_switches": s.id_switches,
                            "gt_ids": s.gt_ids, "pred_ids": s.pred_ids,
                            "switches_per_10_ids": round(10 * s.id_switches / max(1, s.gt_ids), 2),
                            "counts": got, "hand_counts": want, "worst_count_error": worst,
                            "identities": identity_paths(seen, persons)})
                print(f"  {kind:9s} {match:4s} {rate:6s} IDF1 {s.idf1:.3f} MOTA {s.mota:.3f} IDsw {s.id_switches} "
                      f"worst count error {worst}", flush=True)
    return out


def identity_paths(gt: dict, pred: dict) -> dict[str, str]:
    """Per true identity, the track each of its scored frames was best matched to (IoU >= 0.5; "." none): where
    its ID switches happened, by eye."""
    from vlora_va.training.track_metrics import iou_matrix

    out: dict[str, list[str]] = {}
    for t in sorted(gt):
        p = pred.get(t, [])
        if not gt[t]:
            continue
        m = iou_matrix(np.array([b for _, b in gt[t]], float), np.array([b for _, b in p], float).reshape(-1, 4))
        for i, (gid, _) in enumerate(gt[t]):
            j = int(m[i].argmax()) if len(p) else -1
            out.setdefault(str(gid), []).append(p[j][0].rsplit("-", 1)[-1] if j >= 0 and m[i, j] >= 0.5 else ".")
    return {k: " ".join(v) for k, v in out.items()}


def walkers(n: int, frames: int, seed: int = 0) -> list[FrameDetections]:
    """n people walking straight at 20-60 px/s on a 768 x 576 frame, sampled at 2 fps."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([0, 100], [700, 500], (n, 2))
    speed = rng.uniform(-30, 30, (n, 2))
    out = []
    for i in range(frames):
        p = start + speed * i * 0.5
        out.append(FrameDetections(i * 0.5, tuple(Detection((x, y, x + 30, y + 70), "person", 0.8) for x, y in p)))
    return out


def cost(kinds: list[str], repeats: int, n: int = 50, frames: int = 120) -> list[dict]:
    lines = (LineConfig("a", ((300.0, 0.0), (300.0, 576.0))), LineConfig("b", ((0.0, 300.0), (768.0, 300.0))),
             LineConfig("c", ((100.0, 100.0), (600.0, 500.0))))
    zones = (ZoneConfig("z1", ((0.0, 0.0), (300.0, 0.0), (300.0, 300.0), (0.0, 300.0)), dwell_s=5.0),
             ZoneConfig("z2", ((400.0, 300.0), (768.0, 300.0), (768.0, 576.0), (400.0, 576.0))))
    seq = walkers(n, frames)
    out = []
    for kind in kinds:
        per_frame = []
        for _ in range(repeats):
            tracker = StreamTracker(TrackingConfig(tracker=kind), 2.0, TrackIds("c"))  # the default match: diou
            rules = SceneRules(lines, zones)
            t0 = time.perf_counter()
            for f in seq:
                result, tracked = tracker.track(DetectionResult((f,)))
                tf = tracked[0]
                if tf.ended:
                    rules.end([tid for tid, _ in tf.ended], tf.ts)
                rules.update(tf.ts, [TrackPoint(d.track_id, d.cls, d.box) for d in tf.detections if d.track_id])
            per_frame.append((time.perf_counter() - t0) / frames * 1000)
        out.append({"tracker": kind, "objects": n, "lines": 3, "zones": 2, "ms_per_frame": round(
            statistics.median(per_frame), 3), "repeats_ms": [round(x, 3) for x in per_frame]})
        print(f"  cost {kind:9s}: {statistics.median(per_frame):.2f} ms per frame at {n} objects", flush=True)
    return out




def table(doc: dict) -> str:
    rows = ["| tracker | match | rate (frames scored) | IDF1 | MOTA | ID switches (per 10 ids) | tracks / true ids "
            "| worst count error |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for a in doc["accuracy"]:
        rows.append(f"| {a['tracker']} | {a['match']} | {a['rate']} ({a['scored_frames']}) | {a['idf1']:.3f} | "
                    f"{a['mota']:.3f} | {a['id_switches']} ({a['switches_per_10_ids']}) | {a['pred_ids']} / "
                    f"{a['gt_ids']} | {a['worst_count_error']} |")
    rows += ["", "| tracker | tracker + rules, ms per frame at 50 objects (median) |", "|---|---:|"]
    rows += [f"| {c['tracker']} | {c['ms_per_frame']:.2f} |" for c in doc["cost"]]
    lines = ["", "Line counts (in / out) at 2 fps with diou (what pipelines.yaml runs) vs by hand:", ""]
    for a in doc["accuracy"]:
        if a["rate"] == "2 fps" and a["match"] == "diou":
            lines.append(f"- {a['tracker']}: " + ", ".join(
                f"{n} {c['in']}/{c['out']} (hand {a['hand_counts'][n]['in']}/{a['hand_counts'][n]['out']})"
                for n, c in a["counts"].items()))
    return "\n".join([f"Tracking on pedestrians.mp4 55-79.5 s ({doc['cpu']}, {doc['date']})", "", *rows, *lines, ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trackers", default="bytetrack,sort,ocsort")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--adapter", default=str(ROOT / "adapters" / "detect"))
    args = ap.parse_args()
    kinds = args.trackers.split(",")
    print("detections (the detect adapter, every frame)...", flush=True)
    dets = detections(Path(args.adapter))
    doc = {"cpu": cpu_name(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "ground_truth": "adapters/eval/human-v1-tracks.json", "accuracy": accuracy(dets, kinds),
           "cost": cost(kinds, args.repeats)}
    OUT.mkdir(exist_ok=True)
    (OUT / "tracking.json").write_text(json.dumps(doc, indent=1))
    (OUT / "tracking.md").write_text(table(doc))
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
