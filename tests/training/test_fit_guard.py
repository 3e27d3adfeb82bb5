"""The fit's guard (training/fit_guard.py): kept only when better beyond the noise of the held-out frames, refused when
not better, when within the noise, or when a class with enough references got worse; vehicle classes judged as one.

The references are the shipped human-checked boxes of pedestrians.mp4; the "adapters" are those boxes themselves
with honest damage (people dropped, boxes of other frames), so each verdict is known in advance from the books here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vlora_va.training.evaluate import load_human_set
from vlora_va.training.fit_guard import CLASS_TOLERANCE, judge, pooled_items
from vlora_va.training.paired import f1_at

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def refs() -> dict[str, list[dict]]:
    hs = load_human_set(ROOT / "adapters" / "eval" / "human-v1.json")
    return {k: v for k, v in hs.boxes.items() if k.startswith("pedestrians@")}


def as_predictions(refs: dict[str, list[dict]], keep_every: int = 1, score: float = 0.9) -> dict[str, list[dict]]:
    """The counted reference boxes as an adapter's predictions, every `keep_every`-th person kept (1: all)."""
    out = {}
    for k, boxes in refs.items():
        counted = [b for b in boxes if not b["ignore"]]
        out[k] = [{"box": b["box"], "class": b["class"], "score": score} for i, b in enumerate(counted)
                  if b["class"] != "person" or i % keep_every == 0]
    return out


def shuffled(preds: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each frame given another frame's boxes (a model that learnt labels shuffled across frames)."""
    keys = sorted(preds)
    return {k: preds[keys[(i + len(keys) // 2) % len(keys)]] for i, k in enumerate(keys)}


def test_a_clearly_better_fit_is_kept(refs):
    v = judge(as_predictions(refs, keep_every=3), as_predictions(refs), refs, (0.5, 0.5), "human boxes")
    assert v.kept and v.fitted_f1 == 1.0 and v.start_f1 < 0.8 and v.ci95[0] > 0
    assert v.frames == 49 and "better against the human boxes" in v.reason


def test_a_worse_fit_is_refused_with_both_scores(refs):
    good = as_predictions(refs)
    v = judge(good, shuffled(good), refs, (0.5, 0.5), "human boxes")
    assert not v.kept and v.fitted_f1 < v.start_f1
    assert f"{v.start_f1:.3f} -> {v.fitted_f1:.3f}" in v.reason


def test_better_within_the_noise_is_refused(refs):
    """One person found more in one frame of 49: better, but the bootstrap's interval reaches 0."""
    start = as_predictions(refs)
    k = sorted(refs)[0]
    start[k] = start[k][1:]
    v = judge(start, as_predictions(refs), refs, (0.5, 0.5), "human boxes")
    assert not v.kept and v.delta > 0 and v.ci95[0] <= 0 and "within the noise" in v.reason


def test_a_class_that_gets_worse_is_refused_even_when_the_pool_gains(refs):
    """Persons found better, but the parked car (49 references) lost: refused for the car."""
    start = as_predictions(refs, keep_every=2)
    fitted = {k: [b for b in v if b["class"] != "car"] for k, v in as_predictions(refs).items()}
    v = judge(start, fitted, refs, (0.5, 0.5), "human boxes")
    assert v.per_class["person"]["fitted_f1"] > v.per_class["person"]["start_f1"]
    assert v.per_class["vehicle"]["start_f1"] - v.per_class["vehicle"]["fitted_f1"] > CLASS_TOLERANCE
    assert not v.kept and v.reason.startswith("worse on vehicle")


def test_each_side_is_read_at_its_own_threshold(refs):
    """The same boxes at score 0.3: at a threshold of 0.2 they are all there, at 0.5 none is."""
    preds = as_predictions(refs, score=0.3)
    assert judge(preds, preds, refs, (0.5, 0.2), "human boxes").fitted_f1 == 1.0
    assert judge(preds, preds, refs, (0.5, 0.2), "human boxes").start_f1 == 0.0


def test_a_car_called_a_truck_is_still_the_vehicle_it_is():
    refs = {"cam@1.000": [{"box": [0, 0, 100, 50], "class": "car", "ignore": False}] * 1}
    refs.update({f"cam@{i}.000": [{"box": [0, 0, 100, 50], "class": "car", "ignore": False}] for i in range(2, 13)})
    called_truck = {k: [{"box": [0, 0, 100, 50], "class": "truck", "score": 0.9}] for k in refs}
    v = judge({k: [] for k in refs}, called_truck, refs, (0.5, 0.5), "human boxes")
    assert v.kept and v.fitted_f1 == 1.0 and list(v.per_class) == ["vehicle"]


def test_no_references_is_refused_not_guessed():
    v = judge({}, {}, {"cam@1.000": [{"box": [0, 0, 9, 9], "class": "person", "ignore": True}]}, (0.5, 0.5), "x")
    assert not v.kept and "no reference objects" in v.reason


def test_pooled_items_count_every_class_per_frame(refs):
    preds = as_predictions(refs)
    items = pooled_items(preds, refs, sorted(refs), ["person", "car", "truck"], 0.5)
    assert len(items) == 49 and f1_at(items, 0.0) == 1.0
    assert sum(it.refs for it in items) == sum(1 for v in refs.values() for b in v if not b["ignore"])
