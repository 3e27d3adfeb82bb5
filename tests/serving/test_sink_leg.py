"""The sink leg (vlora_va/serving/sink_leg.py): what a row needs after its compute to reach a local sink, measured
online, and kept out of the scheduler's budget (`Scheduler.reserve_s`). The reserve against the test's own figures from a real JSONL sink's delivery lags; the scheduler with
a hand-written cost profile (tests/serving/scheduling/conftest.py: 60 ms for one image at 224 px, 110 ms for two)."""

from __future__ import annotations

import pytest

from tests.outputs.test_sinks import records
from tests.serving.scheduling.conftest import catalog, profile, request
from vlora_va.contracts.plugins import POLICIES
from vlora_va.outputs.sinks import JsonlSink, StdoutSink, WebhookSink, ZmqPubSink
from vlora_va.serving.costs import CostModel
from vlora_va.serving.scheduling import Settings
from vlora_va.common.percentile import percentile
from vlora_va.serving.sink_leg import MAX_RESERVE_S, MIN_SAMPLES, SinkLeg

NOW = 1000.0


def test_the_reserve_is_the_p99_hand_off_plus_the_slowest_local_sinks_p99_lag(tmp_path):
    leg = SinkLeg()
    for _ in range(MIN_SAMPLES - 1):
        leg.handed_off(0.02)
    assert leg.reserve_s([]) == 0.0  # too few batches yet to say
    handoffs = [0.01] * 197 + [0.05] * 3
    for s in handoffs:
        leg.handed_off(s)
    assert leg.reserve_s([]) == pytest.approx(0.05)  # the 99th percentile of the kept batches: one of the slow ones
    with JsonlSink(tmp_path / "rows.jsonl", fsync="batch") as sink:
        for i in range(20):
            sink.write(records(i, 1))
            assert sink.flush(10.0)
        lags = sink.delivery_lags()
        assert len(lags) == 20 and all(lag >= 0 for lag in lags)
        kept = handoffs[-256:]  # the last 256 batches count, as the leg keeps them
        expected = percentile([*[0.02] * (MIN_SAMPLES - 1), *kept][-256:], 0.99) + percentile(lags, 0.99)
        assert leg.reserve_s([sink]) == pytest.approx(min(MAX_RESERVE_S, expected))


def test_only_local_sinks_are_part_of_the_deadline():
    """docs/results.md#deadline_met: a file, standard output and the results socket end a row's deadline; a webhook
    (and MQTT) deliver asynchronously, their far side's time is not the daemon's."""
    assert JsonlSink.local and StdoutSink.local and ZmqPubSink.local
    assert not WebhookSink.local


def scheduler_with(reserve_s: float):
    s = POLICIES.load("edf")(catalog(), CostModel(profile()), Settings(8, 0.02, 0.5), None)
    s.reserve_s = reserve_s
    return s


def test_the_scheduler_plans_batches_to_end_a_sink_leg_before_the_deadline():
    tight, roomy = request("a", NOW, deadline_s=0.3), request("a", NOW, deadline_s=2.0)
    # no reserve: both in one batch (110 ms; a batch may take half the tightest budget, 150 ms)
    s = scheduler_with(0.0)
    s.extend([tight, roomy])
    plan, shed = s.next_plan(NOW)
    assert plan.requests == [tight, roomy] and not shed
    # a 90-ms sink leg leaves the tight request 210 ms of compute, half of it 105 ms per batch: it goes alone (60 ms)
    s = scheduler_with(0.09)
    s.extend([tight, roomy])
    plan, shed = s.next_plan(NOW)
    assert plan.requests == [tight] and not shed and s.queue == [roomy]


def test_a_request_whose_budget_the_sink_leg_takes_is_shed_saying_what_was_left():
    s = scheduler_with(0.09)
    doomed = request("a", NOW, deadline_s=0.1)  # 10 ms left for compute: not even at the fastest plausible speed
    s.add(doomed)
    plan, shed = s.next_plan(NOW)
    assert plan is None and [x.request for x in shed] == [doomed]
    assert "10 ms left" in shed[0].reason
    s = scheduler_with(0.0)  # without the leg it is served
    s.add(doomed)
    plan, shed = s.next_plan(NOW)
    assert plan.requests == [doomed] and not shed
