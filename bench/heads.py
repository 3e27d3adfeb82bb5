"""Head cost: each task head's serving variants on the same backbone features, at 336 px (ViT-S, 24×24 patches).

    detection, per image   the patch grid upsampled ×2 (before 2026-11-23) vs ×4 vs ×4 with the 32-channel detail
                           branch (the shipped `detect`): the ×4 head adds a second ×2 step and a 3×3 convolution
                           at half width on 96×96 cells; the detail branch three small convolutions on the image
    activity, per clip     `actions-persons`' head (4 frames, local 3-D convolution, persons branch) without vs
                           with `boxes: 4` (a person detection head on the clip's two middle frames), with its
                           detail branch, and with `activity_from: track` (the shipped head: the person head on all
                           4 frames, so each person's boxes can be followed through the clip)

Each pair times the heads' forward on the same random features in interleaved rounds (both see the same load;
decoding is not included), reports medians per unit and the ratio to the first, and what each difference adds to a second of
video: the default pipeline's 2 detect frames, or one `actions-persons` clip. Writes bench/results/heads.{json,md}.

    python bench/heads.py [--rounds 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from vlora_va.engine.heads import ActionHead, DetectionHead, Features

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, GRID, SIDE = 384, 24, 336
ACTIVITIES = ["no_person", "standing", "walking_away", "walking_left", "walking_right", "walking_toward"]
CLIP = 4  # frames per actions-persons clip


def features(n: int) -> Features:
    return Features(torch.zeros(n, HIDDEN), torch.randn(n, HIDDEN, GRID, GRID), torch.randn(n, 3, SIDE, SIDE))


def pairs() -> list[dict]:
    """(name, unit, per second of video, {variant: (head, its forward)})."""
    det_feats, clip_feats = features(2), features(CLIP)
    det = {label: DetectionHead(HIDDEN, ["person", "car", "truck"], image_size=SIDE, upsample=up, detail=detail).eval()
           for label, up, detail in (("×2", 2, 0), ("×4", 4, 0), ("×4 + detail 32", 4, 32))}
    act = {label: ActionHead(HIDDEN, ACTIVITIES, width=16, motion=True, spatial="local", persons=True, image_size=SIDE,
                             boxes=boxes, detail=detail, activity_from=source).eval()
           for label, boxes, detail, source in (("persons branch", 0, 0, "maps"), ("+ boxes: 4", 4, 0, "maps"),
                                                ("+ boxes: 4 + detail 32", 4, 32, "maps"),
                                                ("+ boxes: 4 + detail 32, activity_from track", 4, 32, "track"))}
    return [{"name": "detection", "unit": "image", "per_second": 2, "batch": 2,
             "variants": {k: (lambda h=h: h(det_feats)) for k, h in det.items()}},
            {"name": "activity (actions-persons)", "unit": "4-frame clip", "per_second": 1, "batch": 1,
             "variants": {k: (lambda h=h: h(clip_feats, CLIP)) for k, h in act.items()}}]


def time_pair(variants: dict, rounds: int, batch: int) -> dict[str, float]:
    """Median ms per unit of each variant over interleaved rounds."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    with torch.no_grad():
        for _ in range(3):  # warm-up
            for run in variants.values():
                run()
        for _ in range(rounds):
            for k, run in variants.items():
                t = time.perf_counter()
                run()
                times[k].append((time.perf_counter() - t) / batch)
    return {k: statistics.median(ts) * 1000 for k, ts in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    created = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = {"created": created, "threads": args.threads, "rounds": args.rounds, "heads": []}
    md = ["# Head cost at 336 px (ViT-S features)", "",
          f"{args.threads} threads, medians of {args.rounds} interleaved rounds, forward only ({created}).", "",
          "| head | variant | ms per unit | × the first | added per second of video |", "|---|---|---:|---:|---:|"]
    for pair in pairs():
        med = time_pair(pair["variants"], args.rounds, pair["batch"])
        first = next(iter(med.values()))
        extra = {k: (v - first) * pair["per_second"] for k, v in med.items()}
        result["heads"].append({"head": pair["name"], "unit": pair["unit"],
                                "ms_per_unit": {k: round(v, 2) for k, v in med.items()},
                                "ratio": {k: round(v / first, 2) for k, v in med.items()},
                                "extra_ms_per_second": {k: round(v, 1) for k, v in extra.items()}})
        for i, (k, v) in enumerate(med.items()):
            md.append(f"| {pair['name']}, per {pair['unit']} | {k} | {v:.1f} | {v / first:.2f} | "
                      + (f"+{extra[k]:.0f} ms ({pair['per_second']} {pair['unit']}/s)" if i else "") + " |")
    md += ["", "Detection: the default pipeline sends 2 detect frames per second of video; activity: one "
           "`actions-persons` clip per second of a stream."]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "heads.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "heads.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
