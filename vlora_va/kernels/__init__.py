"""ATMM: batched heterogeneous-LoRA operator (Triton kernels on CUDA, tuned strategies on CPU), the one-shot
ΔW computation for mode switches, and the profile-based configuration tables.

    y[i] += scale[a] * (x[i] @ A[a].T) @ B[a].T      for every row i, a = idx[i] (-1: untouched)

Each implementation is an ``AtmmBackend`` (kernels/backend.py) registered by name in
``vlora_va.contracts.plugins.ATMM_BACKENDS``; ``atmm(..., impl=name)`` picks one for runs of rows,
``atmm_images`` for one run per image (what a CUDA graph replays) and ``lora_linear_images`` for the whole LoRA
linear layer in one pass (kernels/fused.py: base GEMM, bias and ATMM), each from the backends that declare that
path. The Triton module is imported lazily (on first use of the "triton" backend), so ``TRITON_INTERPRET`` can
still be set first.
"""

from vlora_va.kernels.backend import AtmmBackend
from vlora_va.kernels.ops import atmm, atmm_images, delta_weights, lora_linear_images
from vlora_va.kernels.reference import atmm_reference, delta_weights_reference
from vlora_va.kernels.segments import NO_ADAPTER, Segments
from vlora_va.kernels.tuning_tables import device_kind

__all__ = ["atmm", "AtmmBackend", "atmm_images", "delta_weights", "atmm_reference", "delta_weights_reference", "Segments",
           "NO_ADAPTER", "device_kind", "lora_linear_images"]
