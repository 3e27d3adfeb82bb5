"""vlora_va/engine/cuda_graphs.py on a CPU: the captured-forward logic (keys, buckets, padding, static buffers reused
across batches, modes and weight switches, what falls back to eager) with the capture itself run eagerly.
On a GPU the same objects hold CUDA graphs."""

import time

import numpy as np
import pytest
import torch

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.executor import Engine
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode
from vlora_va.engine.plan import PlanKey
from vlora_va.serving.scheduling import make_plan
from vlora_va.testing.tiny import TINY_IMAGE


def frames(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, (TINY_IMAGE, TINY_IMAGE, 3), dtype=np.uint8) for _ in range(n)]


@pytest.fixture
def engines(tiny_backbone_dir, tiny_adapters):
    def make(fixed):
        adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
        return Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=64,
                      max_batch_images=8, fixed_layout=fixed)
    return make(False), make(True)


def test_keys_say_what_replays_a_capture_and_what_runs_eagerly(engines):
    _, e = engines
    g = e.backend.graphs
    assert g.key(56, 3, LoRAMode(PREMERGED), 0, False) == PlanKey(56, "premerged", 4)
    assert g.key(56, 8, LoRAMode(MIXTURE, 1), 0, False) == PlanKey(56, "mixture", 8)
    assert g.key(56, 3, LoRAMode(PREMERGED), 1, False) is None  # a shared prefix forks by the data
    assert g.key(56, 3, LoRAMode(PREMERGED), 0, True) is None
    assert g.key(56, 3, LoRAMode(UNMERGED, impl="einsum"), 0, False) is None
    assert g.key(56, 9, LoRAMode(PREMERGED), 0, False) is None  # above the largest bucket (8)
    plain, _ = engines
    assert plain.backend.graphs.key(56, 3, LoRAMode(PREMERGED), 0, False) is None  # no fixed layouts: never


def test_one_capture_per_key_serves_every_batch_of_its_bucket(engines):
    """Batches of 3 and 4 images share the bucket-4 capture; each result equals the eager engine's;
    merged(0) and merged(1) share one capture (the weights change in place)."""
    plain, e = engines
    fs = frames(4, 5)
    for n, slots in ((3, [1, 0, 1]), (4, [0, 0, 1, 1]), (4, [1, 1, 1, 0])):
        for mode in (LoRAMode(PREMERGED), LoRAMode(UNMERGED), LoRAMode(MIXTURE, 0)):
            for x in (plain, e):
                x.switch(mode)
            want, got = plain.features(fs[:n], slots, mode), e.features(fs[:n], slots, mode)
            assert torch.allclose(got.cls, want.cls, atol=1e-4), (n, slots, mode)
    for slot in (0, 1):
        mode = LoRAMode(MERGED, slot)
        for x in (plain, e):
            x.switch(mode)
        want, got = plain.features(fs, [slot] * 4, mode), e.features(fs, [slot] * 4, mode)
        assert torch.allclose(got.cls, want.cls, atol=1e-4)
    assert set(e.backend.graphs.captured) == {PlanKey(56, k, 4) for k in ("premerged", "unmerged", "mixture", "merged")}


def test_static_output_is_copied_out_before_the_next_replay(engines):
    _, e = engines
    e.switch(LoRAMode(PREMERGED))
    first = e.features(frames(2, 1), [0, 1], LoRAMode(PREMERGED))
    kept = first.cls.clone()
    e.features(frames(2, 2), [1, 0], LoRAMode(PREMERGED))  # same key, other data
    assert torch.equal(first.cls, kept)


def test_an_engine_plan_replays_captures_warmed_by_the_daemon_warm_up(engines, tmp_path):
    """The daemon's warm-up runs every key once: afterwards serving captures nothing new."""
    from vlora_va.serving import profiling as P

    _, e = engines
    catalog = e.catalog()
    modes = [LoRAMode(PREMERGED), LoRAMode(UNMERGED), LoRAMode(MERGED, 0), LoRAMode(MIXTURE, 0)]
    P.warm_up(e, catalog, {TINY_IMAGE: modes}, [1, 2, 4, 8], bucketed=True)
    warmed = set(e.backend.graphs.captured)
    assert warmed == {PlanKey(56, m.kind, b) for m in modes for b in (1, 2, 4, 8)}
    now = time.time()
    reqs = [Request("c", i, "t", "detect" if i % 2 else "actions", frames(1, i), [0.0], Letterbox(1, 0, 0), (56, 56),
                    now, now, now + 9) for i in range(5)]
    e.switch(LoRAMode(PREMERGED))
    e.execute(make_plan(reqs, LoRAMode(PREMERGED), catalog))
    assert set(e.backend.graphs.captured) == warmed
