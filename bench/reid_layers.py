"""Which tokens tell people apart: the appearance embedding's layer, bands and colours, on the hand-made identities.

Every person box of the identity ground truth (adapters/eval/human-v1-tracks.json: 9 people, 49 frames of
sample_videos/pedestrians.mp4 55.0-79.0 s, every 0.5 s) is embedded as the engine would embed it
(vlora_va.engine.heads.appearance), from the backbone with the shipped `detect` adapter merged (its LoRA is on
blocks 8-11, so blocks before 8 are the plain backbone's) at 336 px:

- tokens entering block 4, 6, 8, 10, and the last layer (after the final norm: what the heads read), pooled in one
  band or in two (top and bottom);
- the colour histogram of the model input in the box (two bands), alone and with the block-8 tokens.

For each, on pairs of boxes:
- rank-1: for a box, is the most similar box of the next listed frame (0.5 s later) the same person;
- AUC near: same person 0.5 s apart against another person within 100 px in the same or next frame (what a
  tracker must tell apart at 2 fps);
- AUC far: same person against another person, 3-30 s apart (what re-entry must tell apart).

    python bench/reid_layers.py

Writes bench/results/reid_layers.json and .md.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.engine.adapters import load_adapter_dir  # noqa: E402
from vlora_va.engine.backends.torch_eager import lower, upper  # noqa: E402
from vlora_va.engine.heads.appearance import box_embeddings, colour_histograms  # noqa: E402
from vlora_va.engine.heads.features import token_grid  # noqa: E402
from vlora_va.testing.host import cpu_name  # noqa: E402
from vlora_va.training.evaluate import merged_backbone  # noqa: E402
from vlora_va.training.frames import letterboxed_batch, read_frames  # noqa: E402
from vlora_va.training.track_metrics import identity_truth  # noqa: E402

VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"
SIDE = 336
LAYERS = (4, 6, 8, 10, "last")
OUT = ROOT / "bench" / "results"


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a same-person pair is more similar than an other-person pair), ties half (Mann-Whitney)."""
    both = np.concatenate([pos, neg])
    ranks = both.argsort().argsort() + 1.0
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def score(times: np.ndarray, ids: np.ndarray, centres: np.ndarray, emb: np.ndarray) -> dict:
    sim = emb @ emb.T
    dt = np.abs(times[:, None] - times[None, :])
    dist = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    same = ids[:, None] == ids[None, :]
    next_frame = np.abs(times[None, :] - times[:, None] - 0.5) < 1e-6
    rank1 = []
    for a in range(len(times)):
        cand = np.where(next_frame[a])[0]
        if len(cand) > 1 and same[a, cand].any():
            rank1.append(bool(same[a, cand[sim[a, cand].argmax()]]))
    near_same = sim[(np.abs(dt - 0.5) < 1e-6) & same]
    near_other = sim[(dt < 0.6) & ~same & (dist < 100)]
    far = (dt > 3) & (dt < 30)
    return {"rank1_next_frame": round(float(np.mean(rank1)), 3), "auc_near": round(auc(near_same, near_other), 3),
            "auc_far": round(auc(sim[far & same], sim[far & ~same]), 3)}


def main() -> int:
    truth = identity_truth()
    adapter = load_adapter_dir("detect", ROOT / "adapters" / "detect", 384)
    model = merged_backbone("dinov2-small", adapter)
    frames = [f for f in read_frames(VIDEO, 55.0, 79.05) if any(abs(f.t - t) < 1e-6 for t in truth.gt)]
    keys = {k: [] for k in [*(f"tokens {l}, {p} band{'s' if p > 1 else ''}" for l in LAYERS for p in (1, 2)),
                            "colours, 2 bands", "tokens 8 + colours (the engine's)"]}
    times, ids, centres = [], [], []
    with torch.inference_mode():
        for i in range(0, len(frames), 8):
            batch = frames[i:i + 8]
            pixels, lbs = letterboxed_batch(batch, SIDE)
            grids = {l: token_grid(lower(model, pixels, l), SIDE, 14) for l in LAYERS if l != "last"}
            grids["last"] = token_grid(upper(model, lower(model, pixels, 0), 0), SIDE, 14)
            for j, f in enumerate(batch):
                t = min(truth.gt, key=lambda u: abs(u - f.t))
                if not truth.gt[t]:
                    continue
                mb = torch.tensor([lbs[j].box_to_model(box) for _, box in truth.gt[t]], dtype=torch.float32)
                for layer, grid in grids.items():
                    for parts in (1, 2):
                        name = f"tokens {layer}, {parts} band{'s' if parts > 1 else ''}"
                        keys[name].append(box_embeddings(grid[j], mb, SIDE, parts).float().numpy())
                colours = colour_histograms(pixels[j], mb).numpy()
                keys["colours, 2 bands"].append(colours)
                tokens8 = box_embeddings(grids[8][j], mb, SIDE).float().numpy()
                keys["tokens 8 + colours (the engine's)"].append(np.concatenate(
                    [np.sqrt(0.5) * tokens8, np.sqrt(0.5) * colours], 1))
                for gid, box in truth.gt[t]:
                    times.append(t)
                    ids.append(gid)
                    centres.append(((box[0] + box[2]) / 2, (box[1] + box[3]) / 2))
    times, ids, centres = np.array(times), np.array(ids), np.array(centres)
    rows = []
    for name, parts in keys.items():
        rows.append({"embedding": name, **score(times, ids, centres, np.concatenate(parts))})
        print(f"  {name:36s} {rows[-1]}", flush=True)
    doc = {"cpu": cpu_name(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "boxes": int(len(times)), "identities": int(len(set(ids.tolist()))), "rows": rows}
    OUT.mkdir(exist_ok=True)
    (OUT / "reid_layers.json").write_text(json.dumps(doc, indent=1))
    md = [f"Appearance embeddings on the hand-made identities ({doc['boxes']} person boxes, {doc['identities']} "
          f"people; {doc['cpu']}, {doc['date']})", "",
          "| embedding | rank-1, next frame | AUC near (< 100 px, 0.5 s) | AUC far (3-30 s) |", "|---|---:|---:|---:|"]
    md += [f"| {r['embedding']} | {r['rank1_next_frame']:.3f} | {r['auc_near']:.3f} | {r['auc_far']:.3f} |"
           for r in rows]
    (OUT / "reid_layers.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
