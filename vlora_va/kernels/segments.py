"""Batch layout for ATMM: which contiguous row ranges use which adapter slot.

Built once per forward (every wrapped layer of the model reuses it), so the per-layer work holds no
host/device synchronisation and no Python-side re-analysis of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

NO_ADAPTER = -1


@dataclass(eq=False)
class Segments:
    """Runs of consecutive rows sharing one adapter slot (rows with slot -1 are not listed).

    ``starts[j]:ends[j]`` are the rows of run j and ``slots[j]`` its slot. Adjacent rows with the same
    slot are always one run, so a batch already grouped by adapter has exactly one run per adapter.
    """

    n_rows: int
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    slots: tuple[int, ...]
    elem_slots: tuple[int, ...] | None = None  # per batch element, when built from elements
    rows_per_elem: int = 1
    _cache: dict = field(default_factory=dict, repr=False)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_row_slots(cls, row_slots: list[int]) -> Segments:
        """One slot per row (Python ints)."""
        return cls.from_elements(row_slots, 1)

    @classmethod
    def from_elements(cls, elem_slots: list[int], rows_per_elem: int) -> Segments:
        """One slot per batch element, each element owning ``rows_per_elem`` consecutive rows."""
        starts, ends, slots = [], [], []
        prev = None
        for e, s in enumerate(elem_slots):
            if s == prev and s != NO_ADAPTER:
                ends[-1] = (e + 1) * rows_per_elem
            elif s != NO_ADAPTER:
                starts.append(e * rows_per_elem)
                ends.append((e + 1) * rows_per_elem)
                slots.append(int(s))
            prev = s
        return cls(len(elem_slots) * rows_per_elem, tuple(starts), tuple(ends), tuple(slots),
                   tuple(int(s) for s in elem_slots), rows_per_elem)

    @classmethod
    def from_idx(cls, idx: torch.Tensor) -> Segments:
        """From a per-row LongTensor (one host sync)."""
        return cls.from_row_slots(idx.tolist())

    # ---- derived views (cached: the same object serves every layer of a forward) ---------------
    @property
    def n_runs(self) -> int:
        return len(self.slots)

    @property
    def used_slots(self) -> tuple[int, ...]:
        """Distinct slots, in order of first appearance."""
        if "used" not in self._cache:
            self._cache["used"] = tuple(dict.fromkeys(self.slots))
        return self._cache["used"]

    @property
    def is_grouped(self) -> bool:
        """True when every slot occupies a single run (no gather/scatter needed)."""
        return len(self.used_slots) == self.n_runs

    def slot_rows(self, device: torch.device) -> dict[int, torch.Tensor]:
        """slot -> LongTensor of its rows (for gather/scatter strategies)."""
        key = ("rows", str(device))
        if key not in self._cache:
            rows: dict[int, list[torch.Tensor]] = {}
            for s, a, b in zip(self.slots, self.starts, self.ends):
                rows.setdefault(s, []).append(torch.arange(a, b))
            self._cache[key] = {s: torch.cat(r).to(device) for s, r in rows.items()}
        return self._cache[key]

    def without(self, slot: int) -> Segments:
        """The same runs minus those of one slot (mixture mode: the merged adapter's rows need no LoRA)."""
        key = ("without", slot)
        if key not in self._cache:
            keep = [j for j, s in enumerate(self.slots) if s != slot]
            self._cache[key] = Segments(self.n_rows, tuple(self.starts[j] for j in keep),
                                        tuple(self.ends[j] for j in keep), tuple(self.slots[j] for j in keep))
        return self._cache[key]

    def delora(self, merged_slot: int) -> Segments:
        """Runs of every row whose slot != merged_slot (rows without adapter included), all mapped to
        merged_slot: the rows that must subtract the merged adapter's contribution."""
        key = ("delora", merged_slot)
        if key not in self._cache:
            starts, ends = [], []
            cursor = 0
            for s, a, b in zip(self.slots, self.starts, self.ends):
                if s == merged_slot:
                    if a > cursor:
                        starts.append(cursor)
                        ends.append(a)
                    cursor = b
            if cursor < self.n_rows:
                starts.append(cursor)
                ends.append(self.n_rows)
            self._cache[key] = Segments(self.n_rows, tuple(starts), tuple(ends), (merged_slot,) * len(starts))
        return self._cache[key]

    def device_tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(start, length, slot) int32 tensors on device, for the Triton kernels."""
        key = ("dev", str(device))
        if key not in self._cache:
            t = torch.tensor([self.starts, [b - a for a, b in zip(self.starts, self.ends)], self.slots],
                             dtype=torch.int32).reshape(3, -1)
            t = t.to(device)
            self._cache[key] = (t[0], t[1], t[2])
        return self._cache[key]

    def slot_progression(self) -> tuple[int, int] | None:
        """(first slot, step) when there are >= 2 runs, all of one length, back to back, whose slots
        rise by a constant step (e.g. one image per adapter, adapters 0..7); else None. Such a batch can
        run as one batched GEMM over a strided view of per-slot weights."""
        if "progression" not in self._cache:
            lens = {b - a for a, b in zip(self.starts, self.ends)}
            step = self.slots[1] - self.slots[0] if self.n_runs >= 2 else 0
            ok = (self.n_runs >= 2 and len(lens) == 1 and step >= 1
                  and all(self.starts[j + 1] == self.ends[j] for j in range(self.n_runs - 1))
                  and all(self.slots[j + 1] - self.slots[j] == step for j in range(self.n_runs - 1)))
            self._cache["progression"] = (self.slots[0], step) if ok else None
        return self._cache["progression"]

    def max_run(self) -> int:
        return max((b - a for a, b in zip(self.starts, self.ends)), default=0)
