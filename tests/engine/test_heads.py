import math

import pytest
import torch

from vlora_va.contracts.boxes import iou_matrix
from vlora_va.contracts.geometry import Letterbox
from vlora_va.engine.heads import (
    ActionHead,
    DetectionHead,
    Features,
    batched_nms,
    extend_track,
    link_index_pairs,
    middle_frames,
    person_tracks,
    track_activity,
)
from vlora_va.engine.motion import TRACK_SHARE


def nms_reference(boxes, scores, classes, thr):
    """Plain greedy NMS loop, one class at a time."""
    keep = []
    for i in sorted(range(len(scores)), key=lambda i: -float(scores[i])):
        if all(classes[i] != classes[j] or iou_matrix(boxes[i:i + 1], boxes[j:j + 1], torch).item() <= thr for j in keep):
            keep.append(i)
    return keep


@pytest.mark.parametrize("seed", range(5))
def test_batched_nms_matches_the_plain_loop(seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(40, 2, generator=g) * 100
    boxes = torch.cat([xy, xy + 10 + torch.rand(40, 2, generator=g) * 30], 1)
    scores = torch.rand(40, generator=g)
    classes = torch.randint(0, 3, (40,), generator=g)
    assert batched_nms(boxes, scores, classes, 0.5).tolist() == nms_reference(boxes, scores, classes, 0.5)


def test_untrained_detection_head_detects_nothing():
    head = DetectionHead(16, ["person"], image_size=56)
    feats = Features(torch.zeros(2, 16), torch.randn(2, 16, 4, 4))
    assert head.decode(head(feats), [Letterbox(1, 0, 0)] * 2, [(56, 56)] * 2) == [[], []]


def test_decode_maps_a_peak_through_the_letterbox_to_original_pixels():
    head = DetectionHead(8, ["person", "car"], image_size=56)
    logits = torch.full((1, 2, 8, 8), -10.0)
    logits[0, 1, 3, 5] = 3.0  # one car at cell (y=3, x=5); cells are 7 px: centre (38.5, 24.5)
    dist = torch.zeros(1, 4, 8, 8)
    dist[0, :, 3, 5] = torch.tensor([10.0, 4.0, 6.0, 8.0])  # left, top, right, bottom
    lb = Letterbox(scale=0.5, pad_x=0.0, pad_y=7.0)  # original 112x84 → 56x42 + 7 px pad top/bottom
    (dets,) = head.decode((logits, dist), [lb], [(112, 84)])
    assert len(dets) == 1 and dets[0].cls == "car"
    assert dets[0].score == pytest.approx(1 / (1 + math.exp(-3)), abs=1e-4)
    x1, y1, x2, y2 = (38.5 - 10) / 0.5, (24.5 - 4 - 7) / 0.5, (38.5 + 6) / 0.5, (24.5 + 8 - 7) / 0.5
    assert dets[0].box == pytest.approx([x1, y1, x2, y2], abs=0.1)


def test_action_head_scores_each_clip():
    head = ActionHead(16, ["a", "b", "c"])
    feats = Features(torch.zeros(6, 16), torch.randn(6, 16, 4, 4))
    logits, persons, boxes = head(feats, clip_len=3)
    assert logits.shape == (2, 3) and persons is None and boxes is None  # no person branch unless asked for
    out = head.decode((logits, persons, boxes))
    assert len(out) == 2 and all(o.label in "abc" and abs(sum(o.scores.values()) - 1) < 1e-3 for o in out)
    assert all(o.score == max(o.scores.values()) and o.persons is None for o in out)
    assert all(o.persons is None and "persons" not in o.to_json() for o in out)


def moving_blob_clips(n: int, T: int = 8, hidden: int = 8, size: int = 16, seed: int = 0):
    """n clips of a one-patch feature blob crossing a grid of noise, left (label 0) or right (label 1)."""
    g = torch.Generator().manual_seed(seed)
    grids = torch.randn(n, T, hidden, size, size, generator=g) * 0.3
    labels = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        row, col = (int(v) for v in torch.randint(2, size - 2 - T, (2,), generator=g))
        for t in range(T):
            c = col + (T - 1 - t if labels[i] == 0 else t)
            grids[i, t, :, row, c] += 2.0
    return Features(torch.zeros(n * T, hidden), grids.reshape(n * T, hidden, size, size)), labels


def test_local_action_head_learns_direction_of_a_one_patch_mover():
    """The case the 'local' head is for: direction of something one patch wide, at unseen places."""
    torch.manual_seed(0)
    head = ActionHead(8, ["left", "right"], width=8, motion=True, spatial="local")
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    train, y = moving_blob_clips(32)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(train, 8)[0], y).backward()
        opt.step()
    test, y_test = moving_blob_clips(32, seed=1)
    with torch.no_grad():
        acc = (head(test, 8)[0].argmax(-1) == y_test).float().mean().item()
    assert acc >= 0.9


def test_action_head_clips_are_independent_and_bad_spatial_is_named():
    head = ActionHead(8, ["a", "b"], width=4, motion=True, spatial="local")
    feats, _ = moving_blob_clips(3)
    with torch.no_grad():
        before = head(feats, 8)[0]
        feats.grid[16:] += 1.0  # change only the third clip's frames
        after = head(feats, 8)[0]
    assert torch.equal(before[:2], after[:2]) and not torch.allclose(before[2], after[2])
    with pytest.raises(ValueError, match="spatial must be 'pooled' or 'local', got 'global'"):
        ActionHead(8, ["a"], spatial="global")


def test_untrained_person_branch_sees_nobody():
    head = ActionHead(8, ["no_person", "standing", "walking_left"], width=4, motion=True, spatial="local", persons=True)
    feats = Features(torch.zeros(8, 8), torch.randn(8, 8, 6, 6))
    out = head.decode(head(feats, 4), [Letterbox(1, 0, 0)] * 2, [(84, 84)] * 2)
    assert [o.persons for o in out] == [(), ()]
    assert head.person_labels == ["standing", "walking_left"]  # no_person is a clip label, not a person's


def test_person_decode_maps_a_peak_through_the_letterbox_to_original_pixels():
    head = ActionHead(8, ["no_person", "standing", "walking_left"], spatial="local", persons=True, image_size=56)
    maps = torch.zeros(1, 5 + 2, 4, 4)  # 4x4 cells of 14 px
    maps[0, 0] = -10.0
    maps[0, 0, 2, 2] = 2.0  # one person centred in cell (y=2, x=2) ...
    maps[0, 1:5, 2, 2] = torch.tensor([0.25, -0.5, math.log(1.0), math.log(2.0)])  # ... offset, 14x28 px box
    maps[0, 5:, 2, 2] = torch.tensor([0.0, 3.0])  # walking_left
    lb = Letterbox(scale=0.5, pad_x=0.0, pad_y=7.0)
    (out,) = head.decode((torch.zeros(1, 3), maps, None), [lb], [(112, 84)])
    (p,) = out.persons
    cx, cy = (2 + 0.5 + 0.25) * 14, (2 + 0.5 - 0.5) * 14  # model px
    assert p.box == pytest.approx([(cx - 7) / 0.5, (cy - 14 - 7) / 0.5, (cx + 7) / 0.5, (cy + 14 - 7) / 0.5], abs=0.1)
    assert p.score == pytest.approx(1 / (1 + math.exp(-2)), abs=1e-4)
    assert p.activity == "walking_left" and p.activity_score == pytest.approx(1 / (1 + math.exp(-3)), abs=1e-4)


def test_person_branch_needs_the_local_grid_and_each_clips_letterbox():
    with pytest.raises(ValueError, match="persons=true needs spatial 'local'"):
        ActionHead(8, ["a"], spatial="pooled", persons=True)
    head = ActionHead(8, ["a", "b"], width=4, spatial="local", persons=True)
    feats = Features(torch.zeros(4, 8), torch.randn(4, 8, 4, 4))
    with pytest.raises(ValueError, match="needs each clip's letterbox"):
        head.decode(head(feats, 4))


def test_person_boxes_need_the_persons_branch_and_run_on_each_clips_middle_frames():
    with pytest.raises(ValueError, match="boxes needs persons=true"):
        ActionHead(8, ["a", "b"], spatial="local", boxes=4)
    assert middle_frames(2, 4).tolist() == [1, 2, 5, 6]
    assert middle_frames(1, 3).tolist() == [1, 2] and middle_frames(1, 2).tolist() == [0, 1]
    assert middle_frames(2, 8).tolist() == [3, 4, 11, 12] and middle_frames(1, 1).tolist() == [0, 0]
    head = ActionHead(8, ["a", "b"], width=4, spatial="local", persons=True, boxes=2, box_width=16, image_size=56)
    grid = torch.randn(8, 8, 4, 4)
    _, _, (logits, dist) = head(Features(torch.zeros(8, 8), grid), 4)
    assert logits.shape == (4, 1, 8, 8) and dist.shape == (4, 4, 8, 8)  # 2 clips x 2 frames, the grid x2
    want = head.box_head(Features(torch.zeros(4, 8), grid[[1, 2, 5, 6]]))
    assert torch.equal(logits, want[0]) and torch.equal(dist, want[1])


def test_person_tracks_on_the_middle_frames_join_each_box_to_its_best_overlap_in_the_next_frame():
    first = [([50, 0, 60, 20], 0.6), ([0, 0, 10, 20], 0.9)]  # any order: the best box links first
    second = [([52, 0, 62, 20], 0.4), ([2, 0, 12, 20], 0.7), ([200, 0, 210, 20], 0.5)]
    got = [(score, box) for score, box, _ in person_tracks([first, second], 0.0)]
    assert got == [(pytest.approx(0.8), [1.0, 0.0, 11.0, 20.0]), (pytest.approx(0.5), [51.0, 0.0, 61.0, 20.0]),
                   (0.5, [200, 0, 210, 20])]  # the unlinked box of the second frame stays a person
    # the best first box takes its best overlap even when a weaker first box overlaps it too
    crowd = person_tracks([[([0, 0, 10, 20], 0.9), ([4, 0, 14, 20], 0.5)], [([3, 0, 13, 20], 0.8)]], 0.0)
    assert [(score, box) for score, box, _ in crowd] == [(pytest.approx(0.85), [1.5, 0.0, 11.5, 20.0]),
                                                         (0.5, [4, 0, 14, 20])]
    assert [t for _, _, t in crowd] == [{0: [0, 0, 10, 20], 1: [3, 0, 13, 20]}, {0: [4, 0, 14, 20]}]


def test_link_index_pairs_names_each_persons_boxes():
    first = [[0, 0, 10, 20], [50, 0, 60, 20]]
    second = [[52, 0, 62, 20], [2, 0, 12, 20], [200, 0, 210, 20]]
    assert link_index_pairs(first, second, 0.1) == [(0, 1), (1, 0), (None, 2)]
    assert link_index_pairs(first, second, 0.9) == [(0, None), (1, None), (None, 0), (None, 1), (None, 2)]
    assert link_index_pairs([], second[:1], 0.1) == [(None, 0)] and link_index_pairs(first[:1], [], 0.1) == [(0, None)]


def test_extend_track_follows_a_person_outward_from_the_middle_frames():
    walker = [[10 * f, 0, 10 * f + 20, 40] for f in range(5)]  # 10 px a frame: consecutive boxes overlap by 1/3
    other = [100, 0, 120, 40]
    frames = [[(other, 0.9), (walker[f], 0.8)] for f in range(5)]
    taken = [set() for _ in frames]
    taken[2].add(1)
    assert extend_track({2: walker[2]}, frames, taken) == dict(enumerate(walker))
    assert taken == [{1}] * 5  # the walker's boxes are taken: a second person cannot reuse them
    # a box another person took, or one too far away, ends the track there
    taken = [set(), {1}, set(), set(), set()]
    frames[4] = [(other, 0.9), ([200, 0, 220, 40], 0.8)]
    assert extend_track({2: walker[2], 3: walker[3]}, frames, taken) == {2: walker[2], 3: walker[3]}


def test_person_tracks_serve_the_likelier_person_first():
    """Two people on the middle frames 1 and 2: L's first box scores higher (linking walks it first) but its second
    box is weak, so H is the likelier person; a box in frame 0 overlaps both by 0.2 and goes to H, whatever the
    threshold (a person below the threshold never takes a box from one above it)."""
    l1, h1, b0 = [0, 0, 10, 20], [20, 0, 30, 20], [5, 0, 25, 20]
    frames = [[(b0, 0.9)], [(l1, 0.95), (h1, 0.9)], [(l1, 0.1), (h1, 0.9)], []]
    low = person_tracks(frames, 0.05)
    assert [(round(score, 3), box, track) for score, box, track in low] == [
        (0.9, h1, {0: b0, 1: h1, 2: h1}), (0.525, l1, {1: l1, 2: l1})]
    assert person_tracks(frames, 0.7) == low[:1]
    # the two middle frames alone (activity from the maps): the same persons, no track beyond them
    assert [(round(s_, 3), t) for s_, _, t in person_tracks(frames[1:3], 0.05)] == [(0.9, {0: h1, 1: h1}),
                                                                                  (0.525, {0: l1, 1: l1})]


def test_track_activity_names_the_motion_of_a_long_enough_track():
    times, labels = [0.0, 0.3, 0.6, 0.9], ["standing", "walking_left", "walking_right", "cycling"]
    walking = {f: [100 + 30 * f, 0, 140 + 30 * f, 100] for f in range(4)}  # 1 height/s to the right
    still = {f: [100, 0, 140, 100] for f in range(4)}
    assert track_activity(walking, times, 4, "standing", labels) == "walking_right"
    assert track_activity(still, times, 4, "walking_left", labels) == "standing"
    three = {1: walking[1], 2: walking[2], 3: walking[3]}
    assert track_activity(three, times, 4, "standing", labels) == "walking_right"
    short = {1: walking[1], 2: walking[2]}  # 2 of 4 frames < TRACK_SHARE: the maps' activity stays
    assert len(short) < TRACK_SHARE * 4 and track_activity(short, times, 4, "standing", labels) is None  # the maps'
    assert track_activity(walking, times, 4, "cycling", labels) is None  # a rider moves like a walker
    assert track_activity(walking, [0.5] * 4, 4, "standing", labels) is None  # frames stamped alike
    toward = {f: [100, 100 - 10 * f, 140, 200 + 20 * f] for f in range(4)}  # growing, feet moving down
    assert track_activity(toward, times, 4, "standing", labels + ["walking_toward"]) == "walking_toward"
    assert track_activity(toward, times, 4, "standing", labels) is None  # not a label this head has


@pytest.mark.parametrize("seed", range(3))
def test_decoding_tracks_at_a_threshold_is_decoding_low_and_filtering(seed):
    """Training's reports decode persons at a low threshold and filter at the chosen one; the daemon decodes at the
    chosen one: both must give the same persons with the same activities (a person below the threshold never takes
    a box from a person above it)."""
    torch.manual_seed(seed)
    head = ActionHead(8, ["no_person", "standing", "walking_left", "walking_right"], width=4, spatial="local",
                      persons=True, boxes=2, box_width=16, image_size=56, activity_from="track").eval()
    head.box_head.cls_out.bias.data.zero_()  # scores spread around 0.5: many boxes, many persons to share them
    with torch.no_grad():
        raw = head(Features(torch.zeros(12, 8), torch.randn(12, 8, 4, 4)), 4)
    lb, times = Letterbox(1.0, 0.0, 0.0), [[0.0, 0.3, 0.6, 0.9], [0.1, 0.3, 0.6, 0.8], [0.0, 0.33, 0.63, 0.97]]

    def persons(threshold):
        head.score_threshold = threshold
        return [[p for p in r.persons] for r in head.decode(raw, [lb] * 3, [(56, 56)] * 3, times)]

    low = persons(0.05)
    threshold = sorted(p.score for clip in low for p in clip)[sum(map(len, low)) // 2]  # keeps about half
    high = persons(threshold)
    assert sum(map(len, high)) > 0 and sum(map(len, low)) > sum(map(len, high))
    assert high == [[p for p in clip if p.score >= threshold] for clip in low]


def test_activity_from_track_needs_boxes_and_runs_the_box_head_on_every_frame():
    with pytest.raises(ValueError, match="activity_from must be one of maps, track"):
        ActionHead(8, ["a", "b"], spatial="local", persons=True, boxes=2, activity_from="pose")
    with pytest.raises(ValueError, match="'track' needs boxes"):
        ActionHead(8, ["a", "b"], spatial="local", persons=True, activity_from="track")
    head = ActionHead(8, ["no_person", "standing"], width=4, spatial="local", persons=True, boxes=2, box_width=16,
                      image_size=56, activity_from="track").eval()
    feats = Features(torch.zeros(8, 8), torch.randn(8, 8, 4, 4))
    with torch.no_grad():
        logits, maps, boxes = head(feats, 4)
        assert boxes[0].shape == (8, 1, 8, 8) and torch.equal(boxes[0], head.box_head(feats)[0])
        middle = head(feats, 4, every_frame=False)[2]
        assert middle[0].shape == (4, 1, 8, 8) and torch.equal(middle[0], boxes[0][[1, 2, 5, 6]])
    lb = Letterbox(1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="needs each clip's 4 frame times"):
        head.decode((logits, maps, boxes), [lb, lb], [(56, 56)] * 2)
    with pytest.raises(ValueError, match="needs each clip's 4 frame times"):
        head.decode((logits, maps, boxes), [lb, lb], [(56, 56)] * 2, [[0.0, 0.3, 0.6, 0.9], [0.0, 0.5]])
    assert len(head.decode((logits, maps, boxes), [lb, lb], [(56, 56)] * 2, [[0.0, 0.3, 0.6, 0.9]] * 2)) == 2


@pytest.mark.parametrize("clip_len", [1, 2])
def test_a_track_head_on_clips_too_short_to_track_reads_the_maps(clip_len):
    """A pipeline may send a track head fewer frames than it learnt: with 1 or 2 frames there is no outer frame to
    follow a person to, so the activity maps name every person, frame times or not."""
    torch.manual_seed(0)
    kw = dict(width=4, spatial="local", persons=True, boxes=2, box_width=16, image_size=56)
    track = ActionHead(8, ["no_person", "standing", "walking_left"], activity_from="track", **kw).eval()
    maps = ActionHead(8, ["no_person", "standing", "walking_left"], **kw).eval()
    maps.load_state_dict(track.state_dict())
    track.box_head.cls_out.bias.data.zero_()
    maps.box_head.cls_out.bias.data.zero_()
    feats = Features(torch.zeros(2 * clip_len, 8), torch.randn(2 * clip_len, 8, 4, 4))
    lb = Letterbox(1.0, 0.0, 0.0)
    with torch.no_grad():
        got = track.decode(track(feats, clip_len), [lb] * 2, [(56, 56)] * 2)
        want = maps.decode(maps(feats, clip_len), [lb] * 2, [(56, 56)] * 2)
    assert sum(len(r.persons) for r in got) > 0 and [r.persons for r in got] == [r.persons for r in want]


@pytest.mark.parametrize("seed", range(3))
def test_batched_nms_keeps_groups_apart_and_handles_crowds(seed):
    """Dense overlapping boxes (chains of suppression), many groups: still exactly the greedy loop."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(300, 2, generator=g) * 60
    boxes = torch.cat([xy, xy + 15 + torch.rand(300, 2, generator=g) * 10], 1)
    scores = torch.rand(300, generator=g)
    groups = torch.randint(0, 40, (300,), generator=g) * 7  # large, sparse group ids (image * classes + class)
    assert batched_nms(boxes, scores, groups, 0.3).tolist() == nms_reference(boxes, scores, groups, 0.3)


def test_decode_limits_detections_per_image_and_keeps_images_apart():
    """Peaks in two images at the same cells: each image keeps its own, at most max_detections, best first."""
    head = DetectionHead(8, ["person", "car"], image_size=56, max_detections=3, score_threshold=0.5)
    logits = torch.full((2, 2, 8, 8), -10.0)
    for k, (y, x) in enumerate([(1, 1), (1, 5), (5, 1), (5, 5), (3, 3)]):
        logits[:, 0, y, x] = 1.0 + k  # five separated peaks per image, scores rising with k
    dist = torch.full((2, 4, 8, 8), 2.0)
    out = head.decode((logits, dist), [Letterbox(1, 0, 0)] * 2, [(56, 56)] * 2)
    assert [len(o) for o in out] == [3, 3]
    for dets in out:
        assert [round(d.score, 4) for d in dets] == [round(1 / (1 + math.exp(-v)), 4) for v in (5.0, 4.0, 3.0)]
        assert dets[0].box == pytest.approx((3 * 7 + 3.5 - 2, 3 * 7 + 3.5 - 2, 3 * 7 + 3.5 + 2, 3 * 7 + 3.5 + 2))


def test_a_4x_detection_head_outputs_a_grid_four_times_the_patches():
    for upsample in (2, 4):
        head = DetectionHead(8, ["person", "car"], image_size=224, upsample=upsample)
        with torch.no_grad():
            logits, dist = head(Features(torch.zeros(3, 8), torch.randn(3, 8, 16, 16)))
        assert logits.shape == (3, 2, 16 * upsample, 16 * upsample) and dist.shape == (3, 4, 16 * upsample, 16 * upsample)
        assert (dist >= 0).all()


def test_detection_head_upsample_is_checked():
    with pytest.raises(ValueError, match="upsample must be 2 or 4, got 3"):
        DetectionHead(8, ["person"], upsample=3)


def test_a_detail_head_reads_the_image_and_says_when_it_is_missing():
    head = DetectionHead(8, ["person"], image_size=112, upsample=4, detail=32)
    grid = torch.randn(2, 8, 8, 8)
    pixels = torch.randn(2, 3, 112, 112)
    with torch.no_grad():
        logits, dist = head(Features(torch.zeros(2, 8), grid, pixels))
        assert logits.shape == (2, 1, 32, 32) and dist.shape == (2, 4, 32, 32)
        # the image changes the output; the same grid with other pixels gives other logits
        other, _ = head(Features(torch.zeros(2, 8), grid, pixels.flip(-1)))
        assert not torch.allclose(logits, other)
        # one image of a batch never leaks into another's output
        alone, _ = head(Features(torch.zeros(1, 8), grid[:1], pixels[:1]))
        assert torch.allclose(alone, logits[:1], atol=1e-5)
    with pytest.raises(ValueError, match="detail branch and needs the input image"):
        head(Features(torch.zeros(2, 8), grid))
    plain = DetectionHead(8, ["person"], image_size=112, upsample=4)
    with torch.no_grad():  # a head without the branch ignores the image
        assert torch.equal(plain(Features(torch.zeros(2, 8), grid, pixels))[0],
                           plain(Features(torch.zeros(2, 8), grid))[0])


def test_detection_head_detail_is_checked():
    with pytest.raises(ValueError, match="detail needs upsample 4, got upsample 2"):
        DetectionHead(8, ["person"], upsample=2, detail=32)
    with pytest.raises(ValueError, match="detail must be 0 or a multiple of 32 channels, got 20"):
        DetectionHead(8, ["person"], upsample=4, detail=20)


def test_features_select_keeps_each_images_pixels():
    feats = Features(torch.randn(3, 4), torch.randn(3, 4, 2, 2), torch.randn(3, 3, 28, 28))
    part = feats.select(torch.tensor([2, 0]))
    assert torch.equal(part.pixels, feats.pixels[[2, 0]]) and torch.equal(part.grid, feats.grid[[2, 0]])
    assert Features(torch.randn(3, 4), torch.randn(3, 4, 2, 2)).select(slice(0, 1)).pixels is None


def test_an_action_heads_person_boxes_read_the_middle_frames_images_with_detail():
    head = ActionHead(8, ["no_person", "walking_left"], width=4, spatial="local", persons=True, boxes=4, box_width=16,
                      image_size=112, detail=32).eval()
    assert head.detail == 32 and head.box_head.detail == 32
    grid, pixels = torch.randn(8, 8, 8, 8), torch.randn(8, 3, 112, 112)  # 2 clips of 4 frames, clip-major
    with torch.no_grad():
        logits, maps, (box_logits, _) = head(Features(torch.zeros(8, 8), grid, pixels), 4)
        outer = pixels.clone()
        outer[[0, 3, 4, 7]] = 0  # every clip's first and last frame: the person head reads frames 1 and 2
        same = head(Features(torch.zeros(8, 8), grid, outer), 4)
        assert torch.equal(same[0], logits) and torch.equal(same[1], maps) and torch.equal(same[2][0], box_logits)
        middle = pixels.clone()
        middle[[1, 2, 5, 6]] = 0
        assert not torch.allclose(head(Features(torch.zeros(8, 8), grid, middle), 4)[2][0], box_logits)
    with pytest.raises(ValueError, match="detail branch and needs the input image"):
        head(Features(torch.zeros(8, 8), grid), 4)
    assert ActionHead(8, ["a", "b"], spatial="local", persons=True, boxes=4).detail == 0
    assert ActionHead(8, ["a", "b"]).detail == 0


def test_action_head_detail_needs_boxes():
    with pytest.raises(ValueError, match="detail needs boxes"):
        ActionHead(8, ["a", "b"], spatial="local", persons=True, detail=32)
