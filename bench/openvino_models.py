"""What the openvino backend's compiled models cost: build time and memory per precision, part, adapter and size.

    python bench/openvino_models.py                    # fp32, bf16 (where the CPU has it) and int8
    python bench/openvino_models.py --precisions int8

Each precision runs in a process of its own: an Engine on the openvino backend with the shipped adapters (int8:
their calibrated models, as `vlora-va models calibrate` made them; a part without one is said), then every model
the daemon's warm-up compiles, one at a time, as serving asks for them: per adapter at its image size, the shared
lower part (once per size and cut), the adapter's upper part, and its detection head. Per model: seconds to build
it (float: traced from the torch modules and compiled; int8: the calibrated IR read and compiled), and the
process's resident memory after it less before (VmRSS, after a garbage collection). The compile cache
(`CACHE_DIR`) is pointed at an empty folder, so every compile is a first one. Writes
bench/results/openvino_models.json and .md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.testing.host import rss_mb  # noqa: E402

ADAPTERS = ("detect", "actions", "actions-persons")
IMAGE_SIZE = 336  # pipelines.yaml daemon.image_size


def measure(precision: str) -> dict:
    """One precision, in this process (the child)."""
    import torch

    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.executor import Engine

    torch.set_num_threads(2)
    adapters = {n: load_adapter_dir(n, ROOT / "adapters" / n, 384) for n in ADAPTERS}
    t0 = time.perf_counter()
    engine = Engine(load_backbone("dinov2-small"), adapters, IMAGE_SIZE, premerge_max_mb=4096, precision=precision,
                    backend="openvino")
    be = engine.backend
    out = {"precision": precision, "engine_s": round(time.perf_counter() - t0, 1), "engine_rss_mb": round(rss_mb()),
           "models": []}
    for name in ADAPTERS:
        slot, size, head = engine.slots[name], engine.sizes[name], engine.adapters[name].head
        split = be.split([slot])
        for part, build in (("lower", lambda: be.lower_model(size, split)),
                            ("upper", lambda: be.upper_model(slot, size, split)),
                            ("head", lambda: be.head_forward(slot, head, size))):
            if part == "lower" and (size, split) in be._lower:
                continue  # shared: built for an earlier adapter at this size
            gc.collect()
            before, t = rss_mb(), time.perf_counter()
            if build() is None:
                continue  # no compiled head (an action head stays a torch module)
            seconds = time.perf_counter() - t
            gc.collect()
            out["models"].append({"part": part, "adapter": None if part == "lower" else name, "size": size,
                                  "split": split, "seconds": round(seconds, 2), "rss_mb": round(rss_mb() - before, 1)})
    out["uncalibrated"] = list(be.uncalibrated)
    out["total_rss_mb"] = round(rss_mb())
    return out


def markdown(res: dict) -> str:
    lines = [f"# OpenVINO backend: what each compiled model costs ({res['created']})", "",
             f"CPU: {res['cpu']}, OpenVINO {res['openvino']}, 2 threads, an empty compile cache. `seconds`: build "
             "(float: trace + compile; int8: read the calibrated IR + compile); `memory`: resident memory after less "
             "before (VmRSS).", "",
             "| precision | part | adapter | size | blocks | seconds | memory MB |", "|---|---|---|---:|---|---:|---:|"]
    for r in res["runs"]:
        for m in r["models"]:
            blocks = f"0-{m['split']}" if m["part"] == "lower" else (f"{m['split']}-12" if m["part"] == "upper" else "")
            lines.append(f"| {r['precision']} | {m['part']} | {m['adapter'] or 'shared'} | {m['size']} | {blocks} | "
                         f"{m['seconds']:.2f} | {m['rss_mb']:.1f} |")
    lines += ["", "| precision | engine built (s) | memory with the engine (MB) | memory with every model (MB) | "
              "parts without a calibrated model |", "|---|---:|---:|---:|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['precision']} | {r['engine_s']} | {r['engine_rss_mb']} | {r['total_rss_mb']} | "
                     f"{', '.join(r['uncalibrated']) or 'none'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precisions", default="fp32,bf16,int8")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return 0
    import torch

    from vlora_va.engine.backends.openvino import import_openvino, int8_dir
    from vlora_va.engine.precision import Capabilities, device_name

    runs = []
    with tempfile.TemporaryDirectory() as cache:
        for p in args.precisions.split(","):
            if p == "bf16" and not Capabilities.detect("cpu").native_bf16:
                print("bf16: skipped (no native bf16 on this CPU)")
                continue
            env = {**os.environ, "VLORA_VA_OPENVINO_CACHE": str(Path(cache) / p)}
            if p == "int8":  # its calibrated models where the set-up put them; only the compile cache is fresh
                (Path(cache) / p).mkdir()
                (Path(cache) / p / "int8").symlink_to(int8_dir())
            done = subprocess.run([sys.executable, __file__, "--child", p], env=env, capture_output=True, text=True)
            if done.returncode:
                print(done.stderr[-3000:])
                return 1
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            for m in runs[-1]["models"]:
                print(f"{p:5s} {m['part']:5s} {m['adapter'] or 'shared':16s} {m['size']} px: {m['seconds']:5.2f} s, "
                      f"{m['rss_mb']:6.1f} MB", flush=True)
    res = {"created": time.strftime("%Y-%m-%d %H:%M"), "cpu": device_name(torch.device("cpu")),
           "openvino": import_openvino().__version__, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "openvino_models.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / "openvino_models.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
