"""Costs: how long a batch plan takes on THIS machine, predicted from the measured profile and corrected online.

The profile (`CostProfile`, measured at start-up by serving/profiling.py, cached per machine) holds:
    base[size]        a forward + heads of n images at each adapter image size, one adapter, no LoRA cost
                      (merged weights), at a few batch sizes (interpolated between them)
    factor[mode][k]   the backbone forward in each LoRA mode with k adapters in the batch, over the merged one
    switch_s          one all-layer weight switch (merge or unmerge)
`CostModel` predicts a plan's time from it and corrects itself from the batch times it observes: decode and other
processes on the same cores slow forwards down (up to ~1.8x seen on 2 cores), and a profile measured while other
processes were busy is several times too slow, so a start-up figure alone would be wrong. Nothing here is
hard-coded (dLoRA's mistake).

The online correction (observed / profiled batch time) follows the batches in both directions within a few of them:
    a batch that ran SHIFT_RATIO faster than predicted   the correction drops to it at once: timing noise only ever
                                                         slows a batch down (a hiccup, another process), so a fast
                                                         batch shows what this machine can do now (a profile taken
                                                         on a busy machine, a slow spell that ended)
    SHIFT_BATCHES batches in a row SHIFT_RATIO slower    the correction rises to their median: the machine got slower
                                                         (a competing load, a profile taken on a faster moment); one
                                                         slow batch alone may be a hiccup and only nudges it
    anything else                                        a smoothed average (in log space: 3x and 1/3x alike)
It holds its value while no batch runs. It used to fade back to the profile (CORRECTION_FADE_S), so that a daemon
shedding everything after a slow spell would try again; but the profile may be the wrong figure (measured on a busy
machine: the reason it is corrected), and fading back to it brought the wrong estimate back and shed everything
again. That a wrong correction is never left standing because nothing runs is now the scheduler's part: a request
that only the estimate says would be late is not shed while the engine has nothing else to do and no batch measured
the machine lately, it runs as a probe, and its time corrects the model (scheduling/base.py). `fastest` is the
lowest correction plausible now: the fastest of the last few batches while they are recent (without them, the
lowest CORRECTION_RANGE allows); a request that would miss its deadline even at that speed is shed without trying.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from vlora_va.engine.modes import MERGED, PREMERGED, UNMERGED, LoRAMode

CORRECTION_ALPHA = 0.25  # weight of the newest batch in the online correction (smoothed in log space)
CORRECTION_RANGE = (0.25, 4.0)  # a profile taken on a busy machine can be several times too slow
SHIFT_RATIO = 1.5  # a batch this much faster or slower than predicted is no timing noise (see the module docstring)
SHIFT_BATCHES = 3  # slower batches in a row that make a shift (fewer may be a hiccup)
# How fast the machine can be now: the fastest of the last FASTEST_BATCHES batches (observed / profiled), while the
# newest is at most FASTEST_STALE_S old; after that it may have got faster unseen (a slow spell that ended), and only
# CORRECTION_RANGE bounds it.
FASTEST_BATCHES = 8
FASTEST_STALE_S = 2.0
MARGIN_BATCHES = 40  # the safety margin is read off this many recent batches
MARGIN_QUANTILE = 0.95
MARGIN_RANGE = (1.1, 2.0)
# A batch within this of the lowest measured time per image counts as efficient (timing noise between points)
EFFICIENT_TOLERANCE = 1.03
MIN_BATCH_CAP = 4


def mode_name(mode: LoRAMode) -> str:
    """The profile's name for a mode's cost: the kind, and the unmerged implementation where it matters."""
    return mode.kind if mode.impl == "atmm" or mode.kind in (PREMERGED, MERGED) else f"{mode.kind}/{mode.impl}"


@dataclass
class CostProfile:
    key: dict
    base: dict[int, list[tuple[int, float]]]  # size -> [(images, seconds)], ascending images
    factors: dict[str, dict[int, float]]  # mode name -> {adapters in the batch: forward time / merged}
    switch_s: float
    measured_s: float = 0.0  # how long measuring took
    created: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d["base"] = {str(k): v for k, v in self.base.items()}
        d["factors"] = {m: {str(k): v for k, v in f.items()} for m, f in self.factors.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CostProfile":
        return cls(key=d["key"], base={int(k): [tuple(p) for p in v] for k, v in d["base"].items()},
                   factors={m: {int(k): float(v) for k, v in f.items()} for m, f in d["factors"].items()},
                   switch_s=float(d["switch_s"]), measured_s=float(d.get("measured_s", 0.0)),
                   created=d.get("created", ""))


# ---------------------------------------------------------------- predicting
def _interpolate(points: list[tuple[int, float]], n: float) -> float:
    """Piecewise-linear in images, extended linearly past the measured range (never below zero)."""
    if len(points) == 1:
        return points[0][1] * n / points[0][0]
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n <= n1:
            break
    return max(0.0, t0 + (t1 - t0) * (n - n0) / (n1 - n0))


@dataclass
class CostModel:
    profile: CostProfile
    observed: int = 0
    margin: float = MARGIN_RANGE[0]  # how much longer than predicted a batch may run (95th percentile)
    batch_cap: int | None = None  # the largest batch the daemon runs (Daemon._batch_cap); None: no cap
    clock: Callable[[], float] | None = field(default=None, repr=False)  # seconds; None: time.monotonic

    def __post_init__(self):
        self.clock = self.clock or time.monotonic
        self._errors: collections.deque[float] = collections.deque(maxlen=MARGIN_BATCHES)
        self._correction, self._observed_at = 1.0, None
        self._recent: collections.deque[float] = collections.deque(maxlen=FASTEST_BATCHES)  # observed / profiled
        self._slower: list[float] = []  # the ratios of the batches in a row that ran SHIFT_RATIO slower
        self._slower_than = 1.0  # ...than this correction (the one before the first of them)

    @property
    def correction(self) -> float:
        """Observed / profiled batch time: how much slower than its profile this machine runs right now."""
        return self._correction

    @property
    def measured_lately(self) -> bool:
        """A batch ran within FASTEST_STALE_S: the correction says how fast the machine is now."""
        return self._observed_at is not None and self.clock() - self._observed_at <= FASTEST_STALE_S

    @property
    def fastest(self) -> float:
        """The lowest correction plausible now: the fastest of the recent batches (FASTEST_BATCHES) while measured
        lately, else the lowest CORRECTION_RANGE allows (the machine may be that much faster than its profile)."""
        if not self.measured_lately:
            return CORRECTION_RANGE[0]
        return min(min(self._recent), self._correction)

    def factor(self, mode: LoRAMode, adapters: int) -> float:
        f = self.profile.factors.get(mode_name(mode))
        if f is None:  # a mode the profile did not measure: the cheapest that computes the same thing
            f = self.profile.factors.get(UNMERGED, {1: 1.0})
        ks = sorted(f)
        if adapters <= ks[0]:
            return f[ks[0]]
        if adapters >= ks[-1]:
            return f[ks[-1]]
        lo = max(k for k in ks if k <= adapters)
        hi = min(k for k in ks if k >= adapters)
        return f[lo] if hi == lo else f[lo] + (f[hi] - f[lo]) * (adapters - lo) / (hi - lo)

    def forward_s(self, size: int, images: int, mode: LoRAMode, adapters: int) -> float:
        """Predicted seconds of one backbone forward + heads, uncorrected."""
        points = self.profile.base.get(size)
        if points is None:  # a size the profile never saw: scale the nearest by token count
            near = min(self.profile.base, key=lambda s: abs(s - size))
            points = [(n, t * (size / near) ** 2) for n, t in self.profile.base[near]]
        return _interpolate(points, images) * self.factor(mode, adapters)

    def group_s(self, size: int, images: int, mode: LoRAMode, adapters: int, prefix: int = 0,
                distinct: int | None = None, blocks: int = 12) -> float:
        """One size group's forward, uncorrected: with a shared prefix, blocks [0, prefix) cost as many
        images as there are distinct frames, the rest as many as there are images."""
        full = self.forward_s(size, images, mode, adapters)
        if not prefix or distinct is None or distinct >= images:
            return full
        shared = self.forward_s(size, distinct, mode, adapters)
        return (shared * prefix + full * (blocks - prefix)) / blocks

    def plan_s(self, groups: dict[int, tuple], mode: LoRAMode, switching: bool) -> float:
        """Predicted seconds for the forwards of {size: (images, adapters[, prefix, distinct, blocks])} in
        `mode`, corrected; plus a weight switch when `switching`."""
        t = sum(self.group_s(size, g[0], mode, g[1], *g[2:]) for size, g in groups.items() if g[0])
        return (t + (self.profile.switch_s if switching else 0.0)) * self.correction

    def efficient_batch(self, max_batch: int) -> int:
        """The largest batch worth running: per image size, the largest measured batch whose time per image is
        within EFFICIENT_TOLERANCE of the lowest (max_batch where that is the largest measured batch: a GPU's
        curve, or a CPU whose per-image cost keeps falling); the largest over sizes, since one batch limit serves
        them all and a size that gains from large batches must keep them; never below MIN_BATCH_CAP (small
        batches differ by less than the timing noise, and batching keeps the tasks that share a frame together).
        Past it a CPU serves fewer images per second, not more."""
        caps = []
        for points in self.profile.base.values():
            per = [(t / n, n) for n, t in points if n > 0 and t > 0]
            if len(per) < 2:
                caps.append(max_batch)
                continue
            best = min(p for p, _ in per)
            good = max(n for p, n in per if p <= best * EFFICIENT_TOLERANCE)
            caps.append(max_batch if good >= max(n for _, n in per) else good)
        cap = max(caps, default=max_batch)
        return min(max_batch, max(cap, MIN_BATCH_CAP))

    def image_s(self, size: int, mode: LoRAMode, adapters: int = 1) -> float:
        """Marginal seconds of one more image at `size` in a batch (for load accounting), corrected: the slope of
        the profile up to the largest batch the daemon runs (`batch_cap`). Past it a CPU's batches cost more per
        image (batch 16 ~12% more than 8 for ViT-S fp32 on 2 cores), and a slope through them put the load ~10%
        above what the capped batches take: admission then shed work the machine had time for."""
        points = self.profile.base.get(size) or self.profile.base[min(self.profile.base, key=lambda s: abs(s - size))]
        if self.batch_cap is not None:
            points = [p for p in points if p[0] <= self.batch_cap] or points[:1]
        n_hi, t_hi = points[-1]
        n_lo, t_lo = points[0]
        per = (t_hi - t_lo) / (n_hi - n_lo) if n_hi > n_lo else t_hi / n_hi
        return max(per, 1e-6) * self.factor(mode, adapters) * self.correction

    def observe(self, predicted_uncorrected_s: float, actual_s: float) -> None:
        """Fold one batch's real time into the correction (the rules in the module docstring), and its prediction
        error into the margin: on a busy 2-core machine a batch can take twice its prediction, and a deadline must
        survive that."""
        if predicted_uncorrected_s <= 0 or actual_s <= 0:
            return
        current = self._correction
        ratio = min(max(actual_s / predicted_uncorrected_s, CORRECTION_RANGE[0]), CORRECTION_RANGE[1])
        self._errors.append(actual_s / (predicted_uncorrected_s * current))
        self._recent.append(ratio)
        if ratio * SHIFT_RATIO < current:  # faster than any noise explains: the machine is at least this fast
            self._correction, self._slower = ratio, []
        else:
            self._correction = math.exp(math.log(current) + CORRECTION_ALPHA * (math.log(ratio) - math.log(current)))
            self._count_slower(ratio, current)
        self._observed_at = self.clock()
        self.observed += 1
        errors = sorted(self._errors)
        high = errors[min(len(errors) - 1, int(MARGIN_QUANTILE * len(errors)))]
        self.margin = min(max(high, MARGIN_RANGE[0]), MARGIN_RANGE[1])

    def _count_slower(self, ratio: float, current: float) -> None:
        """A run of SHIFT_BATCHES batches each SHIFT_RATIO slower than the correction before the run: the machine
        got slower, the correction becomes their median. Their errors were the model's, not noise: they are
        counted against the new correction, or the margin would stay at its cap for MARGIN_BATCHES batches and
        shed work the machine has time for."""
        if ratio <= (self._slower_than if self._slower else current) * SHIFT_RATIO:
            self._slower = []
            return
        if not self._slower:
            self._slower_than = current
        self._slower.append(ratio)
        if len(self._slower) < SHIFT_BATCHES:
            return
        self._correction = statistics.median(self._slower)
        for _ in self._slower:
            self._errors.pop()
        self._errors.extend(r / self._correction for r in self._slower)
        self._slower = []
