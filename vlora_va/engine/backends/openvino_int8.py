"""The openvino backend's int8: models quantized by NNCF post-training quantization, calibrated ahead of time and
cached as OpenVINO IR. The daemon only reads them; calibration (`vlora-va models calibrate`, training/calibrate.py)
is the only code that imports NNCF, so a host that serves needs `openvino` alone.

What a calibrated model is, and its key (`part_key`):

    lower   embeddings + blocks [0, split) of the base weights at one image size: one per backbone, size and split
    upper   blocks [split, L) + the final norm with one adapter's LoRA merged in: one per adapter, size and split

`split` is the first block ANY resident adapter puts LoRA on (`OpenVINOBackbone.split` over every slot, not the
batch's): a calibrated part must not depend on which adapters share a batch. The key also holds the OpenVINO version
and whether NNCF's overflow fix was applied: int8 sums saturate on CPUs without VNNI (AVX2, AVX-512 without VNNI),
so there every weight is quantized to 7 bits, and the accuracy gate is kept separately (`gate_name`).

The float parts of an int8 model (softmax, norms, the ops NNCF leaves in float) compute in the precision hint the
model is compiled with: bf16 where the CPU has it, else f32. Both are explicit, and the gate is keyed by it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what a cached model holds changes: older ones are then never read
SUBSET = 50  # calibration samples per model (the 50 frames; NNCF's default is 300)


def float_hint(native_bf16: bool) -> str:
    """INFERENCE_PRECISION_HINT for an int8 model's float parts."""
    return "bf16" if native_bf16 else "f32"


def overflow_fix(vnni: bool) -> bool:
    """Quantize weights to 7 bits (NNCF's overflow fix, every layer): without VNNI, 8-bit products summed in 16 bits
    saturate (u8 x s8 pairs through vpmaddubsw)."""
    return not vnni


def gate_name(native_bf16: bool, vnni: bool) -> str:
    """The accuracy-gate entry that covers this CPU's openvino int8: the float hint and the overflow fix both change
    what it computes."""
    return f"openvino-int8-{float_hint(native_bf16)}" + ("-7bit" if overflow_fix(vnni) else "")


def part_key(part: str, backbone: str, size: int, split: int, adapter: str | None, fix: bool,
             openvino: str) -> dict:
    """What one calibrated model depends on (part "lower": adapter None)."""
    return {"format": FORMAT, "part": part, "backbone": backbone, "size": size, "split": split,
            "adapter": adapter if part == "upper" else None, "overflow_fix": fix, "openvino": openvino}


def model_path(directory: Path, key: dict) -> Path:
    """Where the IR of `key` lives: NAME.xml (graph), NAME.bin (weights), NAME.json (key and provenance)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return directory / f"{key['part']}-{key['size']}px-{digest}.xml"


def cached(directory: Path, key: dict) -> Path | None:
    """The IR of `key` if it was calibrated (its provenance names the same key), else None."""
    path = model_path(directory, key)
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    ok = meta.get("key") == key and path.exists() and path.with_suffix(".bin").exists()
    return path if ok else None


def quantize(model, samples: list[np.ndarray], fix: bool):
    """NNCF post-training quantization of an OpenVINO float model: activation ranges from `samples` (each one
    model input, batch 1), SmoothQuant and the transformer ignored patterns (model_type TRANSFORMER), the overflow
    fix on every layer or none."""
    import nncf  # noqa: PLC0415 - calibration only; import_openvino ran first (no telemetry)
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix  # noqa: PLC0415

    os.environ.setdefault("NNCF_CI", "1")  # belt and braces: nncf's telemetry stays a stub
    params = AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE if fix else OverflowFix.DISABLE)
    return nncf.quantize(model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=len(samples), advanced_parameters=params)


def save(ov, model, directory: Path, key: dict, provenance: dict) -> Path:
    """Write the IR (weights as they are: int8 with float scales; no fp16 compression) and its key, atomically
    enough that a half-written model is never read (the .json is written last)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = model_path(directory, key)
    ov.save_model(model, str(path), compress_to_fp16=False)
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, **provenance, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1))
    tmp.rename(path.with_suffix(".json"))
    return path


def nncf_version() -> str | None:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("nncf")
    except Exception:  # not installed
        return None
