"""Admission: which received requests go to the scheduler's queue, and what sustained overload does.

    received requests ─► unservable? (unknown or failed adapter, wrong frame size)  ─► refused: an error row
                      ─► their adapter is being loaded (vlora-va adapters load)     ─► held until it is in
                      ─► overload control (below)                                   ─► shed (a row) or thinned
                      ─► the scheduler's queue

Overload control: when the offered work exceeds what this machine can do, the lowest priorities give way first,
in the way the operator chose (`daemon.degrade`), and the daemon says so. Every arriving request's predicted
compute (cost model, corrected online) is added to its priority tier's load over a sliding window. Tiers are
served from the highest down: each gets the share of capacity the tiers above it left,
`fraction = min(1, left / load)`. A tier at fraction < 1 is degraded:
    shed     admit that fraction of its requests, evenly spread per stream and task; shed the rest
    stride   serve every k-th chunk of its streams (k = ceil(1 / fraction)); shed the others
    frames   send fewer frames of each clip (evenly spaced, never below what the head accepts); where that
             is not enough, stride
Below capacity every fraction is 1 and nothing is touched. Requests the scheduler still cannot fit are shed
as hopeless there: this only keeps the admitted load near what the machine can do.

A degraded tier still admits a request while the work queued ahead of it, with its own, fits in BACKLOG_SHARE of
its remaining deadline budget (`backlog_s`, from the daemon's queue): the engine will serve it in time, so shedding
it would only leave the engine idle later. Ahead of it is the live work of its own priority and above only: the
scheduler lets the lower tiers give way whenever a higher one would miss its deadline (scheduling/base.py), so they
do not delay it, and a request is never shed for lower-priority work queued (a tier never faces a stricter test
than the tiers below it). The load average says *that* the machine is overloaded; the queue says
whether it is *now*. Without this, a burst (a quiet camera sending its frames again, a walk-through) lifted the
5-s average past the target and shed a chunk the machine had time for (bench/capacity.py: 1 busy + 2 quiet cameras
at 1.4 of 2 cores, 1 chunk of 45 shed in every window). Best-effort requests (files
read as fast as possible) are never shed: the transport's backpressure paces their source.

The window's load is kept in profile seconds and costed at the cost model's latest correction: a correction learnt
a moment ago (a profile found 3x too slow after the first batches, a competing load that ended) applies to the whole
window at once, not only to what arrives after it, or work that arrived under the wrong estimate would keep a tier
degraded for a whole window and shed requests the machine has time for.

Background work that shares the engine's cores (an adapter loaded at run time compiling its backend models,
AdapterSlots.busy_share) takes its share off the capacity while it runs: the target is target x (1 - share), and
the queued work counts as that much slower. The cost model's online correction would see the slower batches only
after they ran, a few batches into the compile.
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, field, replace

from vlora_va.contracts.requests import Request
from vlora_va.engine.plan import Catalog
from vlora_va.serving.costs import CostModel

log = logging.getLogger(__name__)

WINDOW_S = 5.0  # the load is measured over this long: overload must last about this long to act
MIN_SPAN_S = 1.0
TARGET_UTILISATION = 0.95  # of the engine's time: some is lost to batching and switches
BACKLOG_SHARE = 0.5  # a request is admitted whatever the load while the queue ahead takes this share of its budget
REPORT_EVERY_S = 10.0  # a degraded tier's state is logged at most this often
MAX_CREDITS = 4096  # (stream, task) pairs whose admitted share is spread (the least recent are forgotten)


@dataclass(frozen=True)
class Verdict:
    """What overload control says of one request."""

    request: Request | None  # what to queue (possibly thinned), or None: shed
    reason: str | None = None  # why it was shed or thinned
    thinned_from: int = 0  # frames the request had before thinning (0: untouched)


class OverloadControl:
    def __init__(self, degrade: str = "shed", window_s: float = WINDOW_S, target: float = TARGET_UTILISATION):
        if degrade not in ("shed", "stride", "frames"):
            raise ValueError(f"degrade must be shed, stride or frames, got {degrade!r}")
        self.degrade, self.window_s, self.target = degrade, window_s, target
        # (time, tier, profile seconds): what each arrival costs before the online correction
        self._arrivals: collections.deque[tuple[float, int, float]] = collections.deque()
        self._load: dict[int, float] = {}  # profile seconds per tier over the window
        self._correction = 1.0  # the cost model's latest correction: what a profile second costs now
        self._first: float | None = None
        self._credit: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self.fractions: dict[int, float] = {}
        self._reported: dict[int, tuple[float, float]] = {}  # tier -> (fraction, when) last logged

    def load(self, now: float) -> float:
        """Offered compute, in seconds of engine time per second, over the window."""
        self._expire(now)
        return sum(self._load.values()) * self._correction / self._span(now)

    def _span(self, now: float) -> float:
        return max(MIN_SPAN_S, min(self.window_s, now - (self._first if self._first is not None else now)))

    def _expire(self, now: float) -> None:
        # (now - window, now]: measured at an arrival, a periodic stream counts window / period arrivals, not one more
        while self._arrivals and self._arrivals[0][0] <= now - self.window_s:
            _, tier, cost = self._arrivals.popleft()
            self._load[tier] -= cost

    def _update(self, now: float, busy: float = 0.0) -> None:
        span = self._span(now)
        left = self.target * (1.0 - busy)
        fractions = {}
        for tier in sorted(self._load, reverse=True):
            load = max(0.0, self._load[tier]) * self._correction / span
            fractions[tier] = 1.0 if load <= left else max(0.0, left / load)
            left = max(0.0, left - load * fractions[tier])
        self.fractions = fractions

    def admit(self, request: Request, cost_s: float, now: float, min_frames: int,
              backlog_s: float | None = None, busy: float = 0.0, correction: float = 1.0) -> Verdict:
        """Record the request's predicted cost and decide what happens to it. cost_s: its predicted engine time,
        made with the cost model's `correction` (the current one); backlog_s: the predicted engine time of the live
        work of its priority and above queued now (None: not known, the load alone decides); busy: the share of the
        cores background work takes now (0: none)."""
        busy = min(max(busy, 0.0), 0.9)  # some capacity always stays: the compile ends
        if self._first is None:  # the first request stands for the chunk of media before it (~1 s), or a
            self._first = now - MIN_SPAN_S  # second chunk a moment later would read as twice the load
        tier = request.priority
        self._correction = correction
        self._arrivals.append((now, tier, cost_s / correction))
        self._load[tier] = self._load.get(tier, 0.0) + cost_s / correction
        self._expire(now)
        self._update(now, busy)
        fraction = self.fractions.get(tier, 1.0)
        self._report(tier, now)
        if fraction >= 1.0 or (backlog_s is not None
                               and (backlog_s + cost_s) / (1.0 - busy) <= BACKLOG_SHARE * (request.deadline - now)):
            return Verdict(request)
        if self.degrade == "frames":
            keep = max(min_frames, math.ceil(request.num_images * fraction))
            if keep < request.num_images:
                reason = f"overload: {keep} of {request.num_images} frames"
                return Verdict(thin(request, keep, reason), reason, request.num_images)
        if self.degrade in ("stride", "frames"):
            k = math.ceil(1.0 / max(fraction, 1e-3))
            if request.seq % k == 0:
                return Verdict(request)
            return Verdict(None, f"overload: priority {tier} serves every {k}th chunk")
        key = (request.stream, request.task)  # shed: an even spread of the admitted share per stream and task
        credit = self._credit.pop(key, 0.0) + fraction
        if len(self._credit) >= MAX_CREDITS:  # bounded whatever stream ids senders invent
            self._credit.popitem(last=False)
        if credit >= 1.0:
            self._credit[key] = credit - 1.0
            return Verdict(request)
        self._credit[key] = credit
        return Verdict(None, f"overload: priority {tier} work shed to fit this machine "
                               f"(about {round(fraction * 10) * 10}% admitted)")

    def _report(self, tier: int, now: float) -> None:
        """Log when a tier becomes degraded or recovers, and while degraded at most every REPORT_EVERY_S."""
        f = self.fractions.get(tier, 1.0)
        was, when = self._reported.get(tier, (1.0, -1e18))
        if (f < 1.0) != (was < 1.0) or (f < 1.0 and now - when >= REPORT_EVERY_S):
            if f < 1.0:
                log.warning("overload: %.2f s of compute offered per second; priority %d work degraded (%s) to "
                            "about %.0f%%", self.load(now), tier, self.degrade, f * 100)
            else:
                log.info("overload over: priority %d work served in full again", tier)
            self._reported[tier] = (f, now)


def thin(request: Request, keep: int, reason: str = "") -> Request:
    """The request with `keep` of its frames, evenly spread (the middle of each of keep equal parts); `reason` is
    what its row will say (`degraded`)."""
    n = request.num_images
    idx = [int((2 * i + 1) * n // (2 * keep)) for i in range(keep)]
    return replace(request, frames=[request.frames[i] for i in idx], frame_ts=[request.frame_ts[i] for i in idx],
                   degraded=reason or request.degraded)


@dataclass
class Admitted:
    """What admission made of one chunk's requests."""

    queue: list[Request] = field(default_factory=list)  # for the scheduler
    held: list[Request] = field(default_factory=list)  # their adapter is being loaded: they wait for it
    # (request, status, reason, shed cause or None): each gets its row now
    refused: list[tuple[Request, str, str, str | None]] = field(default_factory=list)


class Admission:
    def __init__(self, costs: CostModel, degrade: str = "shed"):
        self.costs = costs
        self.overload = OverloadControl(degrade)

    def admit(self, requests: list[Request], catalog: Catalog, failed: dict[str, str], waiting: set[str],
              now: float, queued: list[Request] | None = None, busy: float = 0.0) -> Admitted:
        """Sort one chunk's requests (see the module docstring). failed: adapters that could not be loaded (name ->
        why); waiting: adapters whose requests are held (being loaded, or compiled for the backend:
        AdapterSlots.waiting); queued: the scheduler's queue (None: not known); busy: the share of the cores
        background work takes now (AdapterSlots.busy_share)."""
        out = Admitted()
        mode = catalog.resting_mode()
        # the live work queued, (priority, predicted seconds): best-effort work goes after it, so it delays nothing
        # admitted here; for each request only its own priority and above count (the module docstring)
        ahead = None if queued is None else [(r.priority, self._cost(r, catalog, mode)) for r in queued
                                              if r.adapter in catalog.adapters and not r.best_effort]
        for req in requests:
            if req.adapter in waiting:
                out.held.append(req)  # within its deadline (runtime adapters shed it when that passes)
                continue
            problem = unservable(req, catalog, failed)
            if problem:
                out.refused.append((req, "error", problem, None))
                continue
            if req.best_effort:  # not live: never shed; the transport's backpressure paces its source
                out.queue.append(req)
                continue
            info = catalog.adapters[req.adapter]
            cost = self._cost(req, catalog, mode)
            backlog = None if ahead is None else sum(c for p, c in ahead if p >= req.priority)
            verdict = self.overload.admit(req, cost, now, info.min_frames, backlog, busy, self.costs.correction)
            if verdict.request is None:
                out.refused.append((req, "shed", verdict.reason, "overload"))
                continue
            out.queue.append(verdict.request)  # possibly thinned: its row says so (degraded)
            if ahead is not None:
                ahead.append((req.priority, self._cost(verdict.request, catalog, mode)))
        return out

    def _cost(self, req: Request, catalog: Catalog, mode) -> float:
        """What the request's images cost in the mode that serves most batches (no switch)."""
        return self.costs.image_s(catalog.adapters[req.adapter].size, mode) * req.num_images


def unservable(req: Request, catalog: Catalog, failed: dict[str, str]) -> str | None:
    """Why a request cannot be served at all, or None."""
    if req.adapter in failed:
        return f"adapter {req.adapter!r} failed to load: {failed[req.adapter]}"
    if req.adapter not in catalog.adapters:
        return f"unknown adapter {req.adapter!r} (loaded: {', '.join(catalog.adapters) or 'none'})"
    shape = req.frames[0].shape
    if shape[0] != catalog.image_size or shape[1] != catalog.image_size:
        return f"frames are {shape[1]}x{shape[0]} but the daemon's image_size is {catalog.image_size}"
    return None
