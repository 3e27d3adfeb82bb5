"""Captured forwards: one CUDA graph of the backbone per plan key (image size, batch bucket, LoRA mode kind).

On a GPU the eager forward of a small ViT is dominated by host work (hundreds of kernel launches and the
Python around them); a graph replays them all for the cost of one launch. A captured forward has static
buffers: the pixels (padded to the bucket), the LoRA layout (lora.DeviceLayout, rewritten per batch) and the
output. The base weights and the adapter stacks are updated in place (mode switches, adapter loads), so a
graph stays valid across them; only a new shape needs a new capture, and warm-up captures every key first.

Not captured (run eagerly instead): batches with a shared prefix (their fork depends on the data), the
einsum unmerged path, batches above the largest bucket. With `cuda_graphs=False` (every CPU) the same static
buffers run eagerly, so all of this logic is exercised by the CPU tests.
"""

from __future__ import annotations

import logging

import torch

from vlora_va.engine.modes import LoRAMode
from vlora_va.engine.plan import PlanKey, bucket

log = logging.getLogger(__name__)


class CapturedForward:
    def __init__(self, backend, key: PlanKey, tokens: int, cuda_graphs: bool):
        self.backend, self.key, self.tokens = backend, key, tokens
        b, s = key.bucket, key.size
        with torch.inference_mode(False):  # static buffers are rewritten in place on every replay
            self.pixels = torch.zeros(b, 3, s, s, dtype=backend.dtype, device=backend.device)
        self.layout = backend.layout(b, tokens) if backend.lora_ctx is not None else None
        self.graph = None
        self.out: torch.Tensor | None = None
        self.cuda_graphs = cuda_graphs

    def _forward(self) -> torch.Tensor:
        return self.backend.whole(self.pixels)

    def capture(self, mode: LoRAMode) -> None:
        """Record the forward (on a GPU: warm it up on a side stream first, as CUDA graphs require)."""
        slots = self._dummy_slots(mode)
        self._begin(mode, slots)
        try:
            if not self.cuda_graphs:
                self.out = self._forward()
                return
            side = torch.cuda.Stream(self.backend.device)
            side.wait_stream(torch.cuda.current_stream(self.backend.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward()
            torch.cuda.current_stream(self.backend.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self._forward()
        finally:
            self._end()

    def run(self, pixels: torch.Tensor, slots: list[int], mode: LoRAMode) -> torch.Tensor:
        """The backbone's last hidden state for these n <= bucket images (sorted by slot)."""
        n = pixels.shape[0]
        self.pixels[:n].copy_(pixels)
        self._begin(mode, slots)
        try:
            if self.graph is not None:
                self.graph.replay()
            else:
                self.out = self._forward()
        finally:
            self._end()
        return self.out[:n].clone()  # the next replay overwrites the static output

    def _dummy_slots(self, mode: LoRAMode) -> list[int]:
        slot = mode.slot if mode.slot is not None else 0
        return [slot] * self.key.bucket

    def _begin(self, mode: LoRAMode, slots: list[int]) -> None:
        if self.backend.lora_ctx is not None:
            self.backend.lora_ctx.begin(mode, slots, self.layout)

    def _end(self) -> None:
        if self.backend.lora_ctx is not None:
            self.backend.lora_ctx.clear()


class Graphs:
    """The captured forwards of one backend (engine/backends/torch_eager.py), by plan key."""

    def __init__(self, backend, enabled: bool, cuda_graphs: bool, max_bucket: int):
        self.backend, self.enabled, self.cuda_graphs = backend, enabled, cuda_graphs
        self.max_bucket = bucket(max_bucket)
        self.captured: dict[PlanKey, CapturedForward] = {}
        self.serving = False  # warm-up is over (BackboneBackend.warmed): a capture now delays a live batch

    def key(self, size: int, images: int, mode: LoRAMode, prefix: int, forked: bool) -> PlanKey | None:
        """The plan key of a forward that can replay a capture, or None when it runs eagerly."""
        if not self.enabled or prefix or forked or mode.impl != "atmm" or bucket(images) > self.max_bucket:
            return None
        return PlanKey(size, mode.kind, bucket(images))

    def get(self, key: PlanKey, mode: LoRAMode, tokens: int) -> CapturedForward:
        """The capture for a key, made now if warm-up did not (logged: it costs a first-batch delay)."""
        found = self.captured.get(key)
        if found is None:
            if self.serving:
                log.warning("capturing %s during serving (warm-up missed it)", key)
            found = self.captured[key] = CapturedForward(self.backend, key, tokens, self.cuda_graphs)
            found.capture(mode)
        return found
