"""The scheduling policies on a hand-written cost profile (conftest.py): which mode, which requests, what is
shed, and the starvation bound, checked by running the real schedulers on a simulated clock."""

from __future__ import annotations

import random

import pytest

from tests.serving.scheduling.conftest import catalog, profile, request
from vlora_va.contracts.plugins import POLICIES
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode
from vlora_va.serving.costs import CostModel, CostProfile
from vlora_va.serving.scheduling import Settings

NOW = 1000.0


def scheduler(policy, cat=None, costs=None, starvation_s=0.5, max_batch=8, weights_slot=None):
    cat = cat or catalog(max_batch=max_batch)
    return POLICIES.load(policy)(cat, costs or CostModel(profile()), Settings(max_batch, 0.02, starvation_s), weights_slot)


def test_a_request_that_cannot_make_its_deadline_is_shed_with_the_reason():
    s = scheduler("vlora")
    late = request("a", NOW, deadline_s=0.05)  # one 224-px image needs ~60 ms (x1.1 margin)
    fine = request("a", NOW, deadline_s=2.0)
    s.add(late)
    s.add(fine)
    plan, shed = s.next_plan(NOW)
    assert [x.request for x in shed] == [late] and shed[0].cause == "deadline"
    assert "cannot meet its deadline: needs ~66 ms, 50 ms left" == shed[0].reason
    assert plan.requests == [fine]


def test_a_batch_never_includes_a_request_it_would_make_late():
    s = scheduler("edf")
    urgent = request("a", NOW, deadline_s=0.2)  # alone 60 ms; with 3 more images 210 ms: too late for it
    others = [request("b", NOW, deadline_s=5.0) for _ in range(3)]
    for r in [urgent, *others]:
        s.add(r)
    plan, shed = s.next_plan(NOW)
    assert not shed
    assert urgent in plan.requests and plan.est_s * s.costs.margin <= urgent.deadline - NOW
    assert len(plan.requests) < 4  # the rest waits for the next batch
    assert s.queue  # ...which it can still make


def test_batches_stay_within_half_the_shortest_deadline_budget():
    s = scheduler("edf", max_batch=64)
    for _ in range(30):  # 30 images at 336 px: 3 s of work; deadlines of 2 s allow 1 s batches
        s.add(request("a", NOW, deadline_s=30.0))
    s.add(request("b", NOW, deadline_s=2.0))
    s.catalog.adapters["a"]  # all at 224 px in this catalog
    plan, _ = s.next_plan(NOW)
    assert plan.est_s <= 1.0 + 1e-9


def test_max_batch_images_is_respected_and_an_oversized_request_runs_alone():
    s = scheduler("edf", max_batch=4)
    big = request("a", NOW, images=6, deadline_s=10)
    s.add(big)
    s.add(request("a", NOW, deadline_s=10))
    plan, _ = s.next_plan(NOW)
    assert plan.requests == [big]
    plan, _ = s.next_plan(NOW)
    assert plan.images == 1


def test_edf_serves_earliest_deadline_first_in_its_one_mode():
    s = scheduler("edf", max_batch=2)
    reqs = [request("a", NOW, deadline_s=d) for d in (5.0, 1.0, 3.0, 2.0)]
    for r in reqs:
        s.add(r)
    plan, _ = s.next_plan(NOW)
    assert plan.requests == [reqs[1], reqs[3]] and plan.mode == LoRAMode(PREMERGED)
    no_premerge = scheduler("edf", cat=catalog(premerge=False))
    no_premerge.add(request("a", NOW))
    assert no_premerge.next_plan(NOW)[0].mode == LoRAMode(UNMERGED)


def test_merge_only_merges_the_earliest_deadline_requests_adapter():
    s = scheduler("merge-only")
    for a, d in (("b", 3.0), ("a", 1.0), ("b", 2.0), ("a", 4.0)):
        s.add(request(a, NOW, deadline_s=d))
    plan, _ = s.next_plan(NOW)
    assert plan.mode == LoRAMode(MERGED, 0) and {r.adapter for r in plan.requests} == {"a"}
    assert plan.switch_s > 0  # the weights held nothing
    plan, _ = s.next_plan(NOW)
    assert plan.mode == LoRAMode(MERGED, 1) and len(plan.requests) == 2


def test_dlora_merges_a_long_queue_and_unmerges_with_einsum_otherwise():
    s = scheduler("dlora", max_batch=8)
    for _ in range(4):
        s.add(request("a", NOW))
    s.add(request("b", NOW))
    plan, _ = s.next_plan(NOW)
    assert plan.mode == LoRAMode(MERGED, 0) and all(r.adapter == "a" for r in plan.requests)
    s = scheduler("dlora", max_batch=8)
    for a in "abcd":
        s.add(request(a, NOW))
    assert s.next_plan(NOW)[0].mode == LoRAMode(UNMERGED, impl="einsum")


def test_vlora_prefers_premerged_for_a_mixed_queue_when_it_is_resident():
    s = scheduler("vlora")
    for a in "abcdabcd":
        s.add(request(a, NOW))
    plan, _ = s.next_plan(NOW)
    assert plan.mode == LoRAMode(PREMERGED) and plan.images == 8


def test_vlora_without_premerged_weights_merges_the_dominant_adapter_when_nothing_starves():
    s = scheduler("vlora", cat=catalog(premerge=False))
    for _ in range(7):
        s.add(request("a", NOW))
    s.add(request("b", NOW))
    plan, _ = s.next_plan(NOW)
    assert plan.mode == LoRAMode(MERGED, 0) and [r.adapter for r in plan.requests] == ["a"] * 7


def test_vlora_serves_starving_requests_in_mixture_mode_beside_the_merged_adapter():
    s = scheduler("vlora", cat=catalog(premerge=False), weights_slot=0)
    for _ in range(6):
        s.add(request("a", NOW))
    starving = request("b", NOW, waited_s=0.6)
    s.add(starving)
    plan, _ = s.next_plan(NOW)
    assert plan.mode == LoRAMode(MIXTURE, 0) and starving in plan.requests and plan.switch_s == 0


def test_vlora_unmerges_when_starving_requests_exceed_half_a_batch():
    s = scheduler("vlora", cat=catalog(premerge=False), weights_slot=0, max_batch=8)
    for _ in range(6):
        s.add(request("a", NOW))
    for a in "bcdbcd":
        s.add(request(a, NOW, waited_s=0.6))
    plan, _ = s.next_plan(NOW)
    assert plan.mode == LoRAMode(UNMERGED)


def simulate(policy, arrivals, premerge, seconds=20.0, starvation_s=0.4, costs=None, max_batch=8):
    """Run a scheduler on a simulated clock: each plan takes its predicted time. Returns the served requests
    with (start, finish) and the longest batch."""
    s = scheduler(policy, cat=catalog(premerge=premerge, max_batch=max_batch), costs=costs, starvation_s=starvation_s,
                  max_batch=max_batch)
    pending = sorted(arrivals, key=lambda r: r.received)
    now, served, longest, shed = NOW, [], 0.0, []
    while now < NOW + seconds and (pending or s.queue):
        while pending and pending[0].received <= now:
            s.add(pending.pop(0))
        if not s.ready(now, stopping=not pending):
            now = pending[0].received if pending else now + 0.01
            continue
        plan, dropped = s.next_plan(now)
        shed += dropped
        if plan is None:
            continue
        served += [(r, now, now + plan.est_s) for r in plan.requests]
        longest = max(longest, plan.est_s)
        now += plan.est_s
    return served, longest, shed


@pytest.mark.parametrize("policy", ["vlora", "dlora", "edf"])
@pytest.mark.parametrize("premerge", [True, False])
def test_starvation_bound_no_request_waits_past_the_threshold_plus_one_batch(policy, premerge):
    """90% of requests for one adapter at ~70% load: a minority request that can still meet its deadline is
    served within the starvation threshold plus one batch."""
    rnd = random.Random(3)
    arrivals, t = [], NOW
    while t < NOW + 15:
        t += rnd.expovariate(11.0)  # ~11 images/s of ~16/s capacity
        adapter = "a" if rnd.random() < 0.9 else rnd.choice("bcd")
        r = request(adapter, t, deadline_s=3.0)
        arrivals.append(r)
    served, longest, shed = simulate(policy, arrivals, premerge, starvation_s=0.4)
    assert not shed and len(served) == len(arrivals)
    waits = [start - r.received for r, start, _ in served]
    assert max(waits) <= 0.4 + longest + 0.02, (max(waits), longest)
    assert all(finish <= r.deadline for r, _, finish in served)


def test_under_overload_served_work_still_meets_its_deadline():
    """Three times what the engine can do: what is served is in time, the rest is shed before compute."""
    arrivals = [request("abcd"[i % 4], NOW + i * 0.02, deadline_s=1.0) for i in range(750)]  # 50 images/s
    served, _, shed = simulate("vlora", arrivals, premerge=True, seconds=60.0)
    assert shed and served
    assert all(finish <= r.deadline for r, _, finish in served)
    assert len(served) + len(shed) == len(arrivals)


@pytest.mark.parametrize("policy", ["vlora", "edf"])
def test_at_three_times_a_gpus_capacity_batches_stay_full_and_serve_its_capacity(policy):
    """Where a batch of 64 costs 6.5x one image (a GPU: ViT-L at 448 px on an H200), serving the queue's head
    first makes every batch as small as the head's slack allows: at 3x load that served 0.15x capacity in
    deadline, in batches of 1.5 images. Batches that skip the requests too close to their deadline stay full."""
    points = [(1, 0.020), (2, 0.022), (4, 0.026), (8, 0.033), (16, 0.045), (32, 0.075), (64, 0.130)]
    gpu = CostModel(CostProfile(key={"test": "gpu"}, base={224: points},
                                factors={k: {1: 1.0} for k in ("merged", "premerged", "unmerged", "mixture")},
                                switch_s=0.001))
    capacity = 64 / 0.130  # images/s in full batches
    rnd = random.Random(1)
    n = int(3 * capacity * 5)
    arrivals = [request("a" if rnd.random() < 0.9 else rnd.choice("bcd"), NOW + i / (3 * capacity), deadline_s=0.39)
                for i in range(n)]
    served, _, shed = simulate(policy, arrivals, premerge=True, seconds=6.0, costs=gpu, max_batch=64)
    in_deadline = [r for r, _, finish in served if finish <= r.deadline]
    assert len(in_deadline) == len(served) and len(served) + len(shed) == n  # every request answered once
    assert len(in_deadline) / 5.0 >= 0.9 * capacity, (len(in_deadline) / 5.0, capacity)


def test_under_overload_a_full_batch_never_skips_a_higher_priority_request():
    """The full-batch rule skips urgent requests only among the lowest priority queued: a tracked task's frame
    (priority 1) near its deadline still runs, even if that makes the batch small."""
    s = scheduler("edf", max_batch=8)
    urgent = request("a", NOW, deadline_s=0.2, priority=1)  # alone 60 ms; in a full batch of 8 (~0.4 s) too late
    low_urgent = request("a", NOW, deadline_s=0.2)
    for r in [urgent, low_urgent] + [request("b", NOW, deadline_s=5.0) for _ in range(12)]:
        s.add(r)
    plan, _ = s.next_plan(NOW)
    assert urgent in plan.requests
    s2 = scheduler("edf", max_batch=8)
    for r in [low_urgent] + [request("b", NOW, deadline_s=5.0) for _ in range(12)]:
        s2.add(r)
    plan2, _ = s2.next_plan(NOW)
    assert low_urgent not in plan2.requests and len(plan2.requests) == 8  # the same urgency at the lowest priority


@pytest.mark.parametrize("policy", ["vlora", "edf", "dlora"])
def test_best_effort_work_is_never_shed_and_waits_for_live_work(policy):
    s = scheduler(policy, max_batch=2)
    old = request("a", NOW, deadline_s=1.0, waited_s=5.0)  # a file read as fast as possible: long overdue
    old.best_effort = True
    live = [request("a", NOW, deadline_s=2.0) for _ in range(2)]
    for r in (old, *live):
        s.add(r)
    plan, shed = s.next_plan(NOW)
    assert not shed and plan.requests == live  # live work first, though the file's chunk is older
    plan, shed = s.next_plan(NOW + plan.est_s)
    assert not shed and plan.requests == [old]
