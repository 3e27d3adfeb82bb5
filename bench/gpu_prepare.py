"""What bench/gpu.py's correctness part needs on a GPU machine that has no model cache and no PyAV, made here on
the CPU (issue 31):

    python bench/gpu_prepare.py          # writes .gpu/ (about 34 MB; ignored by git)

- `.gpu/backbone.tar.xz`: the default backbone (DINOv2-S) as bfloat16 safetensors under the legacy layer names
  (the GPU machine's transformers 5.17 reads only those). bf16 halves it and xz takes a quarter off again, so it
  fits the 64 MiB a device call may carry, beside the repository.
- `.gpu/heldout.npz`: held-out frames of sample_videos/pedestrians.mp4 (55.5 s + 3 s steps: after the adapters'
  training span), letterboxed to the daemon's 336 px, with their times and letterbox.
- `.gpu/reference.json`: the CPU engine's rows for them in float32, from the SAME bf16-rounded weights, so the GPU
  comparison measures the GPU path (bf16 maths, graphs, device heads), not the weight rounding.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HELDOUT_TS = [55.5 + 3 * i for i in range(8)]
IMAGE_SIZE = 336
ADAPTERS = ("detect", "actions")


def bf16_backbone(work: Path) -> Path:
    """The default backbone, weights rounded to bf16 and layers named the legacy way, in work/backbone."""
    from safetensors.torch import load_file, save_file

    from vlora_va.engine.backbones import DEFAULT_BACKBONE, cache_dir, legacy_name

    src = cache_dir() / DEFAULT_BACKBONE
    if not (src / "model.safetensors").exists():
        raise SystemExit("the default backbone is not fetched: run `vlora-va models fetch`")
    out = work / "backbone"
    out.mkdir(parents=True, exist_ok=True)
    tensors = {legacy_name(k): v.to(torch.bfloat16).contiguous() for k, v in load_file(src / "model.safetensors").items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text((src / "config.json").read_text())
    return out


def heldout_frames() -> tuple[np.ndarray, list[float], list[float]]:
    import av

    from vlora_va.ingest.chunker import letterbox

    frames, ts, lb = [], [], None
    want = list(HELDOUT_TS)
    with av.open(str(ROOT / "sample_videos" / "pedestrians.mp4")) as c:
        s = c.streams.video[0]
        for f in c.decode(s):
            t = float(f.pts * s.time_base)
            if want and t >= want[0] - 1e-6:
                img, lb = letterbox(f.to_ndarray(format="rgb24"), IMAGE_SIZE)
                frames.append(img)
                ts.append(t)
                want.pop(0)
            if not want:
                break
    return np.stack(frames), ts, [lb.scale, lb.pad_x, lb.pad_y]


def reference_rows(backbone: Path, frames: np.ndarray, ts: list[float], lb: list[float]) -> list[dict]:
    """The CPU engine's rows (float32): one detection request per frame, one 8-frame activity request."""
    from vlora_va.contracts.geometry import Letterbox
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.executor import Engine
    from vlora_va.engine.modes import LoRAMode
    from vlora_va.serving.scheduling import make_plan

    model = load_backbone(str(backbone)).float()
    hidden = model.config.hidden_size
    ads = {n: load_adapter_dir(n, ROOT / "adapters" / n, hidden) for n in ADAPTERS}
    engine = Engine(model, ads, IMAGE_SIZE, device="cpu", dtype=torch.float32, max_batch_images=16)
    reqs = requests(list(frames), ts, Letterbox(*lb))
    return [p.to_json() for p in engine.execute(make_plan(reqs, LoRAMode("unmerged"), engine.catalog()))]


def requests(frames: list[np.ndarray], ts: list[float], lb) -> list:
    """The held-out requests, the same on both machines."""
    from vlora_va.contracts.requests import Request

    now = time.time()
    reqs = [Request("p", i, "detect", "detect", [f], [t], lb, (768, 576), now, now, now + 60)
            for i, (f, t) in enumerate(zip(frames, ts))]
    reqs.append(Request("p", 99, "activity", "actions", frames, ts, lb, (768, 576), now, now, now + 60))
    return reqs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/vlora-gpu-prepare")
    backbone = bf16_backbone(work)
    with tarfile.open(a.out / "backbone.tar.xz", "w:xz") as tar:
        tar.add(backbone, arcname="backbone")
    frames, ts, lb = heldout_frames()
    np.savez_compressed(a.out / "heldout.npz", frames=frames, ts=np.array(ts), letterbox=np.array(lb))
    rows = reference_rows(backbone, frames, ts, lb)
    (a.out / "reference.json").write_text(json.dumps({"image_size": IMAGE_SIZE, "rows": rows}))
    buf = io.StringIO()
    for p in sorted(a.out.iterdir()):
        buf.write(f"  {p.name}: {p.stat().st_size / 1e6:.1f} MB\n")
    print(f"wrote {a.out}:\n{buf.getvalue()}", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
