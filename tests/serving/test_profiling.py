"""Start-up cost profiles under load (serving/profiling.py): a profile measured while another process kept the
cores busy serves its run but is not cached as the machine's truth; the next quiet start measures and caches one;
a stale check on a busy machine keeps the quiet profile."""

from __future__ import annotations

import logging
import os

import pytest

from tests.common.test_machine_load import spinning
from vlora_va.common import machine_load
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.executor import Engine
from vlora_va.serving import costs as C
from vlora_va.serving import profiling as P
from vlora_va.testing.tiny import TINY_IMAGE

MODES = ["premerged", "unmerged", "mixture"]


@pytest.fixture(scope="module")
def engine(tiny_backbone_dir, tiny_adapters):
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    return Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=64, max_batch_images=8)


def key_for(engine):
    return P.profile_key(engine.device, "tiny", engine.backbone, engine.catalog(), {"detect": 4, "actions": 8}, MODES)


def quiet_reading(fn):
    """The load as a quiet machine reads it (this test's premise is what happens next, not how busy CI is)."""
    return fn(), 0.0


def test_a_profile_measured_under_a_competing_process_serves_its_run_and_is_not_cached(engine, tmp_path, caplog):
    if machine_load.machine_busy() is None:
        pytest.skip("no /proc/stat here: the load cannot be read")
    catalog, key = engine.catalog(), key_for(engine)
    with spinning(os.cpu_count() or 1), caplog.at_level(logging.WARNING, logger="vlora_va"):
        busy = P.load_or_measure(engine, catalog, key, tmp_path, MODES)
    assert busy.base and all(t > 0 for points in busy.base.values() for _, t in points)  # it serves this run
    assert "measured on a busy machine" in caplog.text and "not cached" in caplog.text
    assert not P.profile_path(tmp_path, key).exists()
    # the next start, on a quiet machine: measured again, and that one is cached
    quiet = P.load_or_measure(engine, catalog, key, tmp_path, MODES, load=quiet_reading)
    assert P.load_cached(tmp_path, key).to_json() == quiet.to_json()


def test_a_stale_check_on_a_busy_machine_keeps_the_quiet_profile(engine, tmp_path, caplog, monkeypatch):
    """The cached profile 3x faster than the machine now, read while other processes take the cores: the quiet
    measurement stays the machine's truth (re-measuring would replace it with the busy machine's speed)."""
    monkeypatch.setattr(P, "STALE_MIN_S", 0.0)  # the tiny engine's batches take milliseconds
    catalog, key = engine.catalog(), key_for(engine)
    first = P.load_or_measure(engine, catalog, key, tmp_path, MODES, load=quiet_reading)
    fast = C.CostProfile.from_json(first.to_json())
    fast.base = {size: [(n, t / 3.0) for n, t in points] for size, points in fast.base.items()}
    P.save(tmp_path, fast)
    assert P.stale_ratio(engine, catalog, fast) < 1 / P.STALE_RATIO
    with caplog.at_level(logging.INFO, logger="vlora_va"):
        kept = P.load_or_measure(engine, catalog, key, tmp_path, MODES, load=busy_reading)
    assert "the machine is busy" in caplog.text
    assert kept.to_json() == fast.to_json() and P.load_cached(tmp_path, key).to_json() == fast.to_json()
    # on a quiet machine the same check measures again, and caches that
    again = P.load_or_measure(engine, catalog, key, tmp_path, MODES, load=quiet_reading)
    assert again.to_json() != fast.to_json() and P.load_cached(tmp_path, key).to_json() == again.to_json()


def test_a_cached_profile_slower_than_the_busy_machine_now_is_measured_again_and_not_cached(engine, tmp_path, caplog):
    """Slower than even the busy machine now: wrong whatever the load (taken under heavier load), so this run
    measures its own, but the busy measurement does not replace the cache either."""
    catalog, key = engine.catalog(), key_for(engine)
    first = P.load_or_measure(engine, catalog, key, tmp_path, MODES, load=quiet_reading)
    slow = C.CostProfile.from_json(first.to_json())
    slow.base = {size: [(n, t + 1.0) for n, t in points] for size, points in slow.base.items()}
    P.save(tmp_path, slow)
    with caplog.at_level(logging.INFO, logger="vlora_va"):
        used = P.load_or_measure(engine, catalog, key, tmp_path, MODES, load=busy_reading)
    assert "measuring again" in caplog.text and "not cached" in caplog.text
    assert all(t < 1.0 for points in used.base.values() for _, t in points)
    assert P.load_cached(tmp_path, key).to_json() == slow.to_json()


def busy_reading(fn):
    """What others_share says with every core taken by other processes."""
    return fn(), 0.9
