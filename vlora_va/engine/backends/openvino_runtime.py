"""OpenVINO on this machine, for the "openvino" backbone backend (backends/openvino.py): importing it without its
usage reporting, whether it runs here, its version, the precision hints, how a backbone part is converted and how
every model is compiled, and where compiled blobs and calibrated int8 models live."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from vlora_va.engine.backends import openvino_int8
from vlora_va.engine.backends.torch_eager import lower, upper
from vlora_va.engine.precision import device_name

# the backend's logger: what this says (old blobs deleted) is the openvino backend's, for log filters and tests
log = logging.getLogger("vlora_va.engine.backends.openvino")

HINTS = {"fp32": "f32", "bf16": "bf16"}  # engine precision -> OpenVINO's INFERENCE_PRECISION_HINT
PRECISIONS = (*HINTS, "int8")  # int8: NNCF-calibrated models, their float parts at `int8_hint()`


def int8_hint() -> str:
    """The hint an int8 model's float parts compute in on this machine: the faster one `vlora-va models calibrate`
    measured here (openvino_int8.read_hint), f32 where none was."""
    return openvino_int8.read_hint(int8_dir(), hint_key())


def hint_key() -> dict:
    return openvino_int8.hint_key(device_name(torch.device("cpu")), openvino_version(), torch.get_num_threads())


def import_openvino():
    """`import openvino`, without its usage reporting. Importing openvino sends an event to Google Analytics unless
    the user opted out (openvino/tools/ovc/__init__.py, via the openvino-telemetry package), and converting a model
    sends more; with that package unimportable, OpenVINO uses its own no-op stand-in. Every import of openvino in
    vlora-va goes through here, before anything else imports it."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # None: `import openvino_telemetry` raises ImportError
    import openvino

    return openvino


def openvino_problem() -> str | None:
    """Why OpenVINO cannot run on this machine (None: it can)."""
    try:
        ov = import_openvino()
        if "CPU" not in ov.Core().available_devices:
            return "OpenVINO sees no CPU device"
    except Exception as e:  # an ImportError, or a broken install failing in its own way
        return f"OpenVINO does not load: {type(e).__name__}: {e}"
    return None


def openvino_version() -> str:
    return import_openvino().__version__


def compile_config(precision: str) -> dict:
    """How every model here is compiled: the precision hint explicit (OpenVINO would run a float32 model in bf16 on
    a CPU with bf16), one stream of the engine's thread count (the daemon runs one batch at a time, and ingest
    shares the cores), its threads pinned to cores (OpenVINO's default on Linux, set so: unpinned, one second of the
    default pipeline's int8 work took 357-369 against 375 ms median, the same 408 ms at p90, with and without two
    cameras decoding beside it, 2-core EPYC, 2026-11-27: no difference beyond the noise)."""
    hint = int8_hint() if precision == "int8" else HINTS[precision]
    return {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": True}


def convert(module: nn.Module, example: torch.Tensor):
    """An OpenVINO model of `module` traced at `example`'s shape with a dynamic batch (float32, torch weights)."""
    ov = import_openvino()
    shape = ov.PartialShape([-1] + list(example.shape[1:]))
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # the tracer warns of every Python branch on a shape; with a static image size they are constants
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return ov.convert_model(module, example_input=example, input=[shape])


def int8_layers(compiled) -> tuple[int, int]:
    """(linear layers that run in 8 bits, all linear layers) of a compiled model, as the CPU plugin executes it."""
    kinds = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) == "FullyConnected":
            kinds.append(info["runtimePrecision"].astype(str))
    return sum(k in ("u8", "i8") for k in kinds), len(kinds)


def cache_dir() -> Path:
    """Where OpenVINO keeps compiled blobs ($VLORA_VA_OPENVINO_CACHE, else ~/.cache/vlora-va/openvino)."""
    return Path(os.environ.get("VLORA_VA_OPENVINO_CACHE", Path.home() / ".cache" / "vlora-va" / "openvino"))


def blob_dir(config: dict) -> Path:
    """Where OpenVINO caches the models compiled with `config`: a folder per precision hint and per ISA cap
    (ONEDNN_MAX_CPU_ISA, precision.AVX2_ENV). OpenVINO 2026.4's cache key leaves the hint out: with one folder, a model
    compiled at f32 was loaded again for a bf16 compile of the same graph, and on a Xeon with AMX that gave NaN
    features (tests/engine/test_openvino.py); a blob built under the AVX2 cap could likewise serve an uncapped run."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "native").lower()
    return cache_dir() / "blobs" / f"{config['INFERENCE_PRECISION_HINT']}-{isa}"


def forget_old_blobs() -> int:
    """Delete the blobs that versions before blob_dir left in the top cache folder (every hint mixed there, so they
    cannot be trusted, and nothing reads them now: about 300 MB after a default set-up). Returns how many."""
    gone = 0
    for blob in cache_dir().glob("*.blob"):
        with contextlib.suppress(OSError):  # another process may be deleting it too
            blob.unlink()
            gone += 1
    if gone:
        log.info("openvino: deleted %d compiled models cached by an earlier version in %s", gone, cache_dir())
    return gone


def int8_dir() -> Path:
    """Where calibrated int8 models live (IR; keyed by openvino_int8.part_key)."""
    return cache_dir() / "int8"


class BackbonePart(nn.Module):
    """One part of the backbone as a module OpenVINO can trace: lower (pixels -> hidden at split), upper (hidden at
    split -> last hidden state) or whole (pixels -> last hidden state)."""

    def __init__(self, backbone: nn.Module, split: int, part: str):
        super().__init__()
        self.backbone, self.split, self.part = backbone, split, part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.part == "lower":
            return lower(self.backbone, x, self.split)
        if self.part == "whole":
            return upper(self.backbone, lower(self.backbone, x, 0), 0)
        return upper(self.backbone, x, self.split)
