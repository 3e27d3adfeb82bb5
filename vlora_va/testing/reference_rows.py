"""Reference answers for tests and benchmarks that send real chunks: a detection adapter whose rows carry
detections, each task of a chunk computed alone by a fresh engine, and how far a daemon's row may differ from it."""

from __future__ import annotations

import time


def make_seeing_detector(path, seed: int = 3):
    """A detection adapter for the tiny test backbone (vlora_va/testing/tiny.py) whose untrained head fires:
    objectness prior ~27% instead of 1% and sharper logits, so its rows carry detections worth comparing."""
    import torch

    from vlora_va.engine.adapters import load_adapter_dir, save_adapter_dir
    from vlora_va.testing.tiny import make_adapter

    make_adapter(path, "detection", ["person", "car"], seed=seed)
    a = load_adapter_dir("seeing", path, 32)
    with torch.no_grad():
        a.head.cls_out.bias.fill_(-1.0)
        a.head.cls_out.weight.mul_(50.0)
        a.head.box_out.weight.mul_(50.0)
    save_adapter_dir(path, lora=a.lora, rank=a.rank, alpha=a.rank,
                     target_modules=sorted({m.rsplit(".", 1)[-1] for m in a.lora}), base_model="tiny", head=a.head,
                     head_config={k: v for k, v in a.head_config.items() if k not in ("format", "version")})
    return path


def reference_payloads(backbone_dir, adapter_dirs: dict, image_size: int, parts: list[bytes]) -> dict[str, dict]:
    """Each task of a chunk computed alone by a fresh engine, unmerged: what the daemon's rows must say."""
    from vlora_va.contracts.wire import decode_chunk
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.executor import Engine
    from vlora_va.engine.modes import UNMERGED, LoRAMode
    from vlora_va.serving.scheduling import make_plan

    backbone = load_backbone(str(backbone_dir))
    hidden = backbone.config.hidden_size
    engine = Engine(backbone, {n: load_adapter_dir(n, p, hidden) for n, p in adapter_dirs.items()}, image_size)
    reqs = decode_chunk(parts).requests(time.time())
    return {r.task: engine.execute(make_plan([r], LoRAMode(UNMERGED), engine.catalog()))[0].to_json()
            for r in reqs}


def payload_difference(got: dict, want: dict, score_tol: float = 2e-4, box_tol: float = 0.2) -> str | None:
    """None when a result row carries the reference payload (up to the rounding of batched float maths),
    else what differs. Activity rows: label and scores; detection rows: every frame's detections."""
    if "scores" in want:
        if got.get("label") != want["label"]:
            return f"label {got.get('label')!r} != {want['label']!r}"
        diff = {k: (got.get("scores", {}).get(k), v) for k, v in want["scores"].items()
                if got.get("scores", {}).get(k) is None or abs(got["scores"][k] - v) > score_tol}
        return f"scores differ: {diff}" if diff or set(got["scores"]) != set(want["scores"]) else None
    gf, wf = got.get("frames", []), want["frames"]
    if len(gf) != len(wf):
        return f"{len(gf)} frames != {len(wf)}"
    for i, (g, w) in enumerate(zip(gf, wf)):
        gd, wd = g["detections"], w["detections"]
        if [d["class"] for d in gd] != [d["class"] for d in wd]:
            return f"frame {i}: classes {[d['class'] for d in gd]} != {[d['class'] for d in wd]}"
        for a, b in zip(gd, wd):
            off = any(abs(x - y) > box_tol for x, y in zip(a["box"], b["box"]))
            if off or abs(a["score"] - b["score"]) > score_tol:
                return f"frame {i}: detection {a} != {b}"
    return None
