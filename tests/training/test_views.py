"""Other cameras from our footage (training/views.py): boxes follow the geometry exactly, the photometry moves
nothing and is deterministic per seed, re-rendered videos keep every frame at its time, and the human-checked set
carried through a view loads and matches View.apply."""

import json
from functools import lru_cache
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from vlora_va.training.evaluate import HUMAN_SET, load_human_set
from vlora_va.training.views import (
    EVAL_VIEWS,
    MIN_VISIBLE,
    View,
    carry_human_set,
    even_size,
    fit_views,
    pad_even,
    random_view,
    write_view_video,
)

ROOT = Path(__file__).resolve().parents[2]
PEDESTRIANS = ROOT / "sample_videos" / "pedestrians.mp4"
W, H = 240, 180
RECTS = [(40, 30, 90, 110), (150, 60, 200, 150), (100, 20, 130, 45), (10, 120, 60, 170)]  # x1, y1, x2, y2 in px

cv2.setNumThreads(1)

GEOMETRIC = {
    "crop": View(crop=(0.1, 0.05, 0.8, 0.85)),
    "crop-cuts": View(crop=(0.3, 0.0, 0.7, 1.0)),  # cuts RECTS[0] (x 40-90 -> 72-90: 36% left) and drops RECTS[3]
    "shrink": View(scale=0.5),
    "enlarge": View(scale=1.7),
    "mirror": View(mirror=True),
    "perspective": View(perspective=(0.1, 0.05, 0.02, 0.12, 0.08, 0.0, 0.0, 0.1)),
    "everything": View(crop=(0.05, 0.1, 0.9, 0.85), scale=1.3, mirror=True,
                       perspective=(0.03, 0.08, 0.06, 0.0, 0.0, 0.05, 0.07, 0.02)),
    **{name: v.geometry() for name, v in {**EVAL_VIEWS, **fit_views()}.items()},
}
PHOTOMETRIC = {
    "gain": View(gain=0.6),
    "gamma": View(gamma=1.5),
    "noise": View(noise_sigma=5.0),
    "blur": View(blur_sigma=1.2),
    "jpeg": View(jpeg_quality=35),
    "sensor": View(sensor_scale=0.5),
    **{name: v for name, v in EVAL_VIEWS.items() if v.geometry() == View()},  # the held-out cameras without geometry
}


def rect_image(rect) -> np.ndarray:
    img = np.zeros((H, W, 3), np.uint8)
    x1, y1, x2, y2 = rect
    img[y1:y2, x1:x2] = 255  # pixels x1 .. x2 - 1: exactly the box [x1, x2) in continuous coordinates
    return img


def pixel_box(img: np.ndarray):
    """Bounding box (continuous coordinates) of the pixels at least half covered by the white rectangle."""
    ys, xs = np.nonzero(img[..., 0] >= 128)
    return None if not len(xs) else [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]


@pytest.mark.parametrize("name", list(GEOMETRIC))
def test_geometry_maps_boxes_as_it_moves_the_pixels(name):
    view = GEOMETRIC[name]
    for i, rect in enumerate(RECTS):
        img, boxes, keep = view.apply(rect_image(rect), [rect])
        assert img.shape == (*view.out_size(W, H)[::-1], 3)
        ref = pixel_box(img)
        (mapped,), (visible,) = view.map_boxes([rect], (W, H))
        if ref is None:  # the rectangle left the frame: nothing visible, no box
            assert visible == 0 and len(keep) == 0, (name, i)
            continue
        # The clipped mapped box is the bounding box of the rectangle's pixels in the new frame, whether kept or not.
        assert np.abs(mapped - ref).max() <= 2, (name, i, mapped, ref)
        assert list(keep) == ([0] if visible >= MIN_VISIBLE else []), (name, i, visible)
        if len(keep):
            assert np.array_equal(boxes[0], mapped)


@pytest.mark.parametrize("name", list(GEOMETRIC))
def test_geometry_is_right_to_a_fraction_of_a_pixel(name):
    """The whole-pixel bounding boxes above cannot see a half-pixel slip (cv2 puts pixel centres at integers, the
    boxes at +0.5): the brightness centroid of a small square, wherever it lands, can."""
    view = GEOMETRIC[name]
    m = view.matrix(W, H)
    checked = 0
    for cx in range(30, W - 30, 36):
        for cy in range(30, H - 30, 30):
            square = (cx - 3, cy - 3, cx + 3, cy + 3)
            (box,), (visible,) = view.map_boxes([square], (W, H))
            ow, oh = view.out_size(W, H)
            if visible < 1 or box[0] < 3 or box[1] < 3 or box[2] > ow - 3 or box[3] > oh - 3:
                continue  # not wholly inside the new frame, with a margin for the interpolation
            img = view.apply(rect_image(square))[0][..., 0].astype(float)
            ys, xs = np.mgrid[:oh, :ow] + 0.5  # pixel centres in continuous coordinates
            centroid = np.array([(img * xs).sum(), (img * ys).sum()]) / img.sum()
            x, y, w = m @ [cx, cy, 1]
            assert np.abs(centroid - [x / w, y / w]).max() < 0.15, (name, cx, cy, centroid, (x / w, y / w))
            checked += 1
    assert checked >= 6


def test_a_cut_box_keeps_its_visible_share_and_slivers_are_dropped_with_their_classes():
    view = GEOMETRIC["crop-cuts"]  # x0 = 72 px: RECTS[0] keeps 18 of 50 px (36%), RECTS[3] is gone
    boxes = [RECTS[0], RECTS[3], RECTS[1], [70, 30, 110, 110]]  # the last keeps 38 of 40 px
    _, visible = view.map_boxes(boxes, (W, H))
    assert visible == pytest.approx([18 / 50, 0, 1, 38 / 40])
    sliver = View(crop=(0.33, 0.0, 0.67, 1.0))  # x0 = 79 px: RECTS[0] keeps 11 of 50 px (22%): dropped
    classes = np.array(["person", "car", "truck", "bicycle"])
    _, kept, keep = sliver.apply(rect_image(RECTS[0]), boxes)
    assert list(classes[keep]) == ["truck", "bicycle"]
    assert np.allclose(kept, [[150 - 79, 60, 200 - 79, 150], [0, 30, 110 - 79, 110]])
    assert View().map_boxes([[5, 5, 5, 20]], (W, H))[1] == [0]  # degenerate in, nothing out


@pytest.mark.parametrize("name", list(PHOTOMETRIC))
def test_photometry_moves_no_box_changes_the_picture_and_is_deterministic_per_seed(name):
    view = PHOTOMETRIC[name]
    rgb = _real_frame()
    boxes = [[100, 100, 160, 260], [700, 500, 768, 576], [0, 0, 30, 40]]
    a, boxes_a, keep = view.apply(rgb, boxes, seed=3)
    assert a.shape == rgb.shape and a.dtype == np.uint8
    assert np.array_equal(boxes_a, np.asarray(boxes, float)) and list(keep) == [0, 1, 2]
    assert np.abs(a.astype(int) - rgb).mean() > 0.5  # the part does something
    b, _, _ = view.apply(rgb, boxes, seed=3)
    assert np.array_equal(a, b)
    c, _, _ = view.apply(rgb, boxes, seed=4)
    assert np.array_equal(a, c) != (view.noise_sigma > 0)  # only the noise depends on the seed


def test_low_light_is_darker_and_the_small_sensor_loses_detail():
    rgb = _real_frame()
    dark = EVAL_VIEWS["low-light"].apply(rgb, seed=0)[0]
    assert dark.mean() < 0.5 * rgb.mean()
    small = View(sensor_scale=0.5).apply(rgb)[0]
    sharp = lambda img: cv2.Laplacian(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var()  # noqa: E731
    assert sharp(small) < 0.6 * sharp(rgb)


def test_random_views_are_valid_mild_varied_and_reproducible():
    views = [random_view(np.random.default_rng([7, i])) for i in range(300)]
    assert views[:20] == [random_view(np.random.default_rng([7, i])) for i in range(20)]
    assert 0.35 < np.mean([v.mirror for v in views]) < 0.65
    assert any(v.crop != (0, 0, 1, 1) for v in views) and any(any(v.perspective) for v in views)
    assert any(v.jpeg_quality for v in views) and any(v.sensor_scale < 1 for v in views)
    assert any(v.noise_sigma > 0 for v in views) and any(v.blur_sigma > 0 for v in views)
    assert min(v.gain for v in views) < 0.55 and max(v.gain for v in views) > 1.2  # dim and bright cameras
    for v in views:  # mild: a person stays a person
        assert min(v.crop[2:]) >= 0.6 and 0.5 <= v.scale <= 1.25 and max(v.perspective) <= 0.08
        assert 0.45 <= v.gain <= 1.4 and 0.7 <= v.gamma <= 1.6 and v.noise_sigma <= 10 and v.blur_sigma <= 1.5
        assert v.jpeg_quality is None or 30 <= v.jpeg_quality <= 90
    rgb = _real_frame()
    boxes = [[171, 369, 227, 514], [643, 305, 672, 414]]  # two people of the human-checked set at 55 s
    for i, v in enumerate(views[:10]):
        out, mapped, keep = v.apply(rgb, boxes, seed=i)
        assert out.shape[:2] == v.out_size(768, 576)[::-1] and len(mapped) == len(keep)


def test_fit_views_are_other_cameras_than_the_held_out_ones():
    fit = fit_views()
    assert 2 <= len(fit) <= 3 and not set(fit) & set(EVAL_VIEWS)
    assert not set(fit.values()) & set(EVAL_VIEWS.values())
    for name, v in fit.items():  # not even one held-out camera's geometry or photometry alone
        for e in EVAL_VIEWS.values():
            assert v.geometry() != e.geometry() or v.geometry() == View(), name


@pytest.mark.parametrize("kwargs, field", [
    ({"crop": (0.5, 0.0, 0.6, 1.0)}, "crop"),
    ({"crop": (-0.1, 0.0, 0.5, 0.5)}, "crop"),
    ({"crop": (0.0, 0.0, 0.0, 1.0)}, "crop"),
    ({"crop": (0.0, 0.0, 1.0)}, "crop"),
    ({"jpeg_quality": 0}, "jpeg_quality"),
    ({"jpeg_quality": 101}, "jpeg_quality"),
    ({"jpeg_quality": 50.5}, "jpeg_quality"),
    ({"perspective": (0.3,) + (0.0,) * 7}, "perspective"),
    ({"scale": 0.0}, "scale"),
    ({"gain": float("nan")}, "gain"),
    ({"sensor_scale": 1.5}, "sensor_scale"),
    ({"noise_sigma": -1}, "noise_sigma"),
])
def test_bad_views_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"View\.{field}:"):
        View(**kwargs)


def test_even_sizes_for_h264():
    assert even_size(552, 461) == (552, 462) and even_size(768, 576) == (768, 576)
    img = np.arange(5 * 3 * 3, dtype=np.uint8).reshape(5, 3, 3)
    padded = pad_even(img)
    assert padded.shape == (6, 4, 3) and np.array_equal(padded[:5, :3], img)
    assert np.array_equal(padded[5, :3], img[4]) and np.array_equal(padded[:5, 3], img[:, 2])


# --- whole videos and the human-checked set --------------------------------------------------------------------------

@lru_cache(maxsize=4)
def _real_frame(t: float = 55.0) -> np.ndarray:
    """The frame of pedestrians.mp4 at t (read-only: every test shares it)."""
    with av.open(str(PEDESTRIANS)) as c:
        s = c.streams.video[0]
        c.seek(int((t - 1) / s.time_base), stream=s)
        for f in c.decode(s):
            if f.pts * s.time_base >= t - 1e-6:
                rgb = f.to_ndarray(format="rgb24")
                rgb.flags.writeable = False
                return rgb
    raise AssertionError(f"no frame at {t} s")


def _decode(path) -> tuple[list[float], list[np.ndarray], object]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        frames = list(c.decode(s))
        return [float(f.pts * s.time_base) for f in frames], [f.to_ndarray(format="rgb24") for f in frames], s.average_rate


@pytest.fixture(scope="module")
def piece(tmp_path_factory) -> Path:
    """The first 2 s of pedestrians.mp4, cut by stream copy in decode order (no re-encode: fast). Its last two
    frames are 2.0 and 2.3 s, the B-frames between them fall after the cut: an irregular gap that a writer
    re-timing at a constant frame rate would get wrong."""
    dst = tmp_path_factory.mktemp("views") / "piece.mp4"
    with av.open(str(PEDESTRIANS)) as inp, av.open(str(dst), "w") as out:
        ist = inp.streams.video[0]
        ost = out.add_stream_from_template(ist)
        for p in inp.demux(ist):
            if p.dts is None:
                continue
            if p.dts * ist.time_base >= 2.0:
                break
            p.stream = ost
            out.mux(p)
    return dst


@pytest.mark.parametrize("name", ["reframed", "small-sensor"])
def test_a_view_video_keeps_every_frame_at_its_time(piece, tmp_path, name):
    view = EVAL_VIEWS[name]
    dst = tmp_path / f"piece-{name}.mp4"
    report = write_view_video(piece, dst, view, seed=5)
    src_t, src, src_rate = _decode(piece)
    out_t, out, out_rate = _decode(dst)
    assert len(src) >= 20 and report["frames"] == len(out) == len(src)
    assert out_t == pytest.approx(src_t, abs=1e-6) and src_t[-2:] == pytest.approx([2.0, 2.3])
    assert out_rate == src_rate
    assert out[0].shape == (*report["size"][::-1], 3) and report["size"] == even_size(*view.out_size(768, 576))
    # Frame k of the output is the view of frame k of the source (noise seeded 5 + k), up to H.264's loss: nearer
    # to it than to its neighbours' views.
    refs = [pad_even(view.apply(f, seed=5 + k)[0]).astype(np.float32) for k, f in enumerate(src)]
    for k, o in enumerate(out):
        err = [np.abs(o.astype(np.float32) - refs[j]).mean() for j in range(max(0, k - 2), min(len(refs), k + 3))]
        own = err[k - max(0, k - 2)]
        assert own == min(err) and own < 0.8 * sorted(err)[1], (k, err)


def test_the_carried_human_set_loads_and_its_boxes_are_view_apply_of_the_originals(tmp_path):
    view = EVAL_VIEWS["reframed"]
    out = tmp_path / "human-reframed.json"
    counts = carry_human_set(HUMAN_SET, view, "pedestrians", "pedestrians-reframed", out,
                             source="build/views/pedestrians-reframed.mp4")
    src, new = json.loads(HUMAN_SET.read_text()), json.loads(out.read_text())
    assert set(new) == set(src) and new["categories"] == src["categories"] and new["activity_clips"] == []
    assert out.read_text() == json.dumps(new, separators=(",", ":")) + "\n"  # the source file's own layout
    src_images = {i["id"]: i for i in src["images"] if i["video"] == "pedestrians"}
    assert counts["images"] == len(new["images"]) == len(src_images) == 49
    for img in new["images"]:
        assert img["video"] == "pedestrians-reframed" and img["t"] == src_images[img["id"]]["t"]
        assert set(img) == set(src_images[img["id"]]) and (img["width"], img["height"]) == (660, 472)
    hs = load_human_set(out)
    assert len(hs.boxes) == 49 and all(v == "pedestrians-reframed" for v, _ in hs.times.values())
    # Every box is View.apply's box for the same original (kept ones) and keeps its flags.
    src_anns = {a["id"]: a for a in src["annotations"]}
    frame = _real_frame(60.0)
    seen_kept = 0
    for a in new["annotations"]:
        o = src_anns[a["id"]]
        assert src_images[o["image_id"]]["video"] == "pedestrians" and a["category_id"] == o["category_id"]
        x, y, w, h = o["bbox"]
        _, boxes, keep = view.apply(frame, [[x, y, x + w, y + h]])
        nx, ny, nw, nh = a["bbox"]
        if len(keep):
            assert [nx, ny, nx + nw, ny + nh] == pytest.approx(boxes[0], abs=0.011)
            assert (a["ignore"], a["iscrowd"]) == (o["ignore"], o["iscrowd"])
            seen_kept += 1
        else:  # a sliver at the new frame's edge: don't-care, not a person a detector must find
            assert a["ignore"] == a["iscrowd"] == 1
    assert seen_kept > 400 and counts["boxes"] == len(new["annotations"])
    assert counts["boxes"] + counts["omitted"] == sum(src_images.get(a["image_id"]) is not None
                                                      for a in src["annotations"])
    # The loaded set holds the same boxes for the frame at 60 s.
    key = "pedestrians-reframed@60.000"
    loaded = sorted(b["box"] for b in hs.boxes[key])
    img_id = next(i["id"] for i in new["images"] if i["t"] == 60.0)
    expect = sorted([a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                    for a in new["annotations"] if a["image_id"] == img_id)
    assert np.allclose(loaded, expect) and len(loaded) > 3


def test_carrying_a_video_the_set_lacks_fails():
    with pytest.raises(ValueError, match="no images of video 'nowhere'"):
        carry_human_set(HUMAN_SET, EVAL_VIEWS["low-light"], "nowhere", "x", Path("/nonexistent/x.json"))
