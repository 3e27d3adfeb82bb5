"""Frame filtering at ingest: the share of chunks whose frames stay at the camera, per threshold, task and video, and
what the filter costs per chunk. No model runs: this is ingest's side alone (what the daemon is spared).

    python bench/filtering.py [--thresholds 1,2,3,5,8] [--videos pedestrians,bikes,quiet]

Each video is decoded as ingest decodes it (10 fps, 1-s chunks, the daemon's 336-px letterbox) and chunked for two
tasks as the default pipeline runs them on the surveillance video: `activity` (8 frames) and `detect` (1 frame),
each with its own filter. Writes bench/results/filtering.json and filtering.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.contracts.config import StreamConfig, TaskConfig  # noqa: E402
from vlora_va.contracts.filtering import FilterConfig  # noqa: E402
from vlora_va.ingest.chunker import Chunker  # noqa: E402
from vlora_va.ingest.source import FrameSource  # noqa: E402
from vlora_va.testing.host import cpu_name  # noqa: E402

RESULTS = ROOT / "bench" / "results"
IMAGE = 336
TASKS = (("activity", 8), ("detect", 1))


def run(video: Path, threshold: float, refresh: int) -> dict:
    tasks = tuple(TaskConfig(name=n, adapter=n, frames_per_chunk=k, deadline_ms=2000.0,
                             filter=FilterConfig(threshold=threshold, refresh_chunks=refresh)) for n, k in TASKS)
    chunker = Chunker(StreamConfig(id="cam", source=str(video), fps=10.0, tasks=tasks), IMAGE)
    build_s = []
    for frame in FrameSource(str(video), 10.0):
        t0 = time.perf_counter()
        chunk = chunker.add(frame)
        if chunk is not None:
            build_s.append(time.perf_counter() - t0)
    out = {name: {"chunks": f.sent + f.reused, "reused": f.reused,
                  "reused_share": round(f.reused / max(1, f.sent + f.reused), 3)}
           for name, f in chunker.filters.items()}
    out["chunk_build_ms_median"] = round(statistics.median(build_s) * 1000, 2)
    return out


def filter_cost_us(repeats: int = 200) -> float:
    """One FrameFilter.decide on one 336-px frame (thumbnail + difference), median microseconds."""
    import numpy as np

    from vlora_va.ingest.filtering import FrameFilter

    f = FrameFilter(FilterConfig(threshold=1000.0, refresh_chunks=10**6))
    im = np.random.default_rng(0).integers(0, 255, (IMAGE, IMAGE, 3), dtype=np.uint8)
    f.decide(0, [im])
    times = []
    for seq in range(1, repeats):
        t0 = time.perf_counter()
        f.decide(seq, [im])
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e6, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thresholds", default="1,2,3,5,8")
    ap.add_argument("--videos", default="pedestrians,bikes,quiet")
    ap.add_argument("--refresh", type=int, default=10)
    args = ap.parse_args()
    thresholds = [float(x) for x in args.thresholds.split(",")]
    doc = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "refresh_chunks": args.refresh, "decide_us_per_336px_frame": filter_cost_us(), "runs": []}
    for name in args.videos.split(","):
        video = ROOT / "sample_videos" / f"{name}.mp4"
        if not video.is_file():
            print(f"skipping {name}: {video} not found", flush=True)
            continue
        for th in thresholds:
            r = {"video": name, "threshold": th, **run(video, th, args.refresh)}
            doc["runs"].append(r)
            print(json.dumps(r), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "filtering.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Frame filtering at ingest ({doc['cpu']}, {doc['date']})", "",
             f"Share of chunks whose frames stay at the camera (refresh every {args.refresh} chunks); "
             f"`FrameFilter.decide` costs {doc['decide_us_per_336px_frame']} µs per 336-px frame (median).", "",
             "| video | threshold | activity (8 frames) | detect (1 frame) | chunk build ms (median) |",
             "|---|---:|---:|---:|---:|"]
    for r in doc["runs"]:
        lines.append(f"| {r['video']} | {r['threshold']:g} | {r['activity']['reused_share']:.0%} | "
                     f"{r['detect']['reused_share']:.0%} | {r['chunk_build_ms_median']} |")
    (RESULTS / "filtering.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
