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

The float parts of an int8 model (softmax, norms, GELU, the attention NNCF leaves in float) compute in f32 or, where
the CPU has native bf16, in bf16: whichever ran this machine's calibrated models faster when `vlora-va models
calibrate` timed both (`write_hint`; bf16 only when at least BF16_MARGIN faster, f32 being the more accurate). The
matmuls are int8 either way, and which wins depends on the CPU, the image size and the batch: on a 2-core EPYC
with avx512_bf16, the plain backbone's int8 took 23.1 ms per image with f32 parts and 24.9 with bf16 at 224 px,
batch 8, while bf16 was 3-10% faster at 336 px and at batch 4 (2026-11-27); on CPUs whose bf16 runs on AMX the
float attention may gain more. So calibration times both at the pipeline's own batches. The daemon reads the
recorded choice (`read_hint`; f32 where none was measured for this CPU, OpenVINO version and thread count), so it
never changes between starts. A detection head, a float model of its own, computes in bf16 where the CPU has it
(`head_hint`). The gate is keyed by both hints (`gate_name`).
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


HINT_FILE = "float-hint.json"  # in the int8 folder: the float hint measured on this machine (`write_hint`)
BF16_MARGIN = 0.03  # bf16 float parts only when at least this much faster than f32 (f32 is the more accurate)
HINT_OVERRIDE: str | None = None  # force the float hint (bench, tests); None: the one measured here


def float_hints(native_bf16: bool) -> tuple[str, ...]:
    """The INFERENCE_PRECISION_HINTs an int8 model's float parts may run in on this CPU."""
    return ("f32", "bf16") if native_bf16 else ("f32",)


def hint_key(cpu: str, openvino: str, threads: int) -> dict:
    """What a measured float hint depends on: the CPU (model and vector capability), OpenVINO, the threads."""
    return {"format": FORMAT, "cpu": cpu, "openvino": openvino, "threads": threads}


def read_hint(directory: Path, key: dict) -> str:
    """The float hint the daemon uses: HINT_OVERRIDE when set, else the one measured for `key`, else f32."""
    return HINT_OVERRIDE or recorded_hint(directory, key) or "f32"


def recorded_hint(directory: Path, key: dict) -> str | None:
    """The float hint measured here for `key` (None: none was, or for another CPU, OpenVINO or thread count)."""
    try:
        record = json.loads((directory / HINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    hint = record.get("hint") if isinstance(record, dict) and record.get("key") == key else None
    return hint if hint in ("f32", "bf16") else None


def write_hint(directory: Path, key: dict, seconds: dict[str, float], batches: dict | None = None) -> str:
    """Record the faster float hint of `seconds` (hint -> the same work's time, at `batches`: image size -> batch)
    for `key`; returns it."""
    hint = "bf16" if "bf16" in seconds and seconds["bf16"] <= (1 - BF16_MARGIN) * seconds["f32"] else "f32"
    directory.mkdir(parents=True, exist_ok=True)
    _write_record(directory / HINT_FILE, key, {"hint": hint, "seconds": {h: round(t, 4) for h, t in seconds.items()},
                                               "batches": batches or {}, "margin": BF16_MARGIN})
    return hint


def _write_record(path: Path, key: dict, fields: dict) -> None:
    """A JSON record of `key` and `fields`, written whole or not at all (a temporary file, then a rename): a reader
    never sees half of one."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, **fields, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1))
    tmp.rename(path)


def head_hint(native_bf16: bool) -> str:
    """INFERENCE_PRECISION_HINT for a detection head under int8 (a float model: its convolutions are most of its cost):
    bf16 where the CPU has it, half the time of f32 (the shipped detect head at 336 px, 2 images: 19.5 ms)."""
    return "bf16" if native_bf16 else "f32"


def overflow_fix(vnni: bool) -> bool:
    """Quantize weights to 7 bits (NNCF's overflow fix, every layer): without VNNI, 8-bit products summed in 16 bits
    saturate (u8 x s8 pairs through vpmaddubsw)."""
    return not vnni


def gate_name(native_bf16: bool, vnni: bool, hint: str) -> str:
    """The accuracy-gate entry that covers this CPU's openvino int8 with float parts at `hint`: the float hints (the
    backbone's, the detection head's) and the overflow fix all change what it computes."""
    head = "-bf16-head" if hint == "f32" and head_hint(native_bf16) == "bf16" else ""
    return f"openvino-int8-{hint}{head}" + ("-7bit" if overflow_fix(vnni) else "")


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
    _write_record(path.with_suffix(".json"), key, provenance)
    return path


def nncf_version() -> str | None:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("nncf")
    except Exception:  # not installed
        return None
