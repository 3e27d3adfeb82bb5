"""Overload control at admission: nothing below capacity, lowest priority first above it, each degrade
option doing what it says, and full service again when the load drops."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.serving.scheduling.conftest import catalog, profile, request
from vlora_va.serving.admission import BACKLOG_SHARE, TARGET_UTILISATION, Admission, OverloadControl
from vlora_va.serving.costs import CostModel

T0 = 5000.0


def offer(ctl, seconds, per_s, cost_s, min_frames=1, start=T0, busy=0.0, **kw):
    """Arrivals at per_s requests/s, each costing cost_s of engine time; returns (request, admission)."""
    out = []
    for i in range(int(seconds * per_s)):
        now = start + i / per_s
        r = request(kw.get("adapter", "a"), now, seq=i, **{k: v for k, v in kw.items() if k != "adapter"})
        out.append((r, ctl.admit(r, cost_s, now, min_frames, busy=busy)))
    return out


def test_nothing_is_touched_below_capacity():
    ctl = OverloadControl("shed")
    results = offer(ctl, 20, 10, 0.08)  # 0.8 s of compute per second
    assert all(a.request is r and a.reason is None for r, a in results)
    assert ctl.fractions == {0: 1.0}


def test_nothing_is_shed_from_the_first_chunks_of_streams_below_capacity():
    """Two cameras start together, one 1-s chunk a second each, 0.85 s of compute a second in all: the second
    chunk of each, a second after the first, must not read as twice the load."""
    ctl = OverloadControl("shed")
    for i in range(10):
        for stream, cost in (("a", 0.55), ("b", 0.3)):
            now = T0 + i + (0.01 if stream == "b" else 0.0)
            r = request("a", now, seq=i, stream=stream)
            assert ctl.admit(r, cost, now, 1).request is r, (i, stream, ctl.load(now))


def test_shed_admits_what_fits_and_spreads_it_evenly():
    ctl = OverloadControl("shed")
    results = offer(ctl, 30, 10, 0.3)  # 3 s of compute per second: about a third fits
    steady = results[100:]
    admitted = [r for r, a in steady if a.request is not None]
    assert len(admitted) / len(steady) == pytest.approx(TARGET_UTILISATION / 3, abs=0.03)
    gaps = {b.seq - a.seq for a, b in zip(admitted, admitted[1:])}
    assert gaps <= {3, 4}  # every 3rd or 4th request, not bursts
    reasons = {a.reason for _, a in steady if a.request is None}
    assert len(reasons) <= 2 and all(x.startswith("overload: priority 0 work shed") for x in reasons)


def test_a_degraded_tier_still_admits_what_the_queue_leaves_time_for():
    """A burst lifts the load average past the target: while the work queued ahead (with the request) fits in
    BACKLOG_SHARE of its budget the request is admitted; behind a real backlog the load decides as before."""
    ctl = OverloadControl("shed")
    offer(ctl, 5, 10, 0.3)  # 3 s of compute per second for 5 s: degraded to about a third
    assert ctl.fractions[0] < 0.5
    now = T0 + 5.0
    budget = 2.0  # the test requests' deadline (conftest.request)
    verdicts = []
    for i in range(12):
        r = request("a", now, seq=100 + i)
        assert r.deadline - now == pytest.approx(budget)
        verdicts.append(ctl.admit(r, 0.3, now, 1, backlog_s=0.0))  # an empty queue: all fit
    assert all(v.request is not None for v in verdicts)
    short = BACKLOG_SHARE * budget - 0.3 - 1e-6  # with the request's own 0.3 s, just within the share
    assert ctl.admit(request("a", now, seq=200), 0.3, now, 1, backlog_s=short).request is not None
    behind = [ctl.admit(request("a", now, seq=300 + i), 0.3, now, 1, backlog_s=BACKLOG_SHARE * budget)
              for i in range(12)]
    shed = [v for v in behind if v.request is None]
    assert 6 <= len(shed) < 12 and all(v.reason.startswith("overload: priority 0 work shed") for v in shed)


def test_a_background_compile_takes_its_share_of_the_cores_off_the_capacity():
    """0.8 s of compute a second fits the machine, not while a compile takes half its cores (busy=0.5): the tier is
    then admitted at about target x 0.5 / 0.8, queued work counts as twice as long, and once the compile is over
    everything is admitted again."""
    ctl = OverloadControl("shed")
    assert all(a.request is r for r, a in offer(ctl, 10, 10, 0.08))
    during = offer(ctl, 10, 10, 0.08, start=T0 + 10, busy=0.5)
    share = sum(a.request is not None for _, a in during) / len(during)
    assert share == pytest.approx(TARGET_UTILISATION * 0.5 / 0.8, abs=0.06), share
    assert ctl.fractions[0] == pytest.approx(TARGET_UTILISATION * 0.5 / 0.8, abs=0.02)
    now = T0 + 20  # new streams (no credit yet): the backlog rule alone decides
    # 0.82 s queued: with the request, fits the 1-s share of its 2-s budget at full speed, not at half
    fits_alone = BACKLOG_SHARE * 2.0 - 0.08 - 0.1
    assert ctl.admit(request("a", now, stream="x"), 0.08, now, 1, backlog_s=fits_alone, busy=0.5).request is None
    assert ctl.admit(request("a", now, stream="y"), 0.08, now, 1, backlog_s=0.3, busy=0.5).request is not None
    after = offer(ctl, 10, 10, 0.08, start=T0 + 25)[60:]  # the window has forgotten the compile's seconds
    assert all(a.request is r for r, a in after) and ctl.fractions == {0: 1.0}


def test_lower_priority_gives_way_first():
    ctl = OverloadControl("shed")
    high = low = None
    for i in range(300):  # both tiers at 0.6 s/s: together 1.2, the high tier alone fits
        now = T0 + i * 0.05
        high = ctl.admit(request("a", now, priority=5, stream="hi", seq=i), 0.03, now, 1)
        low = ctl.admit(request("a", now, priority=0, stream="lo", seq=i), 0.03, now, 1)
        if i > 120:
            assert high.request is not None
    assert ctl.fractions[5] == 1.0
    assert ctl.fractions[0] == pytest.approx((TARGET_UTILISATION - 0.6) / 0.6, abs=0.05)
    assert low is not None


def test_stride_serves_every_kth_chunk():
    ctl = OverloadControl("stride")
    results = offer(ctl, 30, 10, 0.3)
    admitted = [r.seq for r, a in results[100:] if a.request is not None]
    k = admitted[1] - admitted[0]
    assert k == 4 and all(s % k == 0 for s in admitted)
    assert all("every 4th chunk" in a.reason for r, a in results[100:] if a.request is None)


def test_frames_thins_clips_down_to_what_the_head_accepts_then_strides():
    ctl = OverloadControl("frames")
    results = offer(ctl, 30, 10, 0.15, images=8, min_frames=3)  # 1.5 s/s: keep ~63% of 8 frames
    r, a = results[-1]
    keep = math.ceil(8 * ctl.fractions[0])
    assert keep in (5, 6) and a.request.num_images == keep and a.thinned_from == 8
    spread = {5: (0, 2, 4, 5, 7), 6: (0, 2, 3, 4, 6, 7)}[keep]  # the middle of each of `keep` equal parts
    assert a.request.frame_ts == [r.frame_ts[i] for i in spread]
    assert a.reason == f"overload: {keep} of 8 frames"
    ctl = OverloadControl("frames")
    results = offer(ctl, 30, 10, 0.5, images=8, min_frames=8)  # cannot thin: stride instead
    tail = results[100:]
    assert any(a.request is None for _, a in tail) and all(a.thinned_from == 0 for _, a in tail)


def test_full_service_resumes_when_the_load_drops():
    ctl = OverloadControl("shed")
    offer(ctl, 20, 10, 0.3)
    assert ctl.fractions[0] < 0.5
    later = offer(ctl, 20, 10, 0.05, start=T0 + 20)
    assert all(a.request is not None for _, a in later[60:])  # the 5-s window has forgotten the overload
    assert ctl.fractions[0] == 1.0


def test_unknown_degrade_option_is_refused():
    with pytest.raises(ValueError, match="shed, stride or frames"):
        OverloadControl("drop")



def admission(costs) -> tuple:
    """Admission with a hand-written cost profile (tests/serving/scheduling/conftest.py: 50 ms per image at
    224 px), and a catalog taking the test requests' 4x4 frames."""
    return Admission(costs, "shed"), replace(catalog(), image_size=4)


def test_a_request_is_never_shed_for_lower_priority_work_queued_ahead_of_it():
    """A degraded tier's request is admitted while the live work of its priority and above queued ahead of it fits
    in BACKLOG_SHARE of its budget: lower-priority work queued does not count (the scheduler lets it give way), so
    a tracked task's chunk is not shed because clips fill the queue, while a clip behind them is."""
    adm, cat = admission(CostModel(profile()))
    for i in range(50):  # the tracked task alone offers 1.5 s of compute per second: its tier is degraded
        now = T0 + i * 0.1
        adm.admit([request("a", now, images=3, priority=1, stream=f"t{i % 5}", seq=i)], cat, {}, set(), now)
    assert adm.overload.fractions[1] < 0.7
    now = T0 + 5.0
    clips = [request("b", now, deadline_s=5.0, stream="clips", seq=i) for i in range(40)]  # 2 s queued
    tracked = request("a", now, priority=1, stream="new-camera", seq=0)  # a new stream's chunk: no credit yet
    out = adm.admit([tracked], cat, {}, set(), now, queued=clips)
    assert out.queue == [tracked]
    clip = request("b", now, stream="new-clips", seq=0)
    out = adm.admit([clip], cat, {}, set(), now, queued=clips)
    assert out.queue == [] and out.refused[0][3] == "overload" and adm.overload.fractions[0] < 1.0


def test_the_window_is_costed_at_the_latest_correction():
    """A profile measured 3x too slow makes the offered load read 3x: the tier is degraded. Once the first batches
    show the truth, the whole window is costed at the new correction: what arrives next is admitted, not shed for
    the seconds of load the wrong estimate put in the window."""
    slow = profile(switch_s=0.0)
    slow.base = {size: [(n, 3 * t) for n, t in points] for size, points in slow.base.items()}
    costs = CostModel(slow)
    adm, cat = admission(costs)
    for i in range(30):  # 16 images a second, truly 0.8 s of compute per second: read as 2.4
        now = T0 + i / 16
        adm.admit([request("a", now, stream=f"s{i % 4}", seq=i)], cat, {}, set(), now)
    assert adm.overload.fractions[0] < 0.7
    for _ in range(3):  # the first batches run three times faster than the profile says
        costs.observe(0.63, 0.21)
    assert costs.correction == pytest.approx(1 / 3)
    later = []
    for i in range(30, 60):
        now = T0 + i / 16
        later += adm.admit([request("a", now, stream=f"s{i % 4}", seq=i)], cat, {}, set(), now).refused
    assert later == [] and adm.overload.fractions[0] == 1.0
