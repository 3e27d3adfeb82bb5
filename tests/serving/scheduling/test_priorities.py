"""Priorities and deadlines when the cost estimate is wrong: a profile measured 3x too slow (other processes busy
while the daemon started), one 3x too fast, and a competing load that doubles every batch's time for a while. The
rules (scheduling/base.py) first, one plan at a time; then simulated.

The simulations run the real scheduler in a small discrete-time loop. The test keeps its own books: what a batch
really takes comes from the test's true cost function (not from the scheduler's prediction), the scheduler's cost
model learns only through observe(), as in the daemon, and what was served in time, shed or late is counted from
the simulated clock. The workload is a priority-1 tracked task (6-frame chunks, one a second, that must keep its
frames) beside priority-0 single-frame clips offered beyond what the machine can do (they degrade first); the clips'
deadlines are the shorter, so earliest-deadline-first alone would serve them first."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.serving.scheduling.conftest import catalog, request
from vlora_va.contracts.plugins import POLICIES
from vlora_va.serving.costs import FASTEST_STALE_S, SHIFT_BATCHES, CostModel, CostProfile
from vlora_va.serving.scheduling import Settings

NOW = 1000.0
# The simulated machine (the test's own books): a batch of n images at 224 px takes 10 ms + 50 ms per image in
# every LoRA mode, and a weight switch 20 ms more.
TRUE_BATCH_S, TRUE_IMAGE_S, TRUE_SWITCH_S = 0.01, 0.05, 0.02
POLICY_NAMES = ["vlora", "edf", "dlora", "merge-only", "unmerge-only"]


def true_s(images: int, switching: bool) -> float:
    return TRUE_BATCH_S + TRUE_IMAGE_S * images + (TRUE_SWITCH_S if switching else 0.0)


def measured_profile(wrong_by: float) -> CostProfile:
    """The start-up profile of this machine, `wrong_by` times its true costs (3: measured while it was busy)."""
    return CostProfile(key={"test": wrong_by},
                       base={224: [(1, wrong_by * true_s(1, False)), (4, wrong_by * true_s(4, False))]},
                       factors={k: {1: 1.0} for k in ("merged", "premerged", "unmerged", "mixture", "unmerged/einsum")},
                       switch_s=wrong_by * TRUE_SWITCH_S)


def scheduler(policy: str = "edf", wrong_by: float = 1.0, max_batch: int = 8, clock=None):
    costs = CostModel(measured_profile(wrong_by), clock=clock)
    return POLICIES.load(policy)(catalog(max_batch=max_batch), costs, Settings(max_batch, 0.02, 0.5), None)


# ---------------------------------------------------------------- the rules, one plan at a time
def test_a_request_only_the_estimate_calls_hopeless_runs_alone_before_lower_priority_work():
    """Profile 3x too slow: the tracked chunk (truly 0.21 s, 0.6-s budget) is predicted at ~0.69 s with the margin.
    With clips of a lower priority queued it is not shed: it runs next, alone; the clips wait."""
    s = scheduler(wrong_by=3.0)
    tracked = request("a", NOW, deadline_s=0.6, images=4, priority=1)
    clips = [request("b", NOW, deadline_s=2.0) for _ in range(4)]
    for r in [tracked, *clips]:
        s.add(r)
    plan, shed = s.next_plan(NOW)
    assert not shed and plan.requests == [tracked] and plan.notes["first"] == "precedence"
    assert s.queue == clips
    # the same chunk at the clips' priority is shed as before: the clips fit, nothing lower gives way for it
    s = scheduler(wrong_by=3.0)
    same = request("a", NOW, deadline_s=0.6, images=4)
    for r in [same, *clips]:
        s.add(r)
    plan, shed = s.next_plan(NOW)
    assert [x.request for x in shed] == [same] and plan.requests == clips
    assert shed[0].reason == "cannot meet its deadline: needs ~693 ms, 600 ms left"


def test_the_lowest_priority_gives_way_with_a_reason_naming_the_priority_that_goes_first():
    s = scheduler()
    clip = request("b", NOW, deadline_s=0.05)  # needs ~66 ms
    tracked = request("a", NOW, deadline_s=1.0, priority=1)
    s.add(clip)
    s.add(tracked)
    plan, shed = s.next_plan(NOW)
    assert [x.request for x in shed] == [clip] and shed[0].cause == "deadline"
    assert shed[0].reason == "cannot meet its deadline: needs ~66 ms, 50 ms left; priority 1 work goes first"
    assert plan.requests == [tracked]


def test_a_request_that_cannot_make_it_at_the_fastest_plausible_speed_is_shed_whatever_its_priority():
    """Nothing measured yet: the machine may be up to 4x faster than its profile (CORRECTION_RANGE), no faster."""
    s = scheduler()
    passed = request("a", NOW, deadline_s=0.5, waited_s=0.6, priority=1)
    hopeless = request("a", NOW, deadline_s=0.1, images=8, priority=1)  # 0.41 s at the profile, 0.1025 s at 4x
    clip = request("b", NOW, deadline_s=2.0)
    for r in (passed, hopeless, clip):
        s.add(r)
    plan, shed = s.next_plan(NOW)
    assert {id(x.request) for x in shed} == {id(passed), id(hopeless)} and plan.requests == [clip]


def test_a_pressed_request_takes_the_next_batch_from_lower_priority_work_with_earlier_deadlines():
    """The tracked request could not wait for one more batch of clips (batches may take half the shortest budget
    queued): the next batch is chosen among its priority and above, though the clips' deadlines come first."""
    s = scheduler()
    clips = [request("b", NOW, deadline_s=1.0, waited_s=0.6) for _ in range(8)]  # 0.4 s left
    tracked = request("a", NOW, deadline_s=1.0, waited_s=0.5, priority=1)  # 0.5 s left, needs ~66 ms
    for r in [*clips, tracked]:
        s.add(r)
    plan, shed = s.next_plan(NOW)
    assert not shed and plan.requests == [tracked] and plan.notes["tier"] == 1
    plan, shed = s.next_plan(NOW + plan.est_s)
    assert not shed and set(map(id, plan.requests)) <= set(map(id, clips))


def test_a_probe_runs_only_when_no_batch_measured_the_machine_lately():
    """One priority, nothing that fits: a request only the margin keeps from its deadline (truly 0.21 s, 0.22 s left,
    ~0.23 s with the margin). Right after batches confirmed the estimate a probe would be a gamble on the noise, not a
    measurement: it is shed. With nothing measured for FASTEST_STALE_S the estimate may be old news: it runs."""
    clock = [NOW]
    s = scheduler(clock=lambda: clock[0])
    s.costs.observe(0.21, 0.21)  # a batch just ran as predicted
    r = request("a", NOW, deadline_s=0.22, images=4)
    s.add(r)
    plan, shed = s.next_plan(NOW)
    assert plan is None and [x.request for x in shed] == [r]
    clock[0] += FASTEST_STALE_S + 0.1
    later = request("a", clock[0], deadline_s=0.22, images=4)
    s.add(later)
    plan, shed = s.next_plan(clock[0])
    assert not shed and plan.requests == [later] and plan.notes["first"] == "probe"


# ---------------------------------------------------------------- simulated
def workload(seconds: float, clips_per_s: float = 16.0) -> list:
    """Priority 1: a tracked task's 6-frame chunk each second, 0.9-s budget (adapter a). Priority 0: single-frame
    clips at clips_per_s from four streams, 0.4-s budget (adapter b). Together ~1.15x what the machine can do."""
    out = []
    for i in range(int(seconds)):
        out.append(request("a", NOW + i, deadline_s=0.9, images=6, stream="tracked", priority=1, seq=i))
    for i in range(int(seconds * clips_per_s)):
        out.append(request("b", NOW + i / clips_per_s + 0.013, deadline_s=0.4, stream=f"clips{i % 4}", seq=i))
    return sorted(out, key=lambda r: r.received)


@dataclass
class Books:
    """What the simulation saw happen, by the test's clock."""

    served: dict = field(default_factory=dict)  # id(request) -> (request, start, finish)
    shed: list = field(default_factory=list)  # (request, when, reason)
    batches: list = field(default_factory=list)  # (start, finish, plan)

    def in_time(self, priority: int) -> list:
        return [r for r, _, finish in self.served.values() if r.priority == priority and finish <= r.deadline]

    def shed_while_lower_served(self, priority: int) -> list:
        """Requests of `priority` shed although lower-priority work started in their lifetime (received..deadline)."""
        out = []
        for r, when, reason in self.shed:
            if r.priority != priority:
                continue
            if any(r.received <= start < r.deadline and any(x.priority < priority for x in plan.requests)
                   for start, _, plan in self.batches):
                out.append((r, when, reason))
        return out


def simulate(policy: str, arrivals: list, wrong_by: float = 1.0, slowdown=lambda t: 1.0, max_batch: int = 8) -> Books:
    """Serve `arrivals` with `policy`: plan when the scheduler is ready, run each plan for its true time (times
    slowdown(t): another process on the cores), and let the cost model observe that, as the daemon does."""
    clock = [NOW]
    s = scheduler(policy, wrong_by, max_batch, clock=lambda: clock[0])
    costs = s.costs
    books, pending, held = Books(), list(arrivals), None
    while pending or s.queue:
        now = clock[0]
        while pending and pending[0].received <= now:
            s.add(pending.pop(0))
        if not s.ready(now, stopping=not pending):  # wait for the next arrival or the oldest's max_wait
            due = [pending[0].received] if pending else []
            due += [min(r.received for r in s.queue) + s.settings.max_wait_s] if s.queue else []
            clock[0] = max(now + 1e-6, min(due))
            continue
        plan, dropped = s.next_plan(now)
        books.shed += [(x.request, now, x.reason) for x in dropped]
        if plan is None:
            continue
        switching = plan.mode.weights_slot != held
        took = true_s(plan.images, switching) * slowdown(now)
        held = plan.mode.weights_slot
        clock[0] = now + took
        costs.observe(plan.raw_s, took)
        books.batches.append((now, now + took, plan))
        for r in plan.requests:
            books.served[id(r)] = (r, now, now + took)
    assert len(books.served) + len(books.shed) == len(arrivals)  # every request answered once
    return books


def check_priorities_hold(books: Books, arrivals: list, floor_low: float) -> None:
    tracked = [r for r in arrivals if r.priority == 1]
    clips = [r for r in arrivals if r.priority == 0]
    in_time = len(books.in_time(1)) / len(tracked)
    clips_in_time = len(books.in_time(0)) / len(clips)
    assert books.shed_while_lower_served(1) == []
    assert in_time >= 0.95, (in_time, [(r.seq, when, reason) for r, when, reason in books.shed if r.priority == 1])
    assert clips_in_time < in_time  # the clips degrade first...
    assert clips_in_time >= floor_low, clips_in_time  # ...but the machine still serves what it can of them


def predicted_within(books: Books, batches: slice, tolerance: float) -> bool:
    """Every batch in `batches` took its predicted time within `tolerance` (the cost model learnt the truth)."""
    return all(abs((finish - start) - plan.est_s) <= tolerance * (finish - start)
               for start, finish, plan in books.batches[batches])


def served_in_time(books: Books, requests: list) -> float:
    return sum(id(r) in books.served and books.served[id(r)][2] <= r.deadline for r in requests) / len(requests)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_profile_three_times_too_slow_sheds_no_priority_work_and_is_corrected(policy):
    """The issue: started while other processes were busy, the profile predicts every batch 3x too slow. The
    tracked task's chunk (truly 0.31 s, budget 0.9 s) then looks hopeless (~0.93 s, ~1.02 s with the margin) while
    the clips look fine: it must still be served, and the first batch that runs corrects the estimate."""
    arrivals = workload(40)
    books = simulate(policy, arrivals, wrong_by=3.0)
    check_priorities_hold(books, arrivals, floor_low=0.5)
    assert predicted_within(books, slice(1, None), 0.1)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_profile_three_times_too_fast_is_corrected_within_a_few_batches(policy):
    """The profile predicts every batch 3x too fast: the first batches run long, the correction must reach the
    truth within SHIFT_BATCHES of them, and the tracked task keeps its frames meanwhile."""
    arrivals = workload(60)
    books = simulate(policy, arrivals, wrong_by=1 / 3)
    check_priorities_hold(books, arrivals, floor_low=0.5)
    assert predicted_within(books, slice(SHIFT_BATCHES, None), 0.1)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_competing_load_degrades_the_clips_not_the_tracked_task(policy):
    """Another process takes half the cores from 10 s to 30 s: every batch takes twice its true time. The tracked
    task still fits (0.62 s of every second); the clips give way, and once the spell ends they are served as
    before it (the correction came back)."""
    def slowdown(t):
        return 2.0 if NOW + 10 <= t < NOW + 30 else 1.0

    arrivals = workload(50)
    books = simulate(policy, arrivals, slowdown=slowdown)
    check_priorities_hold(books, arrivals, floor_low=0.3)
    clips = [r for r in arrivals if r.priority == 0]
    before = served_in_time(books, [r for r in clips if NOW + 2 <= r.received < NOW + 10])
    during = served_in_time(books, [r for r in clips if NOW + 12 <= r.received < NOW + 30])
    after = served_in_time(books, [r for r in clips if NOW + 31 <= r.received])
    assert during < 0.5 * before and after >= 0.9 * before, (before, during, after)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_when_every_request_looks_hopeless_one_runs_as_a_probe_and_brings_the_others_back(policy):
    """One priority, a profile 3x too slow: every request looks hopeless (truly 0.21 s, predicted ~0.69 s with the
    margin, 0.6-s budget), so nothing would run and nothing would correct the estimate (the daemon shed everything).
    The most urgent runs alone as a probe; its time corrects the model, and the request queued beside it (two
    cameras send their chunks together) is served in time after it."""
    arrivals = [request("a", NOW + 0.5 * (i // 2), deadline_s=0.6, images=4, stream=f"s{i % 2}", seq=i // 2)
                for i in range(40)]
    books = simulate(policy, arrivals, wrong_by=3.0)
    assert books.batches, f"nothing ran: all {len(books.shed)} requests were shed"
    first = books.batches[0][2]
    assert first.notes.get("first") == "probe" and len(first.requests) == 1
    assert not books.shed
    assert len(books.in_time(0)) == len(arrivals)
