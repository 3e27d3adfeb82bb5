"""What every scheduling policy shares: the queue, deadline-aware batch filling, credits, shedding, priorities.

A policy (policies.py) only answers "which LoRA modes may serve the next batch, and which of their batches
is best". Everything else is here and the same for all policies, so the baselines run through the same
daemon as the V-LoRA policy and differ only in that choice:
- a batch never includes a request it would make late (predictions are stretched by the cost model's margin: the
  95th percentile of how late recent batches ran), and never runs longer than a share of the shortest deadline
  budget waiting (so whatever arrives meanwhile can still be served in time);
- a request's credit is its waiting time + its predicted execution time in a mode + the weight switch that
  mode needs; a request whose credit passes the starvation threshold goes first.

Deadlines and priorities (Request.priority: higher is more important; best-effort requests are never shed). Each
live request is, at planning time:
    late       it cannot meet its deadline even started now alone at the fastest plausible speed (the cost model's
               `fastest` correction, no margin; a deadline already passed is the plain case) -> shed
    doubtful   only the estimate (alone, cheapest mode, margin) says it would miss: the estimate may be wrong
    fits       the rest
- No request is shed on the estimate alone while lower-priority work is queued: a doubtful request above the lowest
  priority queued runs next, alone, ahead of that work (it is its only chance, and its measured time corrects the
  estimate); the lower tiers give way.
- A doubtful request of the lowest priority queued is shed while live work that fits can run instead (the reason
  names the higher priority that goes first, where one is queued), or while batches measured the machine lately
  (costs.measured_lately: the estimate is current, and only the margin's noise stands between it and its
  deadline). Otherwise nothing live fits and the estimate is old news: the engine would be idle, and the most urgent
  doubtful request runs alone, as a probe, instead of being shed, so that a too-high estimate (a profile measured
  on a busy machine, a slow spell that ended) is measured and corrected (costs.py: a batch faster than predicted
  corrects it at once), and the other doubtful requests, still queued, are served once it is. Without it nothing
  would run, nothing would be measured, and the estimate would never recover.
- A request is pressed when it could not wait for one more batch (now + its need + the batch time limit x margin
  passes its deadline). While a request above the lowest priority queued is pressed, the policy chooses the next
  batch among the requests of that priority and above only: lower tiers never push a higher one past its deadline.
Priority decides only under pressure: otherwise the policy's own order (earliest deadline, credits) holds, which
serves every tier in time when the machine can.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlora_va.contracts.requests import Request
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode
from vlora_va.engine.plan import BatchPlan, Catalog, SizeGroup
from vlora_va.serving.costs import CostModel


@dataclass(frozen=True)
class Shed:
    request: Request
    reason: str
    cause: str  # "deadline" | "overload" | "queue_full": the metric label


@dataclass(frozen=True)
class Settings:
    max_batch_images: int
    max_wait_s: float  # how long a partial batch waits for more requests
    starvation_s: float  # credit above this: the request is starving
    batch_share: float = 0.5  # a batch takes at most this share of the shortest deadline budget queued


@dataclass
class Option:
    """A candidate next batch: its mode, its requests and what it costs (corrected, raw, switch)."""

    mode: LoRAMode
    requests: list[Request]
    est_s: float
    raw_s: float
    switch_s: float
    follow_s: float = 0.0  # predicted time to serve what it leaves queued

    @property
    def images(self) -> int:
        return sum(r.num_images for r in self.requests)


class Scheduler:
    """Queue + the shared rules above. Subclasses implement `options`."""

    name = "base"
    # The LoRA mode costs (costs.mode_name) the start-up profile measures for this policy's decisions; merged is
    # the unit every factor is relative to and always there.
    measured_modes: tuple[str, ...] = ()

    def __init__(self, catalog: Catalog, costs: CostModel, settings: Settings, weights_slot: int | None = None):
        self.catalog, self.costs, self.settings = catalog, costs, settings
        self.queue: list[Request] = []
        self.weights_slot = weights_slot  # what the engine's base weights hold after the last plan
        self._alone: dict[int, tuple[float, float]] | None = None  # next_plan's alone estimates, by request
        # seconds a row needs after its compute to reach a local sink (serving/sink_leg.py, set by the daemon):
        # live work is planned to end this much before its deadline
        self.reserve_s = 0.0

    # ------------------------------------------------------------------ the queue
    def add(self, request: Request) -> None:
        self.queue.append(request)

    def extend(self, requests: list[Request]) -> None:
        self.queue.extend(requests)

    def drop_adapter(self, name: str) -> list[Request]:
        """Take every queued request of adapter `name` out of the queue (it was unloaded); returns them."""
        dropped = [r for r in self.queue if r.adapter == name]
        self.queue = [r for r in self.queue if r.adapter != name]
        return dropped

    def use_catalog(self, catalog: Catalog) -> None:
        """The engine's adapters changed (a load or an unload)."""
        self.catalog = catalog

    def weights_now(self, slot: int | None) -> None:
        """What the engine's base weights hold now, when that changed outside a plan (a failed batch, a reset)."""
        self.weights_slot = slot

    @property
    def queued_images(self) -> int:
        return sum(r.num_images for r in self.queue)

    def ready(self, now: float, stopping: bool = False) -> bool:
        """Run a batch now? When one is full, when the oldest request has waited max_wait, or when stopping."""
        if not self.queue:
            return False
        if stopping or self.queued_images >= self.settings.max_batch_images:
            return True
        return now - min(r.received for r in self.queue) >= self.settings.max_wait_s

    def next_plan(self, now: float) -> tuple[BatchPlan | None, list[Shed]]:
        """Shed what can no longer make it, then the next batch (None: nothing left to run): a doubtful request
        that must run first, alone, else the policy's best batch among the tiers that may be served now."""
        self._alone = {}  # within one round the costs and the weights do not change
        try:
            return self._next_plan(now)
        finally:
            self._alone = None

    def _next_plan(self, now: float) -> tuple[BatchPlan | None, list[Shed]]:
        shed = self.shed_hopeless(now)
        if not self.queue:
            return None, shed
        notes = {}
        first = self.first_in_line(now)
        if first is not None:
            options = [self.option(self.fallback_mode(first), [first])]
            notes["first"] = "precedence" if first.priority > self.lowest_priority() else "probe"
        else:
            tier = self.pressed_tier(now)
            options = [o for o in self.options_within(tier, now) if o.requests]
            if tier is not None:
                notes["tier"] = tier
            if not options:  # every request fits alone (none doubtful) yet no batch fits: run the most urgent
                r = edf([r for r in self.queue if tier is None or r.priority >= tier])[0]
                options = [self.option(self.fallback_mode(r), [r])]
        best = self.pick(options)
        taken = {id(r) for r in best.requests}
        self.queue = [r for r in self.queue if id(r) not in taken]
        self.weights_slot = best.mode.weights_slot
        plan = make_plan(best.requests, best.mode, self.catalog, est_s=best.est_s, raw_s=best.raw_s,
                         switch_s=best.switch_s)
        plan.notes = {"policy": self.name, "options": len(options), "follow_s": round(best.follow_s, 4), **notes}
        return plan, shed

    def drop_all(self, reason: str) -> list[Shed]:
        shed = [Shed(r, reason, "queue_full") for r in self.queue]
        self.queue = []
        return shed

    # ------------------------------------------------------------------ for policies
    def options(self, now: float) -> list[Option]:
        raise NotImplementedError

    def modes(self, slot: int) -> list[LoRAMode]:
        """The modes this policy could serve a request of adapter slot `slot` in (the hopeless test)."""
        raise NotImplementedError

    def modes_for(self, request: Request) -> list[LoRAMode]:
        return self.modes(self.slot(request))

    def warmup_modes(self, slot: int) -> list[LoRAMode]:
        """Every mode this policy may run a batch of slot `slot` in (warm-up runs each once)."""
        return self.modes(slot)

    def fallback_mode(self, request: Request) -> LoRAMode:
        return min(self.modes_for(request), key=lambda m: self.option(m, [request]).est_s)

    def pick(self, options: list[Option]) -> Option:
        """Least time to serve the queue (this batch + what it leaves), then most images now."""
        return min(options, key=lambda o: (o.est_s + o.follow_s, -o.images))

    def slot(self, request: Request) -> int:
        return self.catalog.adapters[request.adapter].slot

    def needs_switch(self, mode: LoRAMode) -> bool:
        return self.catalog.has_lora and mode.weights_slot != self.weights_slot

    def option(self, mode: LoRAMode, requests: list[Request], after: int | None = ...) -> Option:
        """Cost `requests` as one batch in `mode`, the weights holding `after` before it (default: now)."""
        before = self.weights_slot if after is ... else after
        by_size: dict[int, list[Request]] = {}
        for r in requests:
            by_size.setdefault(self.catalog.adapters[r.adapter].size, []).append(r)
        shape = {}
        for size, group in by_size.items():
            prefix, distinct = shared_prefix(group, mode, self.catalog)
            shape[size] = (sum(r.num_images for r in group), len({r.adapter for r in group}), prefix, distinct,
                           self.catalog.blocks)
        switching = self.catalog.has_lora and mode.weights_slot != before
        est = self.costs.plan_s(shape, mode, switching)
        corr = self.costs.correction
        switch = self.costs.profile.switch_s * corr if switching else 0.0
        return Option(mode, list(requests), est, est / corr, switch)

    def credit(self, request: Request, mode: LoRAMode, now: float) -> float:
        """Waiting time + predicted execution time in `mode` + the switch that mode needs."""
        return now - request.received + self.option(mode, [request]).est_s

    def starving(self, request: Request, mode: LoRAMode, now: float) -> bool:
        return self.credit(request, mode, now) > self.settings.starvation_s

    def order(self, requests: list[Request], now: float, mode: LoRAMode) -> list[Request]:
        """Live before best-effort; starving first; then earliest deadline first."""
        return sorted(requests, key=lambda r: (r.best_effort, not self.starving(r, mode, now), r.deadline,
                                               r.received, r.stream, r.seq))

    def batch_limit_s(self, requests: list[Request] | None = None) -> float:
        """The longest batch the queue (or `requests`, what may still be served) allows."""
        live = [r.deadline - self.reserve_s - r.ready for r in (self.queue if requests is None else requests)
                if not r.best_effort]
        return self.settings.batch_share * min(live) if live else float("inf")

    def fill(self, candidates: list[Request], mode: LoRAMode, now: float) -> Option:
        """The batch `fill_in_order` makes; under overload, the one that skips the requests too close to their
        deadline for a full batch, where that serves more images.

        Why: in order, the queue's head caps the batch at what its slack allows. Under overload the head is
        always near its deadline, so every batch is small, and where a batch's cost is far from linear in images
        (a GPU: 64 images cost ~6x one) small batches lose most of the machine: simulated at 3x load, 0.15x
        capacity served in deadline, mean batch 1.5 images (tests/serving/scheduling). The skipped requests
        stay queued and are shed once hopeless: they were going to miss anyway, or cost what later ones need.
        A request of a higher priority than the lowest queued is never skipped for lower ones (under overload the
        higher tiers keep their frames: admission.py)."""
        s = self.settings
        best = self.fill_in_order(candidates, mode, now)
        queued = sum(r.num_images for r in candidates)
        if queued < s.max_batch_images or 2 * best.images >= s.max_batch_images:
            return best  # no overload, or the batch is full enough
        head, images = [], 0
        for r in candidates:  # a full batch's worth of the queue: what the skipped requests would have to allow
            if images + r.num_images > s.max_batch_images:
                break
            head.append(r)
            images += r.num_images
        need = self.option(mode, head).est_s * self.costs.margin
        lowest = min(r.priority for r in candidates)
        roomy = [r for r in candidates if self.finish_by(r) >= now + need or r.priority > lowest]
        # the skipped requests' short budgets no longer limit the batch: the roomy ones' do
        alt = self.fill_in_order(roomy, mode, now, self.batch_limit_s(roomy))
        return alt if alt.images > best.images else best

    def fill_in_order(self, candidates: list[Request], mode: LoRAMode, now: float,
                      limit: float | None = None) -> Option:
        """Take candidates in order while the batch fits max_batch_images, every member still meets its
        deadline (with the cost model's margin), and the batch stays within the time limit (default: the
        queue's, batch_limit_s)."""
        s = self.settings
        limit = self.batch_limit_s() if limit is None else limit
        chosen: list[Request] = []
        best = self.option(mode, [])
        images, earliest = 0, float("inf")
        for r in candidates:
            if images + r.num_images > s.max_batch_images and (chosen or r.num_images <= s.max_batch_images):
                continue  # a request larger than a whole batch still runs, alone
            trial = self.option(mode, chosen + [r])
            finish = now + trial.est_s * self.costs.margin
            if finish > min(earliest, self.finish_by(r)) or (chosen and trial.est_s > limit):
                continue
            chosen.append(r)
            best, images, earliest = trial, images + r.num_images, min(earliest, self.finish_by(r))
        return best

    def follow(self, option: Option, modes: list[LoRAMode]) -> float:
        """Predicted time to serve what `option` leaves queued, in the cheapest of `modes`, starting from
        the weights `option` leaves (a lookahead of one step: a batch that is cheap now but leaves an
        expensive rest is not a good batch)."""
        taken = {id(r) for r in option.requests}
        rest = [r for r in self.queue if id(r) not in taken]
        if not rest:
            return 0.0
        after = option.mode.weights_slot
        costs = []
        for m in modes:
            if m.kind == MERGED and any(self.slot(r) != m.slot for r in rest):
                continue
            costs.append(self.option(m, rest, after=after).est_s)
        return min(costs) if costs else float("inf")

    # ------------------------------------------------------------------ deadlines and priorities (the docstring)
    def alone_s(self, request: Request) -> tuple[float, float]:
        """(predicted, profiled) seconds of `request` alone now in the cheapest mode this policy has: corrected
        and without the margin, and before the correction."""
        known = self._alone.get(id(request)) if self._alone is not None else None
        if known is None:
            best = min((self.option(m, [request]) for m in self.modes_for(request)), key=lambda o: o.est_s)
            known = (best.est_s, best.raw_s)
            if self._alone is not None:
                self._alone[id(request)] = known
        return known

    def need(self, request: Request) -> float:
        """Predicted seconds to serve `request` alone now, with the cost model's margin."""
        return self.alone_s(request)[0] * self.costs.margin

    def finish_by(self, request: Request) -> float:
        """When its compute must end: its deadline less the sink leg (reserve_s), or never for best-effort work."""
        return due(request) - self.reserve_s

    def late(self, request: Request, now: float) -> bool:
        """Cannot meet its deadline even started now, alone, at the fastest speed plausible (no margin)."""
        return now + self.alone_s(request)[1] * self.costs.fastest > self.finish_by(request)

    def doubtful(self, request: Request, now: float) -> bool:
        """Only the estimate says it would miss its deadline (started now, alone, with the margin)."""
        return now + self.need(request) > self.finish_by(request)

    def pressed(self, request: Request, now: float, limit: float) -> bool:
        """It could not wait for one more batch of at most `limit` predicted seconds."""
        return now + self.need(request) + limit * self.costs.margin > self.finish_by(request)

    def lowest_priority(self) -> int:
        return min(r.priority for r in self.queue)

    def shed_hopeless(self, now: float) -> list[Shed]:
        """Shed the late requests; and the doubtful ones of the lowest priority queued while live work that fits
        can run instead or the estimate is current (the module docstring). Every other doubtful request stays:
        first_in_line serves it."""
        shed = [Shed(r, self.hopeless_reason(r, now), "deadline") for r in self.queue if self.late(r, now)]
        gone = {id(x.request) for x in shed}
        self.queue = [r for r in self.queue if id(r) not in gone]
        if not self.queue:
            return shed
        lowest = self.lowest_priority()
        doubtful = [r for r in self.queue if self.doubtful(r, now)]
        fits = [r for r in self.queue if not r.best_effort and not self.doubtful(r, now)]
        if not doubtful or not (fits or self.costs.measured_lately):
            return shed
        above = max(r.priority for r in self.queue if not r.best_effort)
        give_way = [r for r in doubtful if r.priority == lowest]
        shed += [Shed(r, self.hopeless_reason(r, now, above), "deadline") for r in give_way]
        gone = {id(r) for r in give_way}
        self.queue = [r for r in self.queue if id(r) not in gone]
        return shed

    def hopeless_reason(self, request: Request, now: float, above: int | None = None) -> str:
        need, left = self.need(request) * 1000, max(0.0, self.finish_by(request) - now) * 1000
        reason = f"cannot meet its deadline: needs ~{need:.0f} ms, {left:.0f} ms left"
        if above is not None and above > request.priority:
            reason += f"; priority {above} work goes first"
        return reason

    def first_in_line(self, now: float) -> Request | None:
        """The doubtful request that runs next, alone, or None: one of the highest doubtful priority above the
        lowest queued (unless a still higher priority is pressed: it goes first), or, when no live request fits,
        a probe. Of those, the earliest deadline: if the estimate was wrong, the others are served once its time
        has corrected it, and they have longer to wait for that."""
        doubtful = [r for r in self.queue if self.doubtful(r, now)]
        if not doubtful:
            return None
        lowest = self.lowest_priority()
        ahead = [r for r in doubtful if r.priority > lowest]
        if not ahead:
            # All of the lowest priority: shed_hopeless kept them because nothing live fits and the estimate is old
            # news. The engine would be idle: probe the estimate instead.
            ahead = doubtful
        top = max(r.priority for r in ahead)
        tier = self.pressed_tier(now)
        if tier is not None and tier > top:
            return None
        return edf([r for r in ahead if r.priority == top])[0]

    def pressed_tier(self, now: float) -> int | None:
        """The highest priority with a pressed request, where lower priorities are queued (they wait for the next
        batch); None: no restriction."""
        limit = self.batch_limit_s()
        pressed = [r.priority for r in self.queue if self.pressed(r, now, limit)]
        tier = max(pressed, default=None)
        return tier if tier is not None and tier > self.lowest_priority() else None

    def options_within(self, tier: int | None, now: float) -> list[Option]:
        """The policy's options among the requests of priority `tier` and above (None: all). Policies read
        self.queue, so the lower tiers are set aside while they choose."""
        if tier is None:
            return self.options(now)
        everything = self.queue
        self.queue = [r for r in everything if r.priority >= tier]
        try:
            return self.options(now)
        finally:
            self.queue = everything


def shared_prefix(requests: list[Request], mode: LoRAMode, catalog: Catalog) -> tuple[int, int]:
    """(blocks that can run once per distinct frame, distinct frames) for requests at one image size. The
    prefix ends at the first block any of their adapters touches (and the merged adapter's, whose ΔW is in
    the weights); it is 0 when no frame is looked at twice (nothing to share)."""
    keys = [k for r in requests for k in r.frame_keys]
    distinct = len(set(keys))
    if distinct == len(keys):
        return 0, distinct
    first = [catalog.adapters[r.adapter].first_block for r in requests]
    if mode.slot is not None:
        first += [a.first_block for a in catalog.adapters.values() if a.slot == mode.slot]
    return min(first), distinct


def make_plan(requests: list[Request], mode: LoRAMode, catalog: Catalog, **kw) -> BatchPlan:
    """Group the requests by the image size their adapters run at (one backbone forward per size), each
    group with its shared prefix."""
    by_size: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        by_size.setdefault(catalog.adapters[r.adapter].size, []).append(i)
    groups = tuple(SizeGroup(size, tuple(m), shared_prefix([requests[i] for i in m], mode, catalog)[0])
                   for size, m in sorted(by_size.items()))
    return BatchPlan(list(requests), mode, groups, **kw)


def edf(requests: list[Request]) -> list[Request]:
    """Earliest deadline first, live work before best-effort work."""
    return sorted(requests, key=lambda r: (r.best_effort, r.deadline, r.received, r.stream, r.seq))


def due(request: Request) -> float:
    """The time a request must be finished by: its deadline, or never for best-effort work."""
    return float("inf") if request.best_effort else request.deadline


def dominant_adapter(requests: list[Request]) -> str:
    """The adapter with the most queued images (ties: the earliest deadline)."""
    images: dict[str, int] = {}
    first: dict[str, float] = {}
    for r in requests:
        images[r.adapter] = images.get(r.adapter, 0) + r.num_images
        first[r.adapter] = min(first.get(r.adapter, r.deadline), r.deadline)
    return min(images, key=lambda a: (-images[a], first[a]))


__all__ = ["Scheduler", "Settings", "Shed", "Option", "dominant_adapter", "edf", "due", "make_plan", "shared_prefix", "MERGED", "MIXTURE", "PREMERGED",
           "UNMERGED", "LoRAMode"]
