"""streams.chunker: frame selection, letterbox maths and pixels, chunk headers from real frames."""

from __future__ import annotations

import itertools
import time

import av
import numpy as np
import pytest

from streams.chunker import PAD_VALUE, Chunker, letterbox, letterbox_geometry, plan_chunk, spread
from streams.source import Frame, FrameSource
from tests.conftest import BIKES
from tests.streams.ingest_helpers import IMAGE_SIZE, stream, tasks


@pytest.mark.parametrize("n, k, expected", [
    (30, 1, (15,)),
    (30, 3, (5, 15, 25)),
    (10, 2, (2, 7)),
    (10, 4, (1, 3, 6, 8)),
    (5, 5, (0, 1, 2, 3, 4)),
    (8, 8, tuple(range(8))),
])
def test_spread_picks_evenly_spaced_frames(n, k, expected):
    assert spread(n, k) == expected


@pytest.mark.parametrize("n, k", [(10, 0), (10, 11)])
def test_spread_rejects_impossible_counts(n, k):
    with pytest.raises(ValueError, match=f"cannot pick {k} of {n} frames"):
        spread(n, k)


def test_plan_chunk_sends_only_the_union_and_indexes_into_it():
    union, per_task = plan_chunk(10, tasks(("det", 2, 100.0), ("act", 4, 100.0), ("one", 1, 100.0)))
    assert union == (1, 2, 3, 5, 6, 7, 8)  # det (2, 7), act (1, 3, 6, 8), one (5,)
    assert [tuple(union[i] for i in idx) for idx in per_task] == [(2, 7), (1, 3, 6, 8), (5,)]


@pytest.mark.parametrize("w, h, size, new_wh, scale, pad", [
    (640, 272, 112, (112, 48), 0.175, (0, 32)),  # wide: pad top and bottom
    (768, 576, 224, (224, 168), 224 / 768, (0, 28)),
    (272, 640, 112, (48, 112), 0.175, (32, 0)),  # tall: pad left and right
    (300, 300, 224, (224, 224), 224 / 300, (0, 0)),  # square: no padding
    (56, 28, 224, (224, 112), 4.0, (0, 56)),  # upscaling works the same way
])
def test_letterbox_geometry(w, h, size, new_wh, scale, pad):
    new_w, new_h, lb = letterbox_geometry(w, h, size)
    assert (new_w, new_h) == new_wh
    assert lb.scale == pytest.approx(scale)
    assert (lb.pad_x, lb.pad_y) == pad
    # the image's corners land on the resized area's corners: model = orig * scale + pad
    assert (0 * lb.scale + lb.pad_x, 0 * lb.scale + lb.pad_y) == pad
    assert w * lb.scale + lb.pad_x == pytest.approx(pad[0] + new_w, abs=0.5)
    assert h * lb.scale + lb.pad_y == pytest.approx(pad[1] + new_h, abs=0.5)


def test_letterbox_pixels_land_where_the_mapping_says():
    image = np.zeros((272, 640, 3), np.uint8)
    image[100:140, 400:480] = (255, 0, 0)  # a red box: x 400..480, y 100..140
    out, lb = letterbox(image, IMAGE_SIZE)
    assert out.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert (out[:32] == PAD_VALUE).all() and (out[-32:] == PAD_VALUE).all()  # padding bands
    x, y = 440 * lb.scale + lb.pad_x, 120 * lb.scale + lb.pad_y  # the box centre in model pixels
    assert tuple(out[int(y), int(x)]) == (255, 0, 0)
    assert tuple(out[int(y), int(360 * lb.scale)]) == (0, 0, 0)  # left of the box: black, not padding
    assert lb.to_original(x, y) == pytest.approx((440, 120))
    zero_pad, _ = letterbox(image, IMAGE_SIZE, pad_value=0)
    assert (zero_pad[:32] == 0).all()


def real_frames(fps: float, n: int) -> list[Frame]:
    return list(itertools.islice(FrameSource(str(BIKES), fps=fps), n))


def test_chunks_from_real_frames():
    cfg = stream("cam", BIKES, fps=10, tasks=tasks(("det", 2, 250.0), ("act", 4, 1000.0)))
    chunker = Chunker(cfg, IMAGE_SIZE)
    frames = real_frames(10, 25)
    chunks = [c for c in map(chunker.add, frames) if c is not None]
    assert len(chunks) == 2  # 25 frames make two chunks of 10; 5 wait for the third
    for seq, chunk in enumerate(chunks):
        h = chunk.header
        first = frames[seq * 10: seq * 10 + 10]
        assert (h.stream, h.seq, h.fps) == ("cam", seq, 10.0)
        assert h.frame_ts == pytest.approx([first[i].ts for i in (1, 2, 3, 6, 7, 8)])
        assert [t.frames for t in h.tasks] == [(1, 4), (0, 2, 3, 5)]
        assert h.ready_wall == first[-1].wall
        assert [t.deadline_wall - h.ready_wall for t in h.tasks] == pytest.approx([0.25, 1.0])
        assert h.orig_size == (640, 272) and h.frame_shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
        assert h.letterbox.scale == pytest.approx(0.175) and (h.letterbox.pad_x, h.letterbox.pad_y) == (0, 32)
        assert len(chunk.frames) == len(h.frame_ts)
        for image, i in zip(chunk.frames, (1, 2, 3, 6, 7, 8)):
            np.testing.assert_array_equal(image, letterbox(first[i].to_rgb(), IMAGE_SIZE)[0])
    # every chunk owns fresh buffers: zero-copy sends must never see them change
    a, b = chunks
    assert not any(np.shares_memory(x, y) for x in a.frames for y in b.frames)


def synthetic(w: int, h: int, ts: float) -> Frame:
    rgb = np.full((h, w, 3), 50, np.uint8)
    return Frame(av.VideoFrame.from_ndarray(rgb, format="rgb24"), ts, time.time())


def test_a_resolution_change_restarts_the_chunk():
    chunker = Chunker(stream("cam", "x.mp4", fps=4, tasks=tasks(("det", 1, 100.0))), IMAGE_SIZE)
    out = [chunker.add(synthetic(64, 48, t / 4)) for t in range(3)]
    out += [chunker.add(synthetic(32, 32, t / 4)) for t in range(3, 7)]  # the camera switched resolution
    built = [c for c in out if c is not None]
    assert len(built) == 1 and out[-1] is built[0]  # the 3 old frames were dropped, 4 new ones make a chunk
    h = built[0].header
    assert h.seq == 0 and h.orig_size == (32, 32) and h.letterbox.scale == pytest.approx(IMAGE_SIZE / 32)
    assert h.frame_ts == (1.25,)  # spread(4, 1) == (2,): the third frame of the new chunk


def test_a_stream_without_tasks_is_refused():
    with pytest.raises(ValueError, match="no tasks"):
        Chunker(stream("cam", "x.mp4", tasks=()), IMAGE_SIZE)
