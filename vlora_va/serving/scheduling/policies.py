"""The scheduling policies, selected by `daemon.policy` (registered by name in contracts.plugins.POLICIES). Each says
which modes may serve the next batch, and which LoRA mode costs the start-up profile must measure for it
(`measured_modes`); the shared rules (base.py) fill, cost, shed and keep the priorities the same way for all of them
(a policy chooses among the requests of the tiers that may be served now: `options` reads self.queue).

    vlora         the V-LoRA policy (below), with every mode, premerged included, chosen by measured cost
    edf           earliest deadline first in one fixed mode: premerged where resident, else unmerged (ATMM)
    merge-only    always merged: the earliest-deadline request's adapter is merged, its requests batched
    unmerge-only  always unmerged through ATMM
    dlora         dLoRA: merged when one adapter's queue fills half a batch and nothing starves, else
                  unmerged through a one-hot einsum; no mixture, no premerged
"""

from __future__ import annotations

from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode
from vlora_va.serving.scheduling.base import Option, Scheduler, dominant_adapter, edf

SWITCH_HYSTERESIS = 0.03  # keep the current weights unless another option is this much cheaper


class EdfScheduler(Scheduler):
    name = "edf"
    measured_modes = ("premerged", "unmerged")

    def mode(self) -> LoRAMode:
        return self.catalog.resting_mode()

    def modes(self, slot):
        return [self.mode()]

    def options(self, now):
        mode = self.mode()
        return [self.fill(edf(self.queue), mode, now)]


class UnmergeOnlyScheduler(EdfScheduler):
    name = "unmerge-only"
    measured_modes = ("unmerged",)

    def mode(self) -> LoRAMode:
        return LoRAMode(UNMERGED)


class MergeOnlyScheduler(Scheduler):
    name = "merge-only"
    measured_modes = ()

    def modes(self, slot):
        return [LoRAMode(MERGED, slot)] if self.catalog.has_lora else [LoRAMode(UNMERGED)]

    def options(self, now):
        ordered = edf(self.queue)
        if not self.catalog.has_lora:
            return [self.fill(ordered, LoRAMode(UNMERGED), now)]
        slot = self.slot(ordered[0])
        return [self.fill([r for r in ordered if self.slot(r) == slot], LoRAMode(MERGED, slot), now)]


class DLoRAScheduler(Scheduler):
    """dLoRA's dynamic batching: merge the adapter whose queue is long enough to fill half a batch, unless
    requests of others starve (their credit passes the threshold); otherwise unmerged, computed as dLoRA
    does (every adapter on every row, one-hot selected)."""

    name = "dlora"
    measured_modes = ("unmerged/einsum",)

    def modes(self, slot):
        modes = [LoRAMode(UNMERGED, impl="einsum")]
        if self.catalog.has_lora:
            modes.append(LoRAMode(MERGED, slot))
        return modes

    def options(self, now):
        unmerged = LoRAMode(UNMERGED, impl="einsum")
        ordered = edf(self.queue)
        if not self.catalog.has_lora:
            return [self.fill(ordered, unmerged, now)]
        d = dominant_adapter(self.queue)
        merged = LoRAMode(MERGED, self.catalog.adapters[d].slot)
        mine = [r for r in ordered if r.adapter == d]
        starving = [r for r in ordered if r.adapter != d and self.starving(r, unmerged, now)]
        if sum(r.num_images for r in mine) * 2 >= self.settings.max_batch_images and not starving:
            return [self.fill(mine, merged, now)]
        return [self.fill(self.order(self.queue, now, unmerged), unmerged, now)]


class VLoRAScheduler(Scheduler):
    """The V-LoRA policy with measured costs. Let d be the adapter with the most queued images:
    - merged(d) when nothing of another adapter starves (d's requests only);
    - mixture(d) when some requests of other adapters starve: d merged, the others through their LoRA
      plus a deLoRA term, in one batch;
    - unmerged when the starving requests exceed half a batch (mixture would pay deLoRA on most rows);
    - premerged (per-slot merged weights, where resident) is one more mode, never excluded.
    Among the allowed modes, each mode's batch is filled by the shared rules and costed together with the
    time it leaves for the rest of the queue; the least total wins (switching weights only when that saves
    more than SWITCH_HYSTERESIS)."""

    name = "vlora"
    measured_modes = ("premerged", "unmerged", "mixture")

    def modes(self, slot):
        if not self.catalog.has_lora:
            return [LoRAMode(UNMERGED)]
        modes = [LoRAMode(UNMERGED), LoRAMode(MERGED, slot)]
        if self.catalog.can_premerge:
            modes.append(LoRAMode(PREMERGED))
        if self.weights_slot is not None:  # served beside the merged adapter, without a switch
            modes.append(LoRAMode(MIXTURE, self.weights_slot))
        return modes

    def warmup_modes(self, slot):
        modes = [m for m in self.modes(slot) if m.kind != MIXTURE]
        return modes + ([LoRAMode(MIXTURE, slot)] if self.catalog.has_lora else [])

    def allowed(self, now) -> list[tuple[LoRAMode, list]]:
        """(mode, the requests it may serve) for every mode the V-LoRA rule allows now."""
        unmerged = LoRAMode(UNMERGED)
        if not self.catalog.has_lora:
            return [(unmerged, self.queue)]
        d = dominant_adapter(self.queue)
        d_slot = self.catalog.adapters[d].slot
        merged = LoRAMode(MERGED, d_slot)
        starving = [r for r in self.queue if r.adapter != d and self.starving(r, merged, now)]
        out = []
        if self.catalog.can_premerge:
            out.append((LoRAMode(PREMERGED), self.queue))
        if not starving:
            out.append((merged, [r for r in self.queue if r.adapter == d]))
        if sum(r.num_images for r in starving) * 2 <= self.settings.max_batch_images:
            out.append((LoRAMode(MIXTURE, d_slot), self.queue))
            if self.weights_slot is not None and self.weights_slot != d_slot:  # serve without a switch
                out.append((LoRAMode(MIXTURE, self.weights_slot), self.queue))
        out.append((unmerged, self.queue))
        return out

    def options(self, now):
        follow_modes = self._follow_modes()
        options = []
        for mode, requests in self.allowed(now):
            o = self.fill(self.order(requests, now, mode), mode, now)
            o.follow_s = self.follow(o, follow_modes + self._mixture_after(o))
            options.append(o)
        return options

    def _follow_modes(self) -> list[LoRAMode]:
        modes = [LoRAMode(UNMERGED)]
        if self.catalog.can_premerge:
            modes.append(LoRAMode(PREMERGED))
        slots = {self.slot(r) for r in self.queue}
        if len(slots) == 1:
            modes.append(LoRAMode(MERGED, slots.pop()))
        return modes

    @staticmethod
    def _mixture_after(o: Option) -> list[LoRAMode]:
        return [LoRAMode(MIXTURE, o.mode.weights_slot)] if o.mode.weights_slot is not None else []

    def pick(self, options: list[Option]) -> Option:
        best = super().pick(options)
        # Noise in the measured costs must not make the weights flap: stay unless switching saves enough.
        staying = [o for o in options if o.mode.weights_slot == self.weights_slot]
        if staying and best.mode.weights_slot != self.weights_slot:
            stay = super().pick(staying)
            if stay.est_s + stay.follow_s <= (best.est_s + best.follow_s) * (1 + SWITCH_HYSTERESIS):
                return stay
        return best
