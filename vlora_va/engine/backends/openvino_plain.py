"""The plain backbone compiled by OpenVINO, which `daemon.backend: auto` times against the torch precisions
(precision_choice.measure_speeds), and whether the int8 models the openvino backend would run are calibrated here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from vlora_va.engine.backends import openvino_int8
from vlora_va.engine.backends.openvino_runtime import (
    BackbonePart,
    compile_config,
    convert,
    import_openvino,
    int8_dir,
    int8_hint,
    openvino_problem,
    openvino_version,
)
from vlora_va.engine.precision import Capabilities
from vlora_va.engine.vit import block_of, blocks


class PlainOpenVINO:
    """The backbone compiled by OpenVINO, called as the Hugging Face model is (`model(pixel_values=x)`), one
    compiled model per image size: what `daemon.backend: auto` times against the torch precisions
    (precision_choice.measure_speeds). Float: the plain (LoRA-free) backbone. int8: the calibrated parts the engine
    would run, `int8_parts` {size: (lower IR, upper IR of one adapter)} (`int8_calibration`)."""

    def __init__(self, backbone: nn.Module, precision: str, int8_parts: dict[int, tuple[Path, Path]] | None = None):
        self.backbone, self.config = backbone, compile_config(precision)  # a float32 backbone
        self.core = import_openvino().Core()
        self.int8_parts = int8_parts if precision == "int8" else None
        self._compiled: dict[int, list] = {}

    def __call__(self, pixel_values: torch.Tensor) -> np.ndarray:
        size = pixel_values.shape[-1]
        if size not in self._compiled:
            if self.int8_parts is not None:
                self._compiled[size] = [self.core.compile_model(self.core.read_model(str(p)), "CPU", self.config)
                                        for p in self.int8_parts[size]]
            else:
                self._compiled[size] = [self.core.compile_model(
                    convert(BackbonePart(self.backbone, 0, "whole"), pixel_values[:1].float()), "CPU", self.config)]
        x = pixel_values.float().numpy()
        for part in self._compiled[size]:
            x = part(x)[0]
        return x


def int8_calibration(backbone: nn.Module, adapters: dict, sizes: dict[str, int]) -> tuple[str | None, dict]:
    """Whether the int8 models the openvino engine would run for these adapters (at sizes: adapter -> px) are
    calibrated here: (why not, or None; {size: (lower IR, upper IR of its first adapter)} for the speed probe).
    The same keys as `OpenVINOBackbone.int8_key`: `backbone` is the plain one the engine is built from."""
    from vlora_va.engine.adapters import adapter_digest
    from vlora_va.engine.backbones import tensor_digest

    if not adapters:
        return "no adapter to calibrate for", {}
    identity, version = tensor_digest(backbone.state_dict()), openvino_version()
    fix = openvino_int8.overflow_fix(Capabilities.detect("cpu").vnni)
    first = [block_of(n) for a in adapters.values() for n in a.lora if block_of(n) is not None]
    split = min(first, default=len(blocks(backbone)))
    parts: dict[int, tuple[Path, Path]] = {}
    missing = []
    for name in sorted(adapters, key=lambda n: (sizes[n], n)):
        size = sizes[name]
        lower = openvino_int8.cached(int8_dir(), openvino_int8.part_key("lower", identity, size, split, None, fix,
                                                                        version))
        upper = openvino_int8.cached(int8_dir(), openvino_int8.part_key("upper", identity, size, split,
                                                                        adapter_digest(adapters[name]), fix, version))
        if lower is None or upper is None:
            missing.append(f"{name} at {size} px")
        elif size not in parts:
            parts[size] = (lower, upper)
    if missing:
        return (f"no calibrated int8 model for {', '.join(missing)} (run `vlora-va models calibrate` on the pipeline "
                f"file)"), {}
    return None, parts


def int8_gate(caps: Capabilities, backbone: nn.Module, adapters: dict, sizes: dict[str, int]) -> tuple[str | None, dict]:
    """(why the openvino backend's int8 may not serve these adapters: OpenVINO missing, not calibrated, or its
    accuracy gate for this CPU's variant (openvino_int8.gate_name) not passed; None: it may; its calibrated parts
    for the speed probe)."""
    from vlora_va.engine.precision_choice import gate_allows  # noqa: PLC0415 - the gate auto reads, at its call

    problem = openvino_problem()  # (it builds an OpenVINO Core: once)
    if problem:
        return problem, {}
    missing, parts = int8_calibration(backbone, adapters, sizes)
    if missing:
        return missing, {}
    return gate_allows(adapters, openvino_int8.gate_name(caps.native_bf16, caps.vnni, int8_hint())), parts
