"""The cost profile: measured on the real (tiny) engine, cached by machine and set-up, predicting plan times,
and correcting itself from observed batches."""

from __future__ import annotations

import time

import pytest
import torch

from tests.serving.scheduling.conftest import profile as hand_profile
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.executor import Engine
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode
from vlora_va.engine.precision import device_name
from vlora_va.serving import costs as C
from vlora_va.serving import profiling as P
from vlora_va.testing.tiny import TINY_IMAGE


@pytest.fixture(scope="module")
def engine(tiny_backbone_dir, tiny_adapters):
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    return Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=64, max_batch_images=8)


def key_for(engine, modes=("premerged", "unmerged", "mixture")):
    return P.profile_key(engine.device, "tiny", engine.backbone, engine.catalog(), {"detect": 4, "actions": 8},
                         list(modes))


def test_profile_measures_every_size_mode_and_the_switch(engine):
    catalog = engine.catalog()
    p = P.measure_profile(engine, catalog, key_for(engine), ["premerged", "unmerged", "mixture"])
    assert set(p.base) == {TINY_IMAGE} and [n for n, _ in p.base[TINY_IMAGE]] == [1, 4, 8]  # up to max_batch 8
    assert all(t > 0 for _, t in p.base[TINY_IMAGE])
    assert set(p.factors) == {"premerged", "unmerged", "mixture", "merged"}
    assert p.factors["unmerged"][1] > 0 and set(p.factors["unmerged"]) == {1, 2}  # 2 adapters
    assert p.factors["premerged"][1] == 1.0 and p.factors["mixture"][1] == 1.0
    assert p.switch_s > 0 and p.measured_s > 0
    assert engine.weights_slot is None  # measuring leaves the weights pristine


def test_the_profile_is_cached_by_machine_and_set_up(engine, tmp_path, quiet_machine):
    catalog = engine.catalog()
    key = key_for(engine)
    first = P.load_or_measure(engine, catalog, key, tmp_path, ["premerged", "unmerged", "mixture"])
    assert P.profile_path(tmp_path, key).is_file()
    t0 = time.perf_counter()
    again = P.load_or_measure(engine, catalog, key, tmp_path)
    assert time.perf_counter() - t0 < 0.5 and again.to_json() == first.to_json()
    other = dict(key, threads=key["threads"] + 1)  # another thread count is another machine set-up
    assert P.load_cached(tmp_path, other) is None
    P.profile_path(tmp_path, key).write_text("{not json")  # a damaged cache is measured again, not fatal
    assert P.load_cached(tmp_path, key) is None


def test_a_cached_profile_far_from_this_machine_now_is_measured_again(engine, tmp_path, caplog, quiet_machine):
    """A profile cached while other work shared the cores predicts every batch too slow: kept, the daemon would
    shed work it can serve until the online correction caught up."""
    catalog = engine.catalog()
    key = key_for(engine)
    first = P.load_or_measure(engine, catalog, key, tmp_path, ["premerged", "unmerged", "mixture"])
    slow = C.CostProfile.from_json(first.to_json())
    slow.base = {size: [(n, t + 1.0) for n, t in points] for size, points in slow.base.items()}
    P.save(tmp_path, slow)
    assert P.stale_ratio(engine, catalog, slow) > P.STALE_RATIO
    again = P.load_or_measure(engine, catalog, key, tmp_path, ["premerged", "unmerged", "mixture"])
    assert "measuring again" in caplog.text
    assert all(t < 1.0 for points in again.base.values() for _, t in points)
    assert P.load_cached(tmp_path, key).to_json() == again.to_json()  # the cache holds the new one
    assert P.stale_ratio(engine, catalog, again) is None
    assert engine.weights_slot is None  # checking leaves the weights pristine


def test_key_names_the_processor_threads_backbone_and_adapters(engine):
    key = key_for(engine)
    assert key["device"] == device_name(torch.device("cpu")) and key["threads"] == torch.get_num_threads()
    assert key["backbone"] == "tiny" and [a[0] for a in key["adapters"]] == ["actions", "detect"]
    assert key_for(engine, ["unmerged"]) != key


def test_predictions_follow_the_profile():
    m = C.CostModel(hand_profile())
    assert m.forward_s(224, 1, LoRAMode(MERGED, 0), 1) == pytest.approx(0.06)
    assert m.forward_s(224, 2, LoRAMode(MERGED, 0), 1) == pytest.approx(0.11)  # interpolated
    assert m.forward_s(224, 8, LoRAMode(MERGED, 0), 1) == pytest.approx(0.41)  # extended past 4
    assert m.forward_s(224, 4, LoRAMode(UNMERGED), 4) == pytest.approx(0.21 * 1.4)
    assert m.forward_s(224, 4, LoRAMode(UNMERGED), 2) == pytest.approx(0.21 * (1.15 + 0.25 / 3))
    assert m.forward_s(224, 4, LoRAMode(UNMERGED, impl="einsum"), 4) == pytest.approx(0.21 * 2.0)
    assert m.plan_s({224: (4, 1), 336: (1, 1)}, LoRAMode(PREMERGED), switching=True) == pytest.approx(0.21 + 0.11 + 0.02)
    assert m.image_s(336, LoRAMode(PREMERGED)) == pytest.approx(0.1)
    assert m.forward_s(448, 1, LoRAMode(MIXTURE, 0), 1) == pytest.approx(0.11 * 4 / 2.25)  # by token count


def test_cpu_profiles_measure_up_to_the_largest_batch_and_gpus_every_bucket():
    assert P.profile_batches(torch.device("cpu"), 16) == [1, 4, 8, 16]
    assert P.profile_batches(torch.device("cpu"), 6) == [1, 4, 6]
    assert P.profile_batches(torch.device("cpu"), 2) == [1, 2]
    assert P.profile_batches(torch.device("cuda"), 64) == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("points,cap", [
    ([(1, 0.10), (4, 0.33), (8, 0.66), (16, 1.50)], 8),   # DINOv2-S fp32 on 2 cores: 16 costs ~12% more per image
    ([(1, 0.10), (4, 0.32), (8, 0.65), (16, 1.29)], 16),  # 16 within 3% of the best: timing noise, no cap
    ([(1, 0.10), (4, 0.38)], 16),                         # a line through two points says nothing past them
    ([(1, 0.01), (8, 0.02), (64, 0.10)], 16),             # a GPU's curve: larger is cheaper per image
    ([(1, 0.10), (4, 0.50), (16, 2.2)], 4),               # every larger batch costs more: still batches of 4
])
def test_the_efficient_batch_is_where_the_profile_measured_the_lowest_time_per_image(points, cap):
    m = C.CostModel(C.CostProfile(key={}, base={224: points}, factors={"merged": {1: 1.0}}, switch_s=0.0))
    assert m.efficient_batch(16) == cap


def test_the_load_per_image_is_the_slope_of_the_batches_the_daemon_runs():
    """Batches capped at 8 (a CPU where 16 costs more per image): one more image costs the slope up to 8, not the
    slope through the batch of 16 that never runs."""
    points = [(1, 0.10), (4, 0.33), (8, 0.66), (16, 1.50)]
    m = C.CostModel(C.CostProfile(key={}, base={224: points}, factors={"merged": {1: 1.0}}, switch_s=0.0))
    through_16 = (1.50 - 0.10) / 15
    assert m.image_s(224, LoRAMode(MERGED, 0)) == pytest.approx(through_16)  # no cap: every point
    m.batch_cap = m.efficient_batch(16)
    assert m.batch_cap == 8 and m.image_s(224, LoRAMode(MERGED, 0)) == pytest.approx((0.66 - 0.10) / 7)
    m.batch_cap = 1  # one point left: its own time per image
    assert m.image_s(224, LoRAMode(MERGED, 0)) == pytest.approx(0.10)


def test_the_efficient_batch_is_the_largest_over_sizes():
    """One batch limit serves every size: a size that gains from large batches keeps them (the default pipeline on
    OpenVINO: 224 px cheapest at 16, 336 px at 1)."""
    def model(base):
        return C.CostModel(C.CostProfile(key={}, base=base, factors={"merged": {1: 1.0}}, switch_s=0.0))

    ov = {224: [(1, 0.0636), (4, 0.1553), (8, 0.3010), (16, 0.5932)],
          336: [(1, 0.1133), (4, 0.5243), (8, 1.0005), (16, 1.9302)]}
    assert model(ov).efficient_batch(16) == 16
    torch_fp32 = {224: [(1, 0.10), (4, 0.33), (8, 0.66), (16, 1.50)], 336: [(1, 0.25), (4, 0.8), (8, 1.9), (16, 4.5)]}
    assert model(torch_fp32).efficient_batch(16) == 8  # 336 caps at 4, 224 at 8: batches of 8
    assert model(torch_fp32).efficient_batch(6) == 6  # never above max_batch_images


def test_observed_batches_correct_the_prediction_and_set_the_margin():
    m = C.CostModel(hand_profile())
    for _ in range(60):
        m.observe(0.2, 0.36)  # this machine runs 1.8x slower than it measured (e.g. decode beside it)
    assert m.correction == pytest.approx(1.8, rel=0.01)
    assert m.plan_s({224: (4, 1)}, LoRAMode(MERGED, 0), False) == pytest.approx(0.21 * 1.8, rel=0.01)
    assert m.margin == pytest.approx(1.1)  # once converged the predictions hold: the margin's floor
    for i in range(30):  # now noisy: a batch in ten runs 60% long
        m.observe(0.2, 0.36 * (1.6 if i % 10 == 0 else 1.0))
    assert 1.3 < m.margin <= 2.0


@pytest.mark.parametrize("truth", [1 / 3, 3.0])
def test_the_correction_reaches_the_truth_within_a_few_batches_both_ways(truth):
    """A profile 3x too slow (measured while other processes were busy) is corrected by the first batch: no noise
    makes a batch run faster than the machine can. One 3x too fast takes SHIFT_BATCHES batches (one slow batch may
    be a hiccup), and the margin is not left at its cap by the batches that showed it."""
    m = C.CostModel(hand_profile())
    needed = 1 if truth < 1 else C.SHIFT_BATCHES
    for _ in range(needed):
        m.observe(0.2, 0.2 * truth)
    assert m.correction == pytest.approx(truth)
    assert m.plan_s({224: (4, 1)}, LoRAMode(MERGED, 0), False) == pytest.approx(0.21 * truth)
    assert m.margin == pytest.approx(C.MARGIN_RANGE[0])
    for _ in range(20):  # and it stays there
        m.observe(0.2, 0.2 * truth)
    assert m.correction == pytest.approx(truth) and m.margin == pytest.approx(C.MARGIN_RANGE[0])


def test_one_slow_batch_only_nudges_the_correction():
    m = C.CostModel(hand_profile())
    m.observe(0.2, 0.6)  # a hiccup: another process took the cores for one batch
    assert 1.0 < m.correction < 1.35
    for _ in range(10):
        m.observe(0.2, 0.2)
    assert m.correction == pytest.approx(1.0, abs=0.02)


def test_a_slow_spell_that_ended_is_forgotten_at_the_first_batch_that_runs():
    """While no batch runs the correction holds what was measured: fading back to the profile would bring back a
    profile measured on a busy machine, the very figure the correction is there to fix. What must not happen is
    that nothing runs: once no batch has confirmed the correction for FASTEST_STALE_S, `fastest` (the bound the
    scheduler sheds below without trying) falls to the lowest the range allows, so a request the machine may still
    serve runs as a probe, and the first batch that runs faster than predicted resets the correction."""
    clock = [1000.0]
    m = C.CostModel(hand_profile(), clock=lambda: clock[0])
    assert m.fastest == C.CORRECTION_RANGE[0]  # nothing measured yet: the profile may be several times too slow
    for _ in range(40):
        m.observe(0.2, 0.8)  # 4x slower than profiled: a competing load
    assert m.correction == pytest.approx(4.0) and m.fastest == pytest.approx(4.0)
    clock[0] += C.FASTEST_STALE_S + 60.0  # nothing runs for a minute
    assert m.correction == pytest.approx(4.0) and m.fastest == C.CORRECTION_RANGE[0]
    m.observe(0.2, 0.2)  # the machine is back to its profile
    assert m.correction == pytest.approx(1.0) and m.fastest == pytest.approx(1.0)


def test_the_fastest_plausible_speed_is_the_fastest_recent_batch():
    """What the scheduler sheds without trying: a request that would miss even at the speed of the fastest of the
    recent batches. Batches 10% either side of the truth: the fastest is the 10% faster one, not the average."""
    clock = [0.0]
    m = C.CostModel(hand_profile(), clock=lambda: clock[0])
    for i in range(C.FASTEST_BATCHES):
        clock[0] += 0.1
        m.observe(0.2, 0.2 * 2.0 * (0.9 if i == 3 else 1.1 if i % 2 else 1.0))
    assert m.fastest == pytest.approx(1.8) and m.correction > 1.9
    for _ in range(C.FASTEST_BATCHES):  # the fast one is no longer recent
        m.observe(0.2, 0.4)
    assert m.fastest == pytest.approx(2.0)
