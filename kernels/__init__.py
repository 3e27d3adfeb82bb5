"""ATMM: batched heterogeneous-LoRA operator (Triton kernels on CUDA, tuned strategies on CPU), the one-shot
ΔW computation for mode switches, and the profile-based configuration tables.

    y[i] += scale[a] * (x[i] @ A[a].T) @ B[a].T      for every row i, a = idx[i] (-1: untouched)

Each implementation is an ``AtmmBackend`` (kernels/backend.py) registered by name in
``vlora_va.contracts.plugins.ATMM_BACKENDS``; ``atmm(..., impl=name)`` picks one. The Triton module is imported
lazily (on first use of the "triton" backend), so ``TRITON_INTERPRET`` can still be set first.
``lora_linear_images`` (kernels/fused.py) is the whole LoRA linear layer in one kernel: base GEMM, bias and ATMM.
"""

from vlora_va.kernels.backend import AtmmBackend
from vlora_va.kernels.fused import lora_linear_images
from vlora_va.kernels.images import atmm_images
from vlora_va.kernels.ops import atmm, delta_weights
from vlora_va.kernels.reference import atmm_reference, delta_weights_reference
from vlora_va.kernels.segments import NO_ADAPTER, Segments
from vlora_va.kernels.tuning_tables import device_kind

__all__ = ["atmm", "AtmmBackend", "atmm_images", "delta_weights", "atmm_reference", "delta_weights_reference", "Segments",
           "NO_ADAPTER", "device_kind", "lora_linear_images"]
