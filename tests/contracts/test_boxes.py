"""vlora_va.contracts.boxes: the one IoU and the one greedy NMS, each against the plain loop its docstring states,
on numpy and on torch tensors."""

import numpy as np
import pytest
import torch

from vlora_va.contracts.boxes import greedy_keep, intersection, iou_matrix, pair_iou


def iou_reference(a, b) -> float:
    """The loop iou_matrix states, for one pair, in plain Python floats."""
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def random_boxes(rng, n: int) -> np.ndarray:
    """Boxes on a 100 px frame, with degenerate ones mixed in: zero width, zero height, a point, and repeats."""
    xy = rng.uniform(0, 100, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(0, 40, (n, 2))], 1)
    boxes[::7, 2] = boxes[::7, 0]  # zero width
    boxes[3::11, 3] = boxes[3::11, 1]  # zero height
    boxes[5::13, 2:] = boxes[5::13, :2]  # a point
    boxes[1::9] = boxes[0]  # the same box again
    return boxes


@pytest.mark.parametrize("seed", range(3))
def test_iou_matrix_is_the_plain_loop_to_the_bit(seed):
    rng = np.random.default_rng(seed)
    a, b = random_boxes(rng, 30), random_boxes(rng, 40)
    want = [[iou_reference(x.tolist(), y.tolist()) for y in b] for x in a]
    assert iou_matrix(a, b).tolist() == want
    assert iou_matrix(torch.from_numpy(a), torch.from_numpy(b), torch).tolist() == want  # float64 tensors alike
    assert [[pair_iou(x.tolist(), y.tolist()) for y in b] for x in a] == want


def test_degenerate_boxes():
    point, line, box = [5, 5, 5, 5], [0, 5, 10, 5], [0, 0, 10, 10]
    assert iou_matrix([point, line], [point, line]).tolist() == [[0.0, 0.0], [0.0, 0.0]]  # no area, no overlap
    assert pair_iou(line, box) == 0.0 and pair_iou(box, box) == 1.0
    assert pair_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(1 / 3)
    assert pair_iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0  # touching edges


def test_empty_sets_and_integer_boxes():
    assert iou_matrix([], [[0, 0, 1, 1]]).shape == (0, 1) and iou_matrix([[0, 0, 1, 1]], []).shape == (1, 0)
    assert iou_matrix([[0, 0, 2, 2]], [[1, 0, 3, 2]]).tolist() == [[1 / 3]]  # ints divide as floats


def test_float32_tensors_match_float32_arrays():
    """The engine's tensors and the metrics' float32 arrays: the same operations, the same values."""
    rng = np.random.default_rng(7)
    a, b = random_boxes(rng, 25).astype(np.float32), random_boxes(rng, 25).astype(np.float32)
    got = iou_matrix(torch.from_numpy(a), torch.from_numpy(b), torch)
    assert got.dtype == torch.float32 and got.numpy().tobytes() == iou_matrix(a, b).tobytes()


def test_intersection_is_the_plain_loop():
    rng = np.random.default_rng(3)
    a, b = random_boxes(rng, 10), random_boxes(rng, 12)
    want = [[max(0.0, min(x[2], y[2]) - max(x[0], y[0])) * max(0.0, min(x[3], y[3]) - max(x[1], y[1])) for y in b]
            for x in a]
    assert intersection(a, b).tolist() == want


def keep_reference(over) -> list[bool]:
    """The loop greedy_keep states: for j in order, keep[j] = not any(keep[i] and over[i][j] for i < j)."""
    keep: list[bool] = []
    for j in range(len(over)):
        keep.append(not any(keep[i] and over[i][j] for i in range(j)))
    return keep


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("density", [0.02, 0.2, 0.8])
def test_greedy_keep_is_the_plain_loop(seed, density):
    """Random suppression rules, sparse to dense (long chains: a suppressed box suppresses nobody)."""
    rng = np.random.default_rng(seed)
    over = np.triu(rng.random((60, 60)) < density, 1)
    want = keep_reference(over.tolist())
    assert greedy_keep(over).tolist() == want
    assert greedy_keep(torch.from_numpy(over)).tolist() == want


def test_greedy_keep_of_a_chain_and_of_nothing():
    """0 suppresses 1, 1 would suppress 2: 2 stays (1 is gone). The worst case for the fixed point: n steps."""
    chain = np.triu(np.eye(6, k=1, dtype=bool), 1)
    assert greedy_keep(chain).tolist() == [True, False, True, False, True, False]
    assert greedy_keep(np.zeros((0, 0), bool)).tolist() == []
