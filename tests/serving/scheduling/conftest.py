"""A catalog and a cost profile written by hand (not measured), so every scheduling decision has numbers a
reader can check: 10 ms per batch + 50 ms per image at 224 px, 100 ms per image at 336 px; LoRA factors as
a slow CPU would show them; a weight switch of 20 ms."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.engine.plan import AdapterInfo, Catalog
from vlora_va.serving.costs import CostModel, CostProfile

FRAME = np.zeros((4, 4, 3), dtype=np.uint8)
_seq = itertools.count()


def catalog(names=("a", "b", "c", "d"), sizes=None, premerge=True, max_batch=8) -> Catalog:
    sizes = sizes or {}
    infos = {n: AdapterInfo(n, i, sizes.get(n, 224), "detection", 1, True, True) for i, n in enumerate(names)}
    return Catalog(infos, premerge, True, 336, max_batch)


def profile(premerged=1.04, unmerged=(1.15, 1.4), mixture=(1.0, 1.3), switch_s=0.02) -> CostProfile:
    return CostProfile(
        key={"test": True},
        base={224: [(1, 0.06), (4, 0.21)], 336: [(1, 0.11), (4, 0.41)]},
        factors={"merged": {1: 1.0}, "premerged": {1: 1.0, 4: premerged}, "unmerged": {1: unmerged[0], 4: unmerged[1]},
                 "mixture": {1: mixture[0], 4: mixture[1]}, "unmerged/einsum": {1: 1.3, 4: 2.0}},
        switch_s=switch_s)


def request(adapter, now, deadline_s=2.0, images=1, waited_s=0.0, stream="s", priority=0, seq=None) -> Request:
    return Request(stream, next(_seq) if seq is None else seq, "t", adapter, [FRAME] * images,
                   [0.1 * i for i in range(images)], Letterbox(1.0, 0.0, 0.0), (4, 4), ready=now - waited_s,
                   received=now - waited_s, deadline=now - waited_s + deadline_s, priority=priority)


@pytest.fixture
def costs():
    return CostModel(profile())
