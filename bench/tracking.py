"""Tracking and counting on real footage, against the hand-made identity ground truth; and the cost per frame.

1. Accuracy. The shipped `detect` adapter's boxes on sample_videos/pedestrians.mp4 55.0-79.5 s (every frame, 10 fps;
   computed once and cached in bench/results/tracking_detections.json), each with its appearance embedding (the
   backbone's tokens at the end of the LoRA-free prefix pooled in the box, vlora_va.engine.heads.appearance, as the
   engine makes them), are fed to each tracker the project has through vlora_va.analytics.tracking.StreamTracker,
   exactly as the daemon feeds a tracked task, at 10 fps and at 2 fps (every 0.5 s, what pipelines.yaml's tracked
   task takes): ours, `appearance`, with and without the appearance term and re-entry, and Roboflow `trackers`'
   ByteTrack, SORT and OC-SORT (geometry alone). Scored on the frozen identity ground truth
   (adapters/eval/human-v1-tracks.json: persons, every 0.5 s) with vlora_va.training.track_metrics: IDF1, MOTA, ID
   switches. The confirmed tracks' feet then go through vlora_va.analytics.rules.SceneRules with the ground truth's
   lines; the counts are compared with the hand counts (in / out per line).
2. Other cameras. The appearance tracker's settings were chosen on that footage, so the same range is re-shot
   through the three held-out views of the camera issue (vlora_va.training.views.EVAL_VIEWS: reframed, low-light,
   small-sensor), the identity boxes carried through the same transform, and scored alike (detections cached in
   build/tracking-views/).
3. Cost. Tracker + rules per frame with 50 objects walking (3 lines, 2 zones), median over repeats, per tracker
   (the appearance tracker with 768-wide embeddings); and the embedding itself: pooling 50 boxes on a 336-px frame's
   tokens, against that frame's backbone forward (torch fp32, same run).

    python bench/tracking.py [--trackers appearance,bytetrack,sort,ocsort] [--repeats 5] [--views]

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
from vlora_va.training.frames import read_frames  # noqa: E402
from vlora_va.training.track_metrics import identity_truth, score_tracks  # noqa: E402

VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"
START, END = 55.0, 79.5
DETECTIONS = ROOT / "bench" / "results" / "tracking_detections.json"
OUT = ROOT / "bench" / "results"
# frames of the 10-fps video between two tracked frames. The ground truth has a frame every 0.5 s: 10 and 2 fps see
# all of them; 5 fps (0.0, 0.2, ... 0.8 s) only those on whole seconds, and is scored on those.
RATES = {"10 fps": 1, "5 fps": 2, "2 fps": 5}
MATCHES = ("iou", "diou")
EMBED_LAYER = 8  # the shipped detect adapter's LoRA starts at block 8: the engine pools the tokens entering it
VIEWS_CACHE = ROOT / "build" / "tracking-views"
EMBED_DIM = 2 * 384 + 2 * 64  # dinov2-small's two token bands and two 64-colour histograms


def detections(adapter_dir: Path) -> dict:
    """{"adapter_sha256", "frames": {t: [[x1, y1, x2, y2, score, class], ...]}}: the adapter's boxes at its own
    score threshold, every frame of the range (cached)."""
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.training.evaluate import detection_predictions, merged_backbone
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


# Trackers as the bench runs them: a name in the tables -> (TrackingConfig.tracker, its other settings)
SETUPS = {
    "appearance": ("appearance", {}),
    "appearance, geometry only": ("appearance", {"appearance_weight": 0.0, "reid_window_s": 0.0}),
    "bytetrack": ("bytetrack", {}), "sort": ("sort", {}), "ocsort": ("ocsort", {}),
}


def setups(kinds: list[str]) -> dict[str, tuple[str, dict]]:
    """The bench setups of the requested tracker kinds (appearance: with and without its appearance term)."""
    return {name: v for name, v in SETUPS.items() if v[0] in kinds}


def embed(frames: list, boxes: dict[str, list], layer: int = EMBED_LAYER, side: int = 336) -> dict[str, np.ndarray]:
    """{t: [n, E] embeddings of the boxes at t} (boxes in original pixels, keys "%.1f"): the base backbone's tokens
    entering block `layer` and the model input's colours, as the engine pools them (engine/heads/appearance.py)."""
    import torch

    from vlora_va.engine.backbones import load_backbone, patch_size
    from vlora_va.engine.backends.torch_eager import lower
    from vlora_va.engine.heads.appearance import appearance_embeddings
    from vlora_va.engine.heads.features import token_grid
    from vlora_va.training.frames import letterboxed_batch

    model = load_backbone("dinov2-small")
    patch = patch_size(model)
    out = {}
    with torch.inference_mode():
        for i in range(0, len(frames), 8):
            batch = frames[i:i + 8]
            pixels, lbs = letterboxed_batch(batch, side)
            grid = token_grid(lower(model, pixels, layer), side, patch)
            for j, f in enumerate(batch):
                key = f"{f.t:.1f}"
                model_boxes = torch.tensor([lbs[j].box_to_model(d[:4]) for d in boxes[key]],
                                           dtype=torch.float32).reshape(-1, 4)
                out[key] = appearance_embeddings(grid[j], pixels[j], model_boxes, side).float().numpy()
    return out


def track(dets: dict, emb: dict | None, cfg: TrackingConfig, every: int) -> dict[float, list[tuple[str, list[float], str]]]:
    """{t: [(track_id, box, class)]} of confirmed tracks, the tracker fed every `every`-th frame (boxes with their
    embeddings when emb is given)."""
    times = sorted(float(t) for t in dets["frames"])
    times = [t for i, t in enumerate(times) if i % every == 0]
    fps = 10.0 / every
    tracker = StreamTracker(cfg, fps, TrackIds("b"))
    out = {}
    for t in times:
        key = f"{t:.1f}"
        vecs = emb[key] if emb is not None else [None] * len(dets["frames"][key])
        frame = FrameDetections(t, tuple(Detection(tuple(d[:4]), d[5], d[4], None, v)
                                         for d, v in zip(dets["frames"][key], vecs)))
        result, _ = tracker.track(DetectionResult((frame,)))
        out[t] = [(d.track_id, list(d.box), d.cls) for d in result.frames[0].detections if d.track_id]
    return out


def counts(tracked: dict, lines: list[dict]) -> dict:
    rules = SceneRules(tuple(LineConfig(l["name"], tuple(map(tuple, l["points"])), cooldown_s=0.0) for l in lines), ())
    for t in sorted(tracked):
        rules.update(t, [TrackPoint(tid, cls, tuple(box)) for tid, box, cls in tracked[t] if cls == "person"])
    return {name: {d: sum(c.get(d, {}).values()) for d in ("in", "out")} for name, c in rules.counts()["lines"].items()}


def score(truth, dets: dict, emb: dict, name: str, kind: str, extra: dict, match: str, every: int,
          lines: bool = True) -> dict:
    tracked = track(dets, emb if kind == "appearance" else None, TrackingConfig(tracker=kind, match=match, **extra),
                    every)
    persons = {t: [(tid, box) for tid, box, cls in v if cls == "person"] for t, v in tracked.items()}
    seen = {t: v for t, v in truth.gt.items() if any(abs(t - u) < 1e-6 for u in tracked)}
    s = score_tracks(seen, persons, truth.ignore)
    row = {"tracker": name, "match": match, "scored_frames": s.frames, "idf1": round(s.idf1, 3),
           "mota": round(s.mota, 3), "id_switches": s.id_switches, "gt_ids": s.gt_ids, "pred_ids": s.pred_ids,
           "switches_per_10_ids": round(10 * s.id_switches / max(1, s.gt_ids), 2),
           "identities": identity_paths(seen, persons)}
    if lines:
        want = {line["name"]: line["counts"] for line in truth.lines}
        got = counts(tracked, truth.lines)
        row.update(counts=got, hand_counts=want,
                   worst_count_error=max(abs(got[n][d] - want[n][d]) for n in want for d in ("in", "out")))
    return row


def accuracy(dets: dict, emb: dict, kinds: list[str]) -> list[dict]:
    truth = identity_truth()
    out = []
    for name, (kind, extra) in setups(kinds).items():
        for match in (("diou",) if kind == "appearance" else MATCHES):
            for rate, every in RATES.items():
                row = {"rate": rate, **score(truth, dets, emb, name, kind, extra, match, every)}
                out.append(row)
                print(f"  {name:26s} {match:4s} {rate:6s} IDF1 {row['idf1']:.3f} MOTA {row['mota']:.3f} "
                      f"IDsw {row['id_switches']} worst count error {row['worst_count_error']}", flush=True)
    return out


def view_truth(truth, view, size: tuple[int, int]):
    """The identity ground truth carried through a view: boxes mostly inside it stay, slivers become ignore
    regions (as views.carry_human_set does for the human-checked set), ignore regions are carried too."""
    from vlora_va.training.track_metrics import IdentityTruth
    from vlora_va.training.views import MIN_VISIBLE

    gt, ignore = {}, {}
    for t, items in truth.gt.items():
        mapped, visible = view.map_boxes([b for _, b in items], size) if items else (np.zeros((0, 4)), [])
        gt[t] = [(gid, list(map(float, m))) for (gid, _), m, v in zip(items, mapped, visible) if v >= MIN_VISIBLE]
        regions = [list(map(float, m)) for m, v in zip(mapped, visible) if 0 < v < MIN_VISIBLE]
        if truth.ignore.get(t):
            rm, rv = view.map_boxes(truth.ignore[t], size)
            regions += [list(map(float, m)) for m, v in zip(rm, rv) if v > 0]
        ignore[t] = regions
    return IdentityTruth(gt, ignore, [], truth.classes, truth.sha256)


def views_accuracy(adapter_dir: Path, kinds: list[str]) -> list[dict]:
    """The appearance setups (and ByteTrack) on the held-out views of the same range, at 10 and 2 fps."""
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.ingest.exposure import VERSION as EXPOSURE_VERSION
    from vlora_va.training.evaluate import detection_predictions, merged_backbone
    from vlora_va.training.frames import TrainingFrame
    from vlora_va.training.views import EVAL_VIEWS

    truth = identity_truth()
    adapter = load_adapter_dir("detect", adapter_dir, load_backbone("dinov2-small").config.hidden_size)
    source = read_frames(VIDEO, START, END + 0.05)
    out = []
    model = None
    for vname, view in EVAL_VIEWS.items():
        # the exposure rule decides the dark view's pixels (ingest/exposure.py): detections from another rule are stale
        cache = VIEWS_CACHE / f"{vname}-{adapter.sha256[:12]}-e{EXPOSURE_VERSION}.json"
        frames = [TrainingFrame(f.video, f.t, view.apply(f.rgb, seed=i)[0], vname) for i, f in enumerate(source)]
        described = json.loads(json.dumps(view.describe()))  # as the cache holds it (tuples become lists)
        if cache.exists() and json.loads(cache.read_text()).get("view") == described:
            dets = json.loads(cache.read_text())
        else:
            model = model or merged_backbone("dinov2-small", adapter)
            thr = adapter.head.score_threshold
            found = {}
            for i in range(0, len(frames), 16):
                preds = detection_predictions(adapter, model, frames[i:i + 16])
                for f in frames[i:i + 16]:
                    found[f"{f.t:.1f}"] = [[*p["box"], p["score"], p["class"]] for p in preds[f.key] if p["score"] >= thr]
                print(f"  {vname}: detections {min(i + 16, len(frames))}/{len(frames)} frames", flush=True)
            dets = {"view": view.describe(), "frames": found}
            VIEWS_CACHE.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(dets))
        emb = embed(frames, dets["frames"])
        vt = view_truth(truth, view, (source[0].rgb.shape[1], source[0].rgb.shape[0]))
        for name, (kind, extra) in setups(kinds).items():
            if kind not in ("appearance", "bytetrack"):
                continue
            for rate, every in (("10 fps", 1), ("2 fps", 5)):
                row = {"view": vname, "rate": rate, **score(vt, dets, emb, name, kind, extra, "diou", every, False)}
                out.append(row)
                print(f"  {vname:12s} {name:26s} {rate:6s} IDF1 {row['idf1']:.3f} IDsw {row['id_switches']}",
                      flush=True)
    return out


def identity_paths(gt: dict, pred: dict) -> dict[str, str]:
    """Per true identity, the track each of its scored frames was best matched to (IoU >= 0.5; "." none): where
    its ID switches happened, by eye."""
    from vlora_va.contracts.boxes import iou_matrix

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


def walkers(n: int, frames: int, seed: int = 0, dim: int = 0) -> list[FrameDetections]:
    """n people walking straight at 20-60 px/s on a 768 x 576 frame, sampled at 2 fps; dim > 0: each box with an
    embedding (a unit vector per person, plus noise as real ones have)."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([0, 100], [700, 500], (n, 2))
    speed = rng.uniform(-30, 30, (n, 2))
    looks = rng.normal(size=(n, max(dim, 1)))
    out = []
    for i in range(frames):
        p = start + speed * i * 0.5
        e = looks + 0.3 * rng.normal(size=looks.shape)
        e = (e / np.linalg.norm(e, axis=1, keepdims=True)).astype(np.float16)
        out.append(FrameDetections(i * 0.5, tuple(Detection((x, y, x + 30, y + 70), "person", 0.8, None,
                                                            e[k] if dim else None) for k, (x, y) in enumerate(p))))
    return out


def cost(kinds: list[str], repeats: int, n: int = 50, frames: int = 120) -> list[dict]:
    lines = (LineConfig("a", ((300.0, 0.0), (300.0, 576.0))), LineConfig("b", ((0.0, 300.0), (768.0, 300.0))),
             LineConfig("c", ((100.0, 100.0), (600.0, 500.0))))
    zones = (ZoneConfig("z1", ((0.0, 0.0), (300.0, 0.0), (300.0, 300.0), (0.0, 300.0)), dwell_s=5.0),
             ZoneConfig("z2", ((400.0, 300.0), (768.0, 300.0), (768.0, 576.0), (400.0, 576.0))))
    out = []
    for name, (kind, extra) in setups(kinds).items():
        seq = walkers(n, frames, dim=EMBED_DIM if kind == "appearance" else 0)
        per_frame = []
        for _ in range(repeats):
            tracker = StreamTracker(TrackingConfig(tracker=kind, **extra), 2.0, TrackIds("c"))  # match: diou
            rules = SceneRules(lines, zones)
            t0 = time.perf_counter()
            for f in seq:
                result, tracked = tracker.track(DetectionResult((f,)))
                tf = tracked[0]
                if tf.ended:
                    rules.end([tid for tid, _ in tf.ended], tf.ts)
                rules.update(tf.ts, [TrackPoint(d.track_id, d.cls, d.box) for d in tf.detections if d.track_id])
            per_frame.append((time.perf_counter() - t0) / frames * 1000)
        out.append({"tracker": name, "objects": n, "lines": 3, "zones": 2, "ms_per_frame": round(
            statistics.median(per_frame), 3), "repeats_ms": [round(x, 3) for x in per_frame]})
        print(f"  cost {name:26s}: {statistics.median(per_frame):.2f} ms per frame at {n} objects", flush=True)
    return out


def embedding_cost(repeats: int, n: int = 50, side: int = 336) -> dict:
    """Pooling n boxes' embeddings on one frame (what the engine adds per tracked frame), against that frame's
    backbone forward in torch fp32, medians over repeats, on this machine's threads."""
    import torch

    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.backends.torch_eager import lower, upper
    from vlora_va.engine.heads.appearance import appearance_embeddings

    model = load_backbone("dinov2-small")
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(1, 3, side, side, generator=g)
    grid = torch.randn(model.config.hidden_size, side // 14, side // 14, generator=g)
    xy = torch.rand(n, 2, generator=g) * (side - 40)
    boxes = torch.cat([xy, xy + torch.tensor([14.0, 34.0])], 1)
    pool, forward = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            appearance_embeddings(grid, pixels[0], boxes, side)
            pool.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            upper(model, lower(model, pixels, 0), 0)
            forward.append((time.perf_counter() - t0) * 1000)
    p, f = statistics.median(pool), statistics.median(forward)
    print(f"  embeddings of {n} boxes: {p:.2f} ms; one {side}-px forward (torch fp32): {f:.1f} ms", flush=True)
    return {"boxes": n, "image_size": side, "pool_ms": round(p, 3), "forward_ms": round(f, 1),
            "share_of_forward": round(p / f, 4), "threads": torch.get_num_threads()}


def table(doc: dict) -> str:
    rows = ["| tracker | match | rate (frames scored) | IDF1 | MOTA | ID switches (per 10 ids) | tracks / true ids "
            "| worst count error |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for a in doc["accuracy"]:
        rows.append(f"| {a['tracker']} | {a['match']} | {a['rate']} ({a['scored_frames']}) | {a['idf1']:.3f} | "
                    f"{a['mota']:.3f} | {a['id_switches']} ({a['switches_per_10_ids']}) | {a['pred_ids']} / "
                    f"{a['gt_ids']} | {a['worst_count_error']} |")
    if doc.get("views"):
        rows += ["", "The same range re-shot through the held-out views (identity boxes carried through the same "
                 "transform):", "", "| view | tracker | rate | IDF1 | MOTA | ID switches | tracks / true ids |",
                 "|---|---|---|---:|---:|---:|---:|"]
        rows += [f"| {v['view']} | {v['tracker']} | {v['rate']} | {v['idf1']:.3f} | {v['mota']:.3f} | "
                 f"{v['id_switches']} | {v['pred_ids']} / {v['gt_ids']} |" for v in doc["views"]]
    rows += ["", "| tracker | tracker + rules, ms per frame at 50 objects (median) |", "|---|---:|"]
    rows += [f"| {c['tracker']} | {c['ms_per_frame']:.2f} |" for c in doc["cost"]]
    e = doc.get("embedding_cost")
    if e:
        rows += ["", f"Embeddings of {e['boxes']} boxes on a {e['image_size']}-px frame: {e['pool_ms']:.2f} ms "
                 f"(median), {100 * e['share_of_forward']:.1f}% of that frame's backbone forward in torch fp32 "
                 f"({e['forward_ms']:.0f} ms, {e['threads']} threads)."]
    lines = ["", "Line counts (in / out) at 2 fps with diou (what pipelines.yaml runs) vs by hand:", ""]
    for a in doc["accuracy"]:
        if a["rate"] == "2 fps" and a["match"] == "diou":
            lines.append(f"- {a['tracker']}: " + ", ".join(
                f"{n} {c['in']}/{c['out']} (hand {a['hand_counts'][n]['in']}/{a['hand_counts'][n]['out']})"
                for n, c in a["counts"].items()))
    return "\n".join([f"Tracking on pedestrians.mp4 55-79.5 s ({doc['cpu']}, {doc['date']})", "", *rows, *lines, ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trackers", default="appearance,bytetrack,sort,ocsort")
    ap.add_argument("--views", action="store_true", help="also score the held-out views (slow the first time)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--adapter", default=str(ROOT / "adapters" / "detect"))
    args = ap.parse_args()
    kinds = args.trackers.split(",")
    print("detections (the detect adapter, every frame)...", flush=True)
    dets = detections(Path(args.adapter))
    print("embeddings (every box, every frame)...", flush=True)
    emb = embed(read_frames(VIDEO, START, END + 0.05), dets["frames"])
    doc = {"cpu": cpu_name(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "ground_truth": "adapters/eval/human-v1-tracks.json", "accuracy": accuracy(dets, emb, kinds),
           "views": views_accuracy(Path(args.adapter), kinds) if args.views else [],
           "cost": cost(kinds, args.repeats), "embedding_cost": embedding_cost(max(args.repeats, 20))}
    OUT.mkdir(exist_ok=True)
    (OUT / "tracking.json").write_text(json.dumps(doc, indent=1))
    (OUT / "tracking.md").write_text(table(doc))
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
