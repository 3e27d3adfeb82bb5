"""Seeded synthetic tracking scenarios for the tracking-metric tests (pure Python, so that the same seed gives the
same scenario under any numpy, including in a separate environment that runs TrackEval on it).

A scenario has people walking in straight lines who enter and leave, and a tracker's output with misses, whole
frames without output, jittered and badly placed boxes, new track ids (fragments), swapped ids, false boxes, and
ignore regions (a person hidden for a frame) that the tracker sometimes still reports.
"""

from __future__ import annotations

import random


def _jitter(rng: random.Random, box: list[float], px: float) -> list[float]:
    x1, y1, x2, y2 = (v + rng.uniform(-px, px) for v in box)
    return [x1, y1, max(x2, x1 + 5), max(y2, y1 + 5)]


def scenario(seed: int, n_objects: int = 8, n_frames: int = 60):
    """(gt, pred, ignore): {t: [(id, [x1, y1, x2, y2])]}, {t: [(track, box)]}, {t: [box]} on a 0.1-s grid."""
    rng = random.Random(seed)
    people = []
    for i in range(n_objects):
        start = rng.randrange(0, n_frames // 2)
        people.append({
            "id": i + 1, "start": start, "end": rng.randrange(start + 5, n_frames + 1),
            "x": rng.uniform(0, 400), "y": rng.uniform(100, 300), "vx": rng.uniform(-8, 8), "vy": rng.uniform(-2, 2),
            "w": rng.uniform(20, 40), "h": rng.uniform(50, 100),
        })
    label = {p["id"]: f"track-{p['id']}" for p in people}
    fresh = n_objects
    gt, pred, ignore = {}, {}, {}
    for k in range(n_frames):
        t = round(55 + 0.1 * k, 1)
        gt[t], pred[t], ignore[t] = [], [], []
        here = [p for p in people if p["start"] <= k < p["end"]]
        # The tracker's identity mistakes happen between frames: a new id for someone, or two people swapped.
        for p in here:
            if rng.random() < 0.03:
                fresh += 1
                label[p["id"]] = f"track-{fresh}"
        if len(here) >= 2 and rng.random() < 0.05:
            a, b = rng.sample(here, 2)
            label[a["id"]], label[b["id"]] = label[b["id"]], label[a["id"]]
        no_output = rng.random() < 0.05
        for p in here:
            dt = k - p["start"]
            box = [p["x"] + p["vx"] * dt, p["y"] + p["vy"] * dt]
            box += [box[0] + p["w"], box[1] + p["h"]]
            if rng.random() < 0.08:  # hidden this frame: an ignore region, which the tracker may still report
                ignore[t].append(box)
                if not no_output and rng.random() < 0.5:
                    pred[t].append((label[p["id"]], _jitter(rng, box, 3)))
                continue
            gt[t].append((p["id"], box))
            if no_output or rng.random() < 0.1:
                continue
            pred[t].append((label[p["id"]], _jitter(rng, box, 2 if rng.random() < 0.9 else 14)))
        if not no_output and rng.random() < 0.3:
            x, y = rng.uniform(0, 450), rng.uniform(80, 320)
            pred[t].append((f"false-{k}", [x, y, x + rng.uniform(15, 40), y + rng.uniform(40, 100)]))
    return gt, pred, ignore
