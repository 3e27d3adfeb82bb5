"""Targets and decoding agree on geometry: a head that outputs exactly the targets decodes to the labels."""

import math

import numpy as np
import pytest
import torch

from vlora_va.engine.heads import ActionHead, DetectionHead, Features
from vlora_va.training.frames import letterbox, letterbox_params, letterboxed_batch
from vlora_va.training.metrics import person_activity_report
from vlora_va.training.targets import build_targets, detection_loss, middle_frame_targets, person_loss, person_targets


def test_letterbox_is_centred_and_padded_with_114():
    img = np.zeros((100, 200, 3), np.uint8)
    out, lb = letterbox(img, 224)
    assert out.shape == (224, 224, 3) and lb.scale == 224 / 200 and lb.pad_x == 0 and lb.pad_y == (224 - 112) // 2
    assert (out[0] == 114).all() and (out[112] == 0).all()
    assert letterbox_params(200, 100, 224) == lb
    x, _ = letterboxed_batch([type("F", (), {"rgb": img})()], 224)
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
    got = sorted((d.cls, [round(v) for v in d.box]) for d in out)
    assert got == [("car", [400, 300, 560, 380]), ("person", [100, 80, 160, 200])]


@pytest.mark.parametrize("upsample", [2, 4])
def test_two_people_side_by_side_decode_as_two_boxes(upsample):
    """Two equal people 14 px apart: each one's centre cell regresses its own box (a cell near two centres takes
    the box whose peak is higher there), so the perfect outputs decode to both, on either grid."""
    side = 224
    grid = upsample * side // 14
    pair = [{"box": [100, 40, 140, 200], "class": "person"}, {"box": [114, 40, 154, 200], "class": "person"}]
    lb = letterbox_params(side, side, side)  # identity
    heat, box, weight, n = build_targets(pair, lb, side, grid, ["person"])
    assert n == 2 and (heat == 1).sum() == 2
    centres = (torch.arange(grid) + 0.5) * side / grid
    cy, cx = centres[:, None].expand(grid, grid), centres[None, :].expand(grid, grid)
    dist = torch.stack([cx - box[0], cy - box[1], box[2] - cx, box[3] - cy])
    head = DetectionHead(8, ["person"], image_size=side, score_threshold=0.5, nms_iou=0.7, upsample=upsample)
    out = head.decode((torch.logit(heat.clamp(1e-4, 1 - 1e-4))[None], dist[None]), [lb], [(side, side)])[0]
    assert sorted([round(v) for v in d.box] for d in out) == [[100, 40, 140, 200], [114, 40, 154, 200]]


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


# --- the action head's person branch ------------------------------------------------------------------------

ACTS = ["standing", "walking_left", "walking_right"]


def person_maps(targets, n_acts: int) -> torch.Tensor:
    """The person maps a perfect head would output for these targets."""
    heat, reg, mask, activity, _ = targets
    acts = torch.full((n_acts, *heat.shape), -10.0)
    for k in range(n_acts):
        acts[k][activity == k] = 10.0
    return torch.cat([torch.logit(heat.clamp(1e-4, 1 - 1e-4))[None], reg, acts])[None]


def test_person_targets_exactly():
    lb = letterbox_params(224, 224, 224)  # identity: 16x16 cells of 14 px
    persons = [{"box": [30, 40, 44, 68], "label": "walking_left"}]  # centre (37, 54): cell x=2, y=3
    seen = [[30, 40, 44, 68], [150, 150, 160, 170]]  # the labelled person, and someone never labelled
    heat, reg, mask, activity, care = person_targets(persons, seen, lb, 224, 16, ACTS)
    assert heat[3, 2] == 1 and (heat == 1).sum() == 1 and mask.sum() == 1 and mask[3, 2] == 1
    assert reg[:, 3, 2] == pytest.approx([37 / 14 - 2.5, 54 / 14 - 3.5, math.log(1.0), math.log(2.0)])
    assert sorted(map(tuple, (activity == 1).nonzero().tolist())) == [(2, 2), (3, 1), (3, 2), (3, 3), (4, 2)]
    assert (activity >= 0).sum() == 5
    assert care[11, 11] == 0 and care.sum() == 16 * 16 - 1  # only the unlabelled person's centre is exempt
    heat_f, reg_f, _, activity_f, care_f = person_targets(persons, seen, lb, 224, 16, ACTS, flip=True)
    assert torch.equal(heat_f, heat.flip(-1)) and torch.equal(care_f, care.flip(-1))
    assert torch.equal(activity_f >= 0, (activity >= 0).flip(-1)) and set(activity_f[activity_f >= 0].tolist()) == {2}


def test_a_person_the_rule_was_not_sure_of_is_a_person_without_an_activity():
    lb = letterbox_params(224, 224, 224)
    sure = [{"box": [30, 40, 44, 68], "label": "walking_left"}]
    unsure = sure + [{"box": [150, 150, 164, 178], "label": "standing", "sure": False}]
    heat, reg, mask, activity, care = person_targets(unsure, [p["box"] for p in unsure], lb, 224, 16, ACTS)
    assert mask.sum() == 2 and heat[11, 11] == 1  # both are person-centre targets
    assert (activity >= 0).sum() == 5 and set(activity[activity >= 0].tolist()) == {1}  # only the sure one's activity
    _, _, _, only_sure, _ = person_targets(sure, [p["box"] for p in sure], lb, 224, 16, ACTS)
    assert torch.equal(activity, only_sure)


def test_perfect_person_maps_decode_back_to_the_persons():
    side, lb = 336, letterbox_params(768, 576, 336)
    persons = [{"box": [100, 80, 140, 200], "label": "walking_right"}, {"box": [500, 300, 530, 380], "label": "standing"}]
    targets = person_targets(persons, [], lb, side, 24, ACTS)
    head = ActionHead(8, ["no_person", *ACTS], spatial="local", persons=True, image_size=side, score_threshold=0.5)
    (out,) = head.decode((torch.zeros(1, 4), person_maps(targets, 3), None), [lb], [(768, 576)])
    got = sorted((p.activity, [round(v) for v in p.box]) for p in out.persons)
    assert got == [("standing", [500, 300, 530, 380]), ("walking_right", [100, 80, 140, 200])]


def detection_outputs(heat, box, side):
    """The raw DetectionHead output a perfect head gives for build_targets' (heat, box) of a batch of frames."""
    grid = heat.shape[-1]
    centres = (torch.arange(grid) + 0.5) * side / grid
    cy, cx = centres[:, None].expand(grid, grid), centres[None, :].expand(grid, grid)
    dist = torch.stack([cx - box[:, 0], cy - box[:, 1], box[:, 2] - cx, box[:, 3] - cy], 1)
    return torch.logit(heat.clamp(1e-4, 1 - 1e-4)), dist


def test_person_boxes_from_the_middle_frames_decode_to_each_persons_mid_clip_box():
    """A walker moving right and a man standing, 4 frames: perfect per-frame box outputs on frames 1 and 2 give
    each person the mean of those two boxes (the clip's mid-time box) and the activity at its centre."""
    side, lb = 336, letterbox_params(768, 576, 336)
    walk = [[100 + 20 * t, 80, 140 + 20 * t, 200] for t in range(4)]
    still = [500, 300, 530, 380]
    frame_boxes = [[walk[t], still] for t in range(4)]
    heat, box, weight, count = middle_frame_targets(frame_boxes, lb, side, 96)
    assert heat.shape == (2, 1, 96, 96) and count.tolist() == [2, 2]
    assert torch.equal(heat[0, 0], build_targets([{"box": b, "class": "person"} for b in frame_boxes[1]], lb, side, 96,
                                                 ["person"])[0][0])  # frames 1 and 2 of 4, in order
    mid = [(u + v) / 2 for u, v in zip(walk[1], walk[2])]
    activity = person_targets([{"box": mid, "label": "walking_right"}, {"box": still, "label": "standing"}], [], lb,
                              side, 24, ACTS)
    head = ActionHead(8, ["no_person", *ACTS], spatial="local", persons=True, image_size=side, score_threshold=0.5,
                      boxes=4)
    (out,) = head.decode((torch.zeros(1, 6), person_maps(activity, len(ACTS)), detection_outputs(heat, box, side)),
                         [lb], [(768, 576)])
    got = sorted((p.activity, [round(v) for v in p.box]) for p in out.persons)
    assert got == [("standing", still), ("walking_right", [round(v) for v in mid])]
    # frames played backwards (reversed clips): still frames 1 and 2 of what the model sees
    assert torch.equal(middle_frame_targets(frame_boxes[::-1], lb, side, 96)[0][0], heat[1])


def test_person_tracks_name_each_persons_activity_by_its_motion():
    """The same walker and standing man with perfect box outputs on all 4 frames and activity maps that say the
    opposite: with activity_from "track" each person's boxes over the clip name the activity (the label rule); with
    "maps" the maps do. A person seen only on the middle frames keeps the maps' activity."""
    side, lb = 336, letterbox_params(768, 576, 336)
    walk = [[100 + 20 * t, 80, 140 + 20 * t, 200] for t in range(4)]  # 0.56 heights/s to the right
    still, brief = [500, 300, 530, 380], [300, 100, 330, 180]
    frame_boxes = [[walk[t], still] + ([brief] if t in (1, 2) else []) for t in range(4)]
    outputs = [build_targets([{"box": b, "class": "person"} for b in boxes], lb, side, 96, ["person"])
               for boxes in frame_boxes]
    raw_boxes = detection_outputs(torch.stack([o[0] for o in outputs]), torch.stack([o[1] for o in outputs]), side)
    mid = [(u + v) / 2 for u, v in zip(walk[1], walk[2])]
    maps = person_maps(person_targets([{"box": mid, "label": "standing"}, {"box": still, "label": "walking_left"},
                                       {"box": brief, "label": "walking_left"}], [], lb, side, 24, ACTS), len(ACTS))
    got = {}
    for source in ("track", "maps"):
        head = ActionHead(8, ["no_person", *ACTS], spatial="local", persons=True, image_size=side, score_threshold=0.5,
                          boxes=4, activity_from=source)
        middle = raw_boxes if source == "track" else tuple(r[1:3] for r in raw_boxes)
        (out,) = head.decode((torch.zeros(1, 6), maps, middle), [lb], [(768, 576)], [[0.0, 0.3, 0.6, 0.9]])
        got[source] = sorted((p.activity, [round(v) for v in p.box], p.activity_from) for p in out.persons)
    assert got["track"] == [("standing", still, "track"), ("walking_left", brief, "maps"),
                            ("walking_right", [round(v) for v in mid], "track")]
    assert got["maps"] == [("standing", [round(v) for v in mid], "maps"), ("walking_left", brief, "maps"),
                           ("walking_left", still, "maps")]


def test_person_loss_is_lower_for_the_right_answer():
    lb = letterbox_params(224, 224, 224)
    targets = person_targets([{"box": [30, 40, 44, 68], "label": "walking_left"}], [], lb, 224, 16, ACTS)
    batched = [t[None] for t in targets]
    good = person_maps(targets, 3)
    wrong_activity = good.clone()
    wrong_activity[:, 5:] = wrong_activity[:, 5:].roll(1, dims=1)
    nobody = good.clone()
    nobody[:, 0] = -10.0
    lg = person_loss(good, *batched)
    assert torch.isfinite(lg) and lg < person_loss(wrong_activity, *batched) and lg < person_loss(nobody, *batched)


def test_person_branch_learns_each_movers_activity_from_these_targets():
    """Head + targets + loss together: two one-patch movers per clip, each left, right or still, anywhere."""

    def clips(n, seed):
        g = torch.Generator().manual_seed(seed)
        grids = torch.randn(n, 4, 8, 16, 16, generator=g) * 0.3
        refs = []
        for i in range(n):
            people = []
            for row in (int(torch.randint(2, 6, (1,), generator=g)), int(torch.randint(9, 13, (1,), generator=g))):
                col, k = int(torch.randint(4, 12, (1,), generator=g)), int(torch.randint(0, 3, (1,), generator=g))
                step = [0, -1, 1][k]
                for t in range(4):
                    grids[i, t, :, row, col + step * t] += 2.0
                mean_col = col + step * 1.5
                people.append({"box": [mean_col * 14, row * 14 - 7, mean_col * 14 + 14, row * 14 + 21], "label": ACTS[k]})
            refs.append(people)
        return Features(torch.zeros(n * 4, 8), grids.reshape(n * 4, 8, 16, 16)), refs

    lb = letterbox_params(224, 224, 224)
    torch.manual_seed(0)
    head = ActionHead(8, ["no_person", *ACTS], width=8, motion=True, spatial="local", persons=True)
    train, refs = clips(24, seed=0)
    targets = [torch.stack(t) for t in zip(*(person_targets(r, [], lb, 224, 16, ACTS) for r in refs))]
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        person_loss(head(train, 4)[1], *targets).backward()
        opt.step()
    test, test_refs = clips(16, seed=1)
    with torch.no_grad():
        out = head.decode(head(test, 4), [lb] * 16, [(224, 224)] * 16)
    report = person_activity_report([o.to_json()["persons"] for o in out], test_refs, ACTS, threshold=0.3)
    assert report["recall"] >= 0.9 and report["top1"] >= 0.9, report
