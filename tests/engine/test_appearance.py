"""Appearance embeddings (engine/heads/appearance.py) against plain loops, and served by the engine to the requests
that ask for them."""

import time

import numpy as np
import pytest
import torch

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.backends.torch_eager import lower, normalise
from vlora_va.engine.executor import Engine
from vlora_va.engine.heads.appearance import (DTYPE, PARTS, TOKEN_SHARE, appearance_embeddings, box_embeddings,
                                              colour_histograms)
from vlora_va.engine.heads.features import token_grid
from vlora_va.engine.modes import PREMERGED, UNMERGED, LoRAMode
from vlora_va.serving.scheduling import make_plan
from vlora_va.testing.tiny import TINY_IMAGE

from tests.engine.test_executor import frames, upper_only_adapter


def plain_box_embedding(grid: np.ndarray, box, image_size: int, parts: int) -> np.ndarray:
    """The docstring's loop, cell by cell."""
    d, gh, gw = grid.shape
    ph, pw = image_size / gh, image_size / gw
    x1, y1, x2, y2 = box
    bands = []
    for k in range(parts):
        ya, yb = y1 + (y2 - y1) * k / parts, y1 + (y2 - y1) * (k + 1) / parts
        acc, total = np.zeros(d), 0.0
        for i in range(gh):
            for j in range(gw):
                w = max(0.0, min(yb, (i + 1) * ph) - max(ya, i * ph)) * max(0.0, min(x2, (j + 1) * pw) - max(x1, j * pw))
                acc += w * grid[:, i, j]
                total += w
        v = acc / max(total, 1e-6)
        bands.append(v / max(np.linalg.norm(v), 1e-12))
    return np.concatenate(bands) / np.sqrt(parts)


def plain_colour_histogram(rgb: np.ndarray, box, parts: int, bins: int, samples: int) -> np.ndarray:
    """The docstring's loop, sample by sample, on the uint8 image."""
    x1, y1, x2, y2 = box
    size = rgb.shape[0]
    out = []
    for k in range(parts):
        ya, yb = y1 + (y2 - y1) * k / parts, y1 + (y2 - y1) * (k + 1) / parts
        h = np.zeros(bins ** 3)
        for j in range(samples):
            for i in range(samples):
                x = min(max(int(np.floor(x1 + (x2 - x1) * (i + 0.5) / samples)), 0), size - 1)
                y = min(max(int(np.floor(ya + (yb - ya) * (j + 0.5) / samples)), 0), size - 1)
                r, g, b = (int(c) * bins // 256 for c in rgb[y, x])
                h[r * bins * bins + g * bins + b] += 1
        h = np.sqrt(h / samples ** 2)
        out.append(h / max(np.linalg.norm(h), 1e-12))
    return np.concatenate(out) / np.sqrt(parts)


def test_box_embeddings_are_the_area_weighted_band_means_of_the_docstring():
    g = torch.Generator().manual_seed(0)
    grid = torch.randn(8, 6, 6, generator=g)
    boxes = torch.tensor([[3.0, 5.0, 40.0, 70.0], [0.0, 0.0, 84.0, 84.0], [50.5, 10.2, 51.5, 80.0], [70, 70, 83, 83]])
    got = box_embeddings(grid, boxes, 84).float().numpy()
    assert got.dtype == np.float32 and box_embeddings(grid, boxes, 84).dtype == DTYPE
    for k, b in enumerate(boxes.tolist()):
        np.testing.assert_allclose(got[k], plain_box_embedding(grid.numpy(), b, 84, PARTS), atol=2e-3)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=2e-3)
    assert box_embeddings(grid, torch.zeros(0, 4), 84).shape == (0, PARTS * 8)


def test_colour_histograms_count_the_pixels_of_each_band_as_the_docstring_says():
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
    rgb[:20, 5:15] = (250, 10, 10)  # a red top over
    rgb[20:, 5:15] = (10, 10, 250)  # a blue bottom
    pixels = normalise(torch.from_numpy(rgb)[None])[0]
    boxes = torch.tensor([[5.0, 0.0, 15.0, 40.0], [0.0, 0.0, 40.0, 40.0], [30.2, 31.7, 44.0, 47.0]])
    got = colour_histograms(pixels, boxes, 2, 4, 8).numpy()
    for k, b in enumerate(boxes.tolist()):
        np.testing.assert_allclose(got[k], plain_colour_histogram(rgb, b, 2, 4, 8), atol=1e-5)
    # the red-over-blue person and a blue-over-red one: same colours, other order, told apart by the bands
    flipped = np.ascontiguousarray(rgb[::-1])
    other = colour_histograms(normalise(torch.from_numpy(flipped)[None])[0], boxes[:1], 2, 4, 8).numpy()
    assert float(got[0] @ other[0]) < 0.1


def test_an_embedding_is_a_unit_vector_whose_cosine_weighs_tokens_and_colours():
    g = torch.Generator().manual_seed(2)
    grid = torch.randn(16, 6, 6, generator=g)
    pixels = torch.randn(3, 84, 84, generator=g)
    boxes = torch.tensor([[3.0, 5.0, 40.0, 70.0], [44.0, 2.0, 80.0, 60.0]])
    e = appearance_embeddings(grid, pixels, boxes, 84).float()
    t = box_embeddings(grid, boxes, 84).float()
    c = colour_histograms(pixels, boxes)
    torch.testing.assert_close(e.norm(dim=1), torch.ones(2), atol=3e-3, rtol=0)
    cos = float(e[0] @ e[1])
    assert cos == pytest.approx(TOKEN_SHARE * float(t[0] @ t[1]) + (1 - TOKEN_SHARE) * float(c[0] @ c[1]), abs=3e-3)
    assert appearance_embeddings(grid, None, boxes, 84).shape == t.shape  # no pixels: tokens alone


def embed_request(name, shared, embed, seq=0):
    now = time.time()
    return Request("cam", seq, name, name, shared, [0.1 * i for i in range(len(shared))], Letterbox(1.0, 0.0, 0.0),
                   (TINY_IMAGE, TINY_IMAGE), now, now, now + 5, embed=embed)


@pytest.mark.parametrize("mode", [LoRAMode(PREMERGED), LoRAMode(UNMERGED)])
def test_the_engine_gives_embeddings_of_the_plain_backbone_only_to_requests_that_ask(tiny_backbone_dir, tiny_adapters,
                                                                                   tmp_path, mode):
    """An adapter with LoRA from block 1: its embeddings pool the tokens entering block 1, which are the plain
    backbone's, and the model input's colours. Alone (no shared prefix) and beside another request on the same
    frames (block 0 shared), they are the same; a request that does not ask gets none."""
    adapters = {"up1": upper_only_adapter(tmp_path / "up1", tiny_adapters["detect"], 3),
                "up2": upper_only_adapter(tmp_path / "up2", tiny_adapters["detect"], 4)}
    for a in adapters.values():
        a.head.score_threshold = 0.0  # a random head: every peak is a box, so there is something to embed
    backbone = load_backbone(str(tiny_backbone_dir))
    engine = Engine(backbone, adapters, TINY_IMAGE, premerge_max_mb=64)
    assert engine.embed_layer("up1") == 1
    shared = frames(2, 5)
    plain = load_backbone(str(tiny_backbone_dir))
    pixels = normalise(torch.from_numpy(np.stack(shared)))
    with torch.inference_mode():
        grid = token_grid(lower(plain, pixels, 1), TINY_IMAGE, 14)
    alone = engine.execute(make_plan([embed_request("up1", [f.copy() for f in shared], True)], mode,
                                     engine.catalog()))[0]
    both_plan = make_plan([embed_request("up1", shared, True), embed_request("up2", shared, False)], mode,
                          engine.catalog())
    assert both_plan.groups[0].prefix == 1
    both = engine.execute(both_plan)
    seen = 0
    for result in (alone, both[0]):
        for k, frame in enumerate(result.frames):
            assert frame.detections
            for d in frame.detections:
                want = appearance_embeddings(grid[k], pixels[k], torch.tensor([d.box]), TINY_IMAGE)[0].float()
                np.testing.assert_allclose(d.embedding.astype(np.float32), want.numpy(), atol=5e-3)
                seen += 1
    assert seen > 0
    assert all(d.embedding is None for f in both[1].frames for d in f.detections)
