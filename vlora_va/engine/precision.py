"""The backbone's compute precision (`daemon.precision`): fp32, bf16 or int8, and how `auto` picks one.

    fp32   the reference.
    bf16   the whole backbone in bfloat16 (the engine's dtype; LoRA stacks, premerged weights and ATMM follow it,
           heads stay float32). Fast only where the CPU multiplies bf16 natively (avx512_bf16 / AMX); elsewhere
           it is emulated and slower than fp32 (3.5x slower measured on an AVX-512 Xeon without it).
    int8   every linear layer of the backbone as a dynamic-int8 GEMM (fbgemm: weights int8 per output channel,
           activations quantised per call, int32 accumulation, bias and scales applied in the GEMM's epilogue;
           x86 with AVX2 or better, VNNI where present). Activations, attention, norms, the patch embedding and
           the heads stay float32; so does ATMM's LoRA term (unmerged / mixture rows).

int8 is applied where the compute is, with no float weight rewritten: the plain linear layers get their packed
weights once (`Int8Linear`); every LoRA layer group keeps one packed copy of its pristine weights and one per
slot, packed from the premerged W + ΔW whenever a slot is (re)loaded (`lora._Group.premerge` calls `refresh`),
and a version check repacks anything whose float weights changed behind its back, so no packed weight is ever
stale. Merged and mixture modes need no repack: "the base weights hold slot s" is slot s's packed copy.
(Without premerged weights, merged weights are packed on their first forward after a switch.)

Why fbgemm and not torchao: torchao 0.18 (`Int8DynamicActivationInt8WeightConfig`) is the maintained API, but in
eager mode on this CPU build its int8 linear ran about as long as the fp32 one or longer (activation quantisation,
`_int_mm` and rescaling as separate passes; its speed on CPU needs torch.compile), while fbgemm's fused
`quantized::linear_dynamic` ran in a third to a half of it (bench/results/cpu_backbone.md, "linear layers"). fbgemm's packing goes through
quantised tensors, which torch marks deprecated: `_pack` is the one place to change when they go.

`auto` picks one per machine: engine/precision_choice.py.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import platform
import warnings
from dataclasses import dataclass

import torch
from torch import nn

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "int8")  # what `daemon.precision` may name besides "auto"
# int8 activations in 8 bits where fbgemm's kernels sum in int32 (AVX512-VNNI: `int8_sums_exact`), in 7 bits elsewhere
# (AVX2's vpmaddubsw sums pairs of u8 x s8 products in int16, which 8-bit activations can saturate). 8 bits halve
# the rounding error: detect's person F1 moved -0.002 vs fp32 with 8 bits, -0.016 with 7 (precision_accuracy.md),
# so the two are gated separately (`gate_key`). None: by the machine; True / False force 7 / 8 bits (tests, bench).
REDUCE_RANGE: bool | None = None
# How this machine runs as an AVX2-only one (the README's AVX2 figures on a wider CPU): every library that picks
# its own kernels is told, fbgemm included (it ignores ATen's capability).
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
# How this machine runs as an AVX-512 + VNNI CPU without bf16 (Cascade Lake, Ice Lake: most cloud Xeons) on one that
# has bf16: oneDNN, which torch's bf16 matmuls and OpenVINO's CPU plugin both use, stops below AVX512_CORE_BF16, and
# `Capabilities.detect` hides avx512_bf16 / AMX by the same cap. fbgemm keeps its AVX512-VNNI int8 kernels.
VNNI_NO_BF16_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}
# oneDNN's ISA names from the narrowest up (ONEDNN_MAX_CPU_ISA): a cap below AVX512_CORE_BF16 takes native bf16 away
ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
               "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "DEFAULT", "ALL")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32, "fp16": torch.float16}


class PrecisionError(ValueError):
    """A precision this machine or configuration cannot run."""


# ---------------------------------------------------------------- what the machine can do
@dataclass(frozen=True)
class Capabilities:
    device: str  # "cpu" | "cuda"
    isa: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
    native_bf16: bool  # bf16 dot products in hardware (avx512_bf16, AMX-BF16; any CUDA GPU torch supports)
    vnni: bool  # fbgemm's int8 GEMM adds full-range 8-bit products without saturating (`int8_sums_exact`)
    int8_kernels: bool  # fbgemm's dynamic int8 linear is in this torch build and this CPU runs it (AVX2+)

    @classmethod
    def detect(cls, device: str | torch.device = "cpu") -> "Capabilities":
        device = torch.device(device).type
        isa = torch.backends.cpu.get_cpu_capability()
        if device == "cuda":
            return cls("cuda", isa, torch.cuda.is_bf16_supported(), False, False)
        flags = cpu_flags()
        if not isa.startswith("AVX512"):  # torch runs narrower (ATEN_CPU_CAPABILITY=avx2): so do its peers here
            flags = {f for f in flags if not f.startswith(("avx512", "amx"))}
        if not onednn_allows_bf16():  # oneDNN capped below bf16 (VNNI_NO_BF16_ENV): its bf16 would be emulated
            flags -= {"avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"}
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        int8_kernels = x86 and isa.startswith(("AVX2", "AVX512")) and "fbgemm" in torch.backends.quantized.supported_engines
        return cls("cpu", isa, bool(flags & {"avx512_bf16", "amx_bf16"}), int8_kernels and int8_sums_exact(),
                   int8_kernels)

    def runs(self, precision: str) -> str | None:
        """Why this machine cannot run `precision` (None: it can). bf16 without native support runs, slowly."""
        if precision == "int8" and not self.int8_kernels:
            return ("int8 needs a CPU device with AVX2 and fbgemm" if self.device == "cpu" else
                    "int8 runs on CPU devices only")
        return None


@functools.cache
def int8_sums_exact() -> bool:
    """Whether fbgemm's int8 GEMM on this machine adds full-range 8-bit products exactly: a row of 63 activations
    quantised to 255 against weights quantised to 127 must give 63. Its AVX2 kernels add pairs of u8 x s8 products
    in int16 (vpmaddubsw: 2 x 255 x 127 > 32767, so ~32 comes out); its AVX512-VNNI kernels add them in int32.
    Asked of the kernel, not read off the CPU flags: fbgemm picks its kernels by its own check (AVX512-VNNI only,
    never the AVX2-width AVX-VNNI) and FBGEMM_ENABLE_INSTRUCTIONS, not by ATen's ATEN_CPU_CAPABILITY."""
    x = torch.ones(1, 64)
    x[0, 0] = 0.0  # activations span [0, 1]: zero point 0, every 1 quantised to 255
    y = torch.ops.quantized.linear_dynamic(x, _pack(torch.ones(1, 64), None), False)
    return abs(float(y[0, 0]) - 63.0) < 0.5


def onednn_cap() -> str | None:
    """The oneDNN ISA cap this process runs under (ONEDNN_MAX_CPU_ISA, upper case), None where there is none."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    return cap if cap and cap not in ("ALL", "DEFAULT") else None


def onednn_allows_bf16() -> bool:
    """Whether oneDNN may use native bf16 instructions here: no cap, or a cap at or above AVX512_CORE_BF16 (an
    unknown name counts as allowing: oneDNN ignores names it does not know)."""
    cap = onednn_cap()
    if cap is None or cap not in ONEDNN_ISAS:
        return True
    return ONEDNN_ISAS.index(cap) >= ONEDNN_ISAS.index("AVX512_CORE_BF16")


def cpu_flags() -> set[str]:
    """The CPU feature flags of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def device_name(device: torch.device) -> str:
    """The processor the costs belong to: the GPU's name, or the CPU model and its vector capability."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    cap = onednn_cap()  # a capped run is another machine to every cache keyed by this (profiles, float hint)
    return f"{model} ({torch.backends.cpu.get_cpu_capability()}{f', oneDNN <= {cap}' if cap else ''})"


# ---------------------------------------------------------------- configuration -> precision and dtype
def label_of(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def resolve(precision: str | None, dtype: torch.dtype, device: torch.device | str = "cpu") -> tuple[str, torch.dtype]:
    """(precision, backbone dtype) for an engine: None follows the dtype (fp32 / bf16 / fp16); bf16 sets the
    dtype; int8 computes on float32 activations, on a CPU. A dtype that contradicts the precision is an error."""
    if precision is None:
        return label_of(dtype), dtype
    if precision not in PRECISIONS:
        raise PrecisionError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "int8" and torch.device(device).type != "cpu":
        raise PrecisionError("int8 runs on CPU devices only")
    want = _DTYPES[precision]
    if dtype not in (want, torch.float32):
        raise PrecisionError(f"precision {precision} runs the backbone in {want}, not {dtype}")
    return precision, want


def dtype_of(precision: str) -> torch.dtype:
    return _DTYPES[precision]


def precision_of(model: nn.Module) -> str:
    """What a backbone computes in: int8 when its linear layers were swapped (apply), else its dtype's label,
    with the int8 activation width (cost profiles and speeds are keyed by it)."""
    if any(isinstance(m, (Int8Linear, Int8Base)) for m in model.modules()):
        return gate_key("int8")
    return label_of(next(model.parameters()).dtype)


# ---------------------------------------------------------------- int8 kernels (fbgemm)
def _pack(w: torch.Tensor, bias: torch.Tensor | None):
    """fbgemm's prepacked int8 weight: symmetric per output channel (scale = max |w| / 127), bias fused."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
    with warnings.catch_warnings():  # quantised tensors are deprecated; fbgemm's packing still takes them
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())


def reduce_range() -> bool:
    """Whether int8 activations use 7 bits here (see REDUCE_RANGE)."""
    return REDUCE_RANGE if REDUCE_RANGE is not None else _machine_reduce_range()


@functools.cache
def _machine_reduce_range() -> bool:
    return not Capabilities.detect("cpu").vnni


def gate_key(precision: str) -> str:
    """The accuracy-gate entry that covers `precision` as it computes on this machine (int8: 8- or 7-bit
    activations)."""
    return "int8-7bit" if precision == "int8" and reduce_range() else precision


def _run(x2: torch.Tensor, packed) -> torch.Tensor:
    """y = x2 @ W.T + bias through the packed int8 weight, x2 [N, in] float32 (activations quantised per call)."""
    return torch.ops.quantized.linear_dynamic(x2.contiguous(), packed, reduce_range())


class Int8Linear(nn.Module):
    """A plain nn.Linear computed as a dynamic-int8 GEMM. Keeps the float `weight` / `bias` (same parameter
    names); repacks if they change in place (version check)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._packed, self._version = None, None
        self.repack()

    def repack(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            self._packed = _pack(self.weight, self.bias)
        self._version = _versions(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _versions(self.weight, self.bias) != self._version:
            self.repack()
        return _run(x.reshape(-1, self.in_features), self._packed).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (fbgemm)"


def _versions(*ts) -> tuple:
    return tuple(None if t is None else t._version for t in ts)


class GroupInt8:
    """Packed int8 weights of one LoRA layer group (lora._Group): the pristine weights and each slot's
    premerged W + ΔW, per layer. `lora` calls `packed(slot, l)` (slot None: pristine) and `run(x2, packed)`;
    `lora._Group.premerge` calls `refresh(slot)` after rewriting a slot's premerged weights."""

    def __init__(self, group, biases: list[torch.Tensor | None]):
        self.group, self.biases = group, biases
        self.base = [_pack(w, b) for w, b in zip(self._pristine(), biases)]
        self.slots: dict[int, list] = {}
        self._wm_version = None
        self._merged: tuple | None = None  # (slot, W version, packed per layer): merged weights without premerge
        if group.Wm is not None:
            self.refresh_all()

    run = staticmethod(_run)

    def _pristine(self) -> torch.Tensor:
        g = self.group
        return g.W0 if g.W0 is not None else g.W

    def refresh(self, slot: int) -> None:
        """Repack one slot from its premerged weights (after a load, clear or premerge). A layer the slot's
        adapter leaves alone (rank 0: its premerged weight is the pristine one) shares the pristine pack."""
        g = self.group
        with torch.inference_mode(False), torch.no_grad():
            self.slots[slot] = [_pack(g.Wm[slot, l], b) if g.rank_py[l][slot] else self.base[l]
                                for l, b in enumerate(self.biases)]
        self._wm_version = g.Wm._version

    def refresh_all(self) -> None:
        for s in range(self.group.Wm.shape[0]):
            self.refresh(s)

    def packed(self, slot: int | None, l: int):
        """The packed weight of layer l for rows of `slot` (None: the pristine weights)."""
        if slot is None or slot < 0:
            return self.base[l]
        g = self.group
        if g.Wm is None:
            raise RuntimeError("int8 per-slot weights need premerged weights (enable_premerge)")
        if g.Wm._version != self._wm_version:  # rewritten without refresh (e.g. a slot cleared): repack all
            log.info("int8: premerged weights changed without a refresh (a slot cleared): repacking every slot")
            self.refresh_all()
        return self.slots[slot][l]

    def merged(self, slot: int | None, l: int):
        """Layer l's packed weight while the base weights hold `slot` (merged / mixture modes)."""
        if slot is None:
            return self.base[l]
        g = self.group
        if g.Wm is not None:
            return self.packed(slot, l)  # W0 + ΔW_slot is exactly the slot's premerged weight
        if self._merged is None or self._merged[:2] != (slot, g.W._version):
            with torch.inference_mode(False), torch.no_grad():
                self._merged = (slot, g.W._version, [_pack(g.W[i], b) for i, b in enumerate(self.biases)])
        return self._merged[2][l]


class Int8Base(nn.Module):
    """Stands in for a LoRALinear's `base` nn.Linear: the same `weight` / `bias` (views of the group's
    storage), computed through the packed int8 copy of whatever the base weights hold now."""

    def __init__(self, linear: nn.Linear, lowp: GroupInt8, ctx, index: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._lowp, self._ctx, self._index = lowp, ctx, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._lowp.merged(self._ctx.weights_slot, self._index)
        return _run(x.reshape(-1, self.in_features), packed).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (fbgemm)"


def apply(backbone: nn.Module, precision: str) -> None:
    """Make the backbone compute in `precision` (after LoRA injection and premerging). fp32 / bf16 / fp16 live
    in the dtype and need nothing here; int8 swaps every linear layer's GEMM (see the module docstring)."""
    if precision != "int8":
        return
    from vlora_va.engine.lora import LoRALinear

    if next(backbone.parameters()).dtype != torch.float32:
        raise PrecisionError("int8 needs a float32 backbone")
    lora = {n: m for n, m in backbone.named_modules() if isinstance(m, LoRALinear)}
    groups: dict[int, tuple] = {}
    for m in lora.values():
        g = m._group
        if id(g) not in groups:
            if m._ctx.weights_slot is not None:
                raise PrecisionError("apply int8 while the base weights are pristine (unmerge first)")
            members = sorted((x for x in lora.values() if x._group is g), key=lambda x: x._index)
            g.lowp = GroupInt8(g, [x.base.bias for x in members])
            groups[id(g)] = g
        m.base = Int8Base(m.base, g.lowp, m._ctx, m._index)
    inside = {id(m.base) for m in lora.values()}
    for name, m in list(backbone.named_modules()):
        if type(m) is nn.Linear and id(m) not in inside:
            parent_name, _, child = name.rpartition(".")
            setattr(backbone.get_submodule(parent_name) if parent_name else backbone, child, Int8Linear(m))


def precision_copy(backbone: nn.Module, precision: str) -> nn.Module:
    """A copy of a plain (LoRA-free) backbone computing in `precision` (speed probes, accuracy checks)."""
    model = copy.deepcopy(backbone).to(dtype_of(precision)).eval()
    apply(model, precision)
    return model
