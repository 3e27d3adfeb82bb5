"""Detection head cost: the patch grid upsampled ×2 (before 2026-11-23) vs ×4 (the shipped `detect`), at 336 px.

The ×4 head adds a second ×2 step and one 3×3 convolution at half width on 96×96 cells. This times both heads'
forward on the same random patch-grid features (the backbone's output shape: ViT-S, 24×24 patches), batch 2 (the
default pipeline's detect frames per second), in interleaved rounds; reports medians per image and the ratio,
and what the difference adds to a second of the default pipeline. Writes bench/results/detection_head.{json,md}.

    python bench/detection_head.py [--rounds 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from vlora_va.heads import DetectionHead, Features

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["person", "car", "truck"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    feats = Features(torch.zeros(args.batch, 384), torch.randn(args.batch, 384, 24, 24))
    heads = {up: DetectionHead(384, CLASSES, image_size=336, upsample=up).eval() for up in (2, 4)}
    times: dict[int, list[float]] = {up: [] for up in heads}
    with torch.no_grad():
        for _ in range(3):  # warm-up
            for h in heads.values():
                h(feats)
        for _ in range(args.rounds):  # interleaved: both heads see the same load
            for up, h in heads.items():
                t = time.perf_counter()
                h(feats)
                times[up].append((time.perf_counter() - t) / args.batch)
    med = {up: statistics.median(ts) * 1000 for up, ts in times.items()}
    extra = (med[4] - med[2]) * 2  # default pipeline: 2 detect frames per second of video
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": args.threads, "batch": args.batch,
              "rounds": args.rounds, "ms_per_image": {f"x{up}": round(m, 2) for up, m in med.items()},
              "ratio_x4_over_x2": round(med[4] / med[2], 2), "extra_ms_per_second_of_default_pipeline": round(extra, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "detection_head.json").write_text(json.dumps(result, indent=1) + "\n")
    md = ["# Detection head: patch grid ×2 vs ×4 (336 px, ViT-S features)", "",
          f"{args.threads} threads, batch {args.batch}, medians of {args.rounds} interleaved rounds ({result['created']}).", "",
          "| head | ms per image | × the ×2 head |", "|---|---:|---:|",
          f"| ×2 (before) | {med[2]:.1f} | 1.00 |", f"| ×4 (shipped `detect`) | {med[4]:.1f} | {med[4] / med[2]:.2f} |", "",
          f"Two detect frames per second of the default pipeline: +{extra:.0f} ms of compute per second of video."]
    (args.out / "detection_head.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
