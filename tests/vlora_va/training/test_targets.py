"""Targets and decoding agree on geometry: a head that outputs exactly the targets decodes to the labels."""

import torch

from vlora_va.heads import DetectionHead
from vlora_va.training.frames import letterbox, letterbox_params, model_input
from vlora_va.training.targets import build_targets, detection_loss

import numpy as np


def test_letterbox_is_centred_and_padded_with_114():
    img = np.zeros((100, 200, 3), np.uint8)
    out, lb = letterbox(img, 224)
    assert out.shape == (224, 224, 3) and lb.scale == 224 / 200 and lb.pad_x == 0 and lb.pad_y == (224 - 112) // 2
    assert (out[0] == 114).all() and (out[112] == 0).all()
    assert letterbox_params(200, 100, 224) == lb
    x, _ = model_input([type("F", (), {"rgb": img})()], 224)
    assert x.shape == (1, 3, 224, 224)


def test_perfect_outputs_decode_back_to_the_labels():
    side, grid = 224, 32
    labels = [{"box": [100, 80, 160, 200], "class": "person", "score": 1.0},
              {"box": [400, 300, 560, 380], "class": "car", "score": 1.0}]
    lb = letterbox_params(768, 576, side)
    heat, box, weight, n = build_targets(labels, lb, side, grid, ["person", "car"])
    assert n == 2 and heat.amax() == 1 and (heat == 1).sum() == 2
    head = DetectionHead(8, ["person", "car"], image_size=side, score_threshold=0.5)
    centres = (torch.arange(grid) + 0.5) * side / grid
    cy, cx = centres[:, None].expand(grid, grid), centres[None, :].expand(grid, grid)
    dist = torch.stack([cx - box[0], cy - box[1], box[2] - cx, box[3] - cy])
    logits = torch.logit(heat.clamp(1e-4, 1 - 1e-4))
    out = head.decode((logits[None], dist[None]), [lb], [(768, 576)])[0]
    got = sorted((d["class"], [round(v) for v in d["box"]]) for d in out)
    assert got == [("car", [400, 300, 560, 380]), ("person", [100, 80, 160, 200])]


def test_flip_mirrors_targets():
    lb = letterbox_params(224, 224, 224)
    labels = [{"box": [10, 10, 30, 50], "class": "person", "score": 1.0}]
    heat, *_ = build_targets(labels, lb, 224, 32, ["person"])
    heat_f, *_ = build_targets(labels, lb, 224, 32, ["person"], flip=True)
    assert torch.equal(heat_f, heat.flip(-1))


def test_loss_is_finite_and_lower_for_the_right_answer():
    lb = letterbox_params(224, 224, 224)
    labels = [{"box": [50, 50, 80, 120], "class": "person", "score": 1.0}]
    heat, box, weight, n = build_targets(labels, lb, 224, 32, ["person"])
    t = (heat[None], box[None], weight[None], torch.tensor([n]))
    good = (torch.logit(heat.clamp(1e-4, 1 - 1e-4))[None], torch.full((1, 4, 32, 32), 10.0))
    bad = (torch.zeros(1, 1, 32, 32), torch.full((1, 4, 32, 32), 10.0))
    lg, lbad = detection_loss(good, *t, 224), detection_loss(bad, *t, 224)
    assert torch.isfinite(lg) and lg < lbad
