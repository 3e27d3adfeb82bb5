"""What event snapshots cost: ingest encoding each tracked frame as a JPEG at source resolution (up to 1280 px wide),
the bytes that adds to a chunk message, and the daemon drawing the box and writing one when an event happens.

Real frames of the sample videos (pedestrians.mp4 768 x 576, bikes.mp4 640 x 272) and one scaled up to
1920 x 1080 (what a 1080p camera costs: scaled down to 1280 wide before encoding). Median over repeats, one thread
(as ingest's stream threads run OpenCV).

    python bench/snapshots.py [--repeats 50]

Writes bench/results/snapshots.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import cv2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.analytics.snapshots import SnapshotStore  # noqa: E402
from vlora_va.contracts.scene import SnapshotConfig  # noqa: E402
from vlora_va.ingest.chunker import encode_snapshot  # noqa: E402
from vlora_va.ingest.source import FrameSource  # noqa: E402


def frame(video: str):
    return next(iter(FrameSource(str(ROOT / "sample_videos" / video), fps=10))).to_rgb()


def timed(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    cv2.setNumThreads(1)
    cfg = SnapshotConfig()
    ped = frame("pedestrians.mp4")
    sources = {"pedestrians 768x576": ped, "bikes 640x272": frame("bikes.mp4"),
               "1920x1080 (pedestrians scaled up)": cv2.resize(ped, (1920, 1080))}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(SnapshotConfig(dir=tmp))
        for name, rgb in sources.items():
            jpeg = encode_snapshot(rgb, cfg.max_width, cfg.quality)
            h, w = rgb.shape[:2]
            n = iter(range(10**9))
            rows.append({
                "source": name, "encode_ms": round(timed(lambda: encode_snapshot(rgb, cfg.max_width, cfg.quality),
                                                         args.repeats), 2),
                "jpeg_kb": round(len(jpeg) / 1024, 1),
                "event_write_ms": round(timed(lambda: store.save(f"e{next(n)}", jpeg, (100, 100, 200, 300), (w, h)),
                                              args.repeats), 2)})
    doc = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "quality": cfg.quality,
           "max_width": cfg.max_width, "rows": rows}
    out = ROOT / "bench" / "results"
    (out / "snapshots.json").write_text(json.dumps(doc, indent=1))
    md = [f"Snapshot cost ({doc['date']}, JPEG quality {cfg.quality}, max width {cfg.max_width}, one thread)", "",
          "| source | ingest: encode one tracked frame, ms | JPEG KB | daemon: draw + write one event's, ms |",
          "|---|---:|---:|---:|"]
    md += [f"| {r['source']} | {r['encode_ms']} | {r['jpeg_kb']} | {r['event_write_ms']} |" for r in rows]
    (out / "snapshots.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
