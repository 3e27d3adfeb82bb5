"""Cost of the line and zone rules (issue 29): SceneRules.update per frame at 50 confirmed tracks, 3 lines, 2 zones.

The tracks random-walk over a 1280x720 frame at 5 fps (about 2 px per frame on average, so many sit near a line or
a zone edge at some point), a few end each frame and new ones start (SceneRules.end is timed with the update, as
the daemon calls both per frame). Every repeat replays the same frames on a fresh SceneRules; the figure is the
median over repeats of the mean time per frame, with the spread of single frames alongside. Goal: well under
0.5 ms per frame (tracker + rules <= 1 ms).

    python bench/rules.py [--tracks 50] [--frames 600] [--repeats 9] [--out bench/results/rules.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.analytics.rules import SceneRules, TrackPoint
from vlora_va.contracts.scene import LineConfig, ZoneConfig

W, H, DT = 1280.0, 720.0, 0.2
LINES = (LineConfig("door", ((640.0, 0.0), (640.0, 720.0))),
         LineConfig("path", ((100.0, 500.0), (1180.0, 300.0))),
         LineConfig("gate", ((200.0, 150.0), (500.0, 150.0))))
ZONES = (ZoneConfig("lawn", ((100.0, 400.0), (600.0, 380.0), (650.0, 700.0), (80.0, 690.0)), dwell_s=5.0),
         ZoneConfig("yard", ((700.0, 50.0), (1200.0, 50.0), (1200.0, 350.0), (950.0, 200.0), (700.0, 350.0)),
                    dwell_s=10.0))


def frames(n_tracks: int, n_frames: int, seed: int = 1) -> list[tuple[float, list[TrackPoint], list[str]]]:
    """(ts, confirmed tracks, ids ended this frame) per frame: random walks, ~1% of tracks replaced per frame."""
    rng = random.Random(seed)
    pos, next_id, out = {}, 0, []
    for _ in range(n_tracks):
        pos[f"t{next_id}"] = [rng.uniform(0, W), rng.uniform(0, H), rng.gauss(0, 2), rng.gauss(0, 2)]
        next_id += 1
    for f in range(n_frames):
        ended = [tid for tid in pos if rng.random() < 0.01]
        for tid in ended:
            del pos[tid]
            pos[f"t{next_id}"] = [rng.uniform(0, W), rng.uniform(0, H), rng.gauss(0, 2), rng.gauss(0, 2)]
            next_id += 1
        tracks = []
        for tid, p in pos.items():
            p[2] += rng.gauss(0, 0.5)
            p[3] += rng.gauss(0, 0.5)
            p[0] = min(W, max(0.0, p[0] + p[2]))
            p[1] = min(H, max(0.0, p[1] + p[3]))
            cls = "person" if int(tid[1:]) % 4 else "car"
            tracks.append(TrackPoint(tid, cls, (p[0] - 15, p[1] - 60, p[0] + 15, p[1])))
        out.append((f * DT, tracks, ended))
    return out


def run_once(data) -> tuple[list[float], int]:
    """Seconds per frame (end + update), and the hits made."""
    rules, times, hits = SceneRules(LINES, ZONES), [], 0
    for ts, tracks, ended in data:
        t0 = time.perf_counter()
        h = rules.end(ended, ts)
        h += rules.update(ts, tracks)
        times.append(time.perf_counter() - t0)
        hits += len(h)
    return times, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracks", type=int, default=50)
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rules.json"))
    args = ap.parse_args()
    data = frames(args.tracks, args.frames)
    run_once(data)  # warm-up
    means, singles, hits = [], [], 0
    for _ in range(args.repeats):
        times, hits = run_once(data)
        means.append(statistics.fmean(times))
        singles += times
    singles.sort()
    result = {
        "what": "SceneRules.end + update per frame",
        "tracks": args.tracks, "lines": len(LINES), "zones": len(ZONES), "frames": args.frames,
        "repeats": args.repeats, "hits_per_run": hits,
        "ms_per_frame_median": round(statistics.median(means) * 1e3, 4),
        "ms_per_frame_p50_single": round(singles[len(singles) // 2] * 1e3, 4),
        "ms_per_frame_p99_single": round(singles[int(len(singles) * 0.99)] * 1e3, 4),
        "goal_ms": 0.5,
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "system": platform.platform()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
