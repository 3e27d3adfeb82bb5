"""vlora_va.ingest.chunker: frame selection, letterbox pixels, chunk headers from real frames (the letterbox maths
itself is contracts.geometry, tested in tests/contracts/test_geometry.py)."""

from __future__ import annotations

import itertools
import time

import av
import numpy as np
import pytest

from tests.conftest import BIKES
from tests.ingest.ingest_helpers import IMAGE_SIZE, stream, tasks
from vlora_va.contracts.config import TaskConfig, parse_config
from vlora_va.contracts.wire import TaskRequest
from vlora_va.ingest.chunker import PAD_VALUE, Chunker, letterbox, plan_chunk, spread
from vlora_va.ingest.source import Frame, FrameSource


@pytest.mark.parametrize("n, k, expected", [
    (30, 1, (15,)),  # one frame: the middle one
    (30, 3, (0, 14, 29)),  # several: from the first to the last (as the adapters were trained)
    (10, 2, (0, 9)),
    (10, 4, (0, 3, 6, 9)),
    (10, 8, (0, 1, 3, 4, 5, 6, 8, 9)),
    (5, 5, (0, 1, 2, 3, 4)),
    (8, 8, tuple(range(8))),
])
def test_spread_picks_evenly_spaced_frames(n, k, expected):
    assert spread(n, k) == expected


@pytest.mark.parametrize("n, k", [(10, 0), (10, 11)])
def test_spread_rejects_impossible_counts(n, k):
    with pytest.raises(ValueError, match=f"cannot pick {k} of {n} frames"):
        spread(n, k)


def test_plan_chunk_shares_frames_sends_only_the_union_and_indexes_into_it():
    """The task with the most frames spreads them over the chunk; tasks with fewer pick theirs among those
    (spread over them), so frames are shared wherever the counts allow."""
    union, per_task = plan_chunk(10, tasks(("det", 2, 100.0), ("act", 4, 100.0), ("one", 1, 100.0)))
    assert union == (0, 3, 6, 9)  # act spread(10, 4); det = act's spread(4, 2) -> (0, 9); one -> spread(4, 1)
    assert [tuple(union[i] for i in idx) for idx in per_task] == [(0, 9), (0, 3, 6, 9), (6,)]
    union, per_task = plan_chunk(10, tasks(("clip", 8, 100.0), ("det", 1, 100.0)))
    assert union == spread(10, 8) and [tuple(union[i] for i in idx) for idx in per_task][1] == (5,)
    union, per_task = plan_chunk(3, tasks(("a", 2, 100.0), ("b", 3, 100.0)))  # the larger one covers all
    assert union == (0, 1, 2) and [tuple(union[i] for i in idx) for idx in per_task] == [(0, 2), (0, 1, 2)]


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
    cfg = stream("cam", BIKES, fps=10,
                 tasks=(TaskConfig("det", "detect", 2, 250.0, priority=7), TaskConfig("act", "actions", 4, 1000.0)))
    chunker = Chunker(cfg, IMAGE_SIZE)
    frames = real_frames(10, 25)
    chunks = [c for c in map(chunker.add, frames) if c is not None]
    assert len(chunks) == 2  # 25 frames make two chunks of 10; 5 wait for the third
    for seq, chunk in enumerate(chunks):
        h = chunk.header
        first = frames[seq * 10: seq * 10 + 10]
        assert (h.stream, h.seq, h.fps) == ("cam", seq, 10.0)
        assert h.frame_ts == pytest.approx([first[i].ts for i in (0, 3, 6, 9)])  # det shares act's frames
        assert [t.frames for t in h.tasks] == [(0, 3), (0, 1, 2, 3)]
        assert h.ready_wall == first[-1].wall
        # budgets travel relative to ready_wall, with the task's priority, straight from the config
        live = not chunker.best_effort
        assert h.tasks == (TaskRequest("det", "detect", (0, 3), 250.0, 7, best_effort=not live),
                           TaskRequest("act", "actions", (0, 1, 2, 3), 1000.0, 0, best_effort=not live))
        assert h.sent_wall == 0.0 and h.dropped_before == 0  # both set by the sender, not the chunker
        assert h.orig_size == (640, 272) and h.frame_shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
        assert h.letterbox.scale == pytest.approx(0.175) and (h.letterbox.pad_x, h.letterbox.pad_y) == (0, 32)
        assert len(chunk.frames) == len(h.frame_ts)
        for image, i in zip(chunk.frames, (0, 3, 6, 9)):
            np.testing.assert_array_equal(image, letterbox(first[i].to_rgb(), IMAGE_SIZE)[0])
    # every chunk owns fresh buffers: zero-copy sends must never see them change
    a, b = chunks
    assert not any(np.shares_memory(x, y) for x in a.frames for y in b.frames)


def synthetic(w: int, h: int, ts: float, outage_s: float = 0.0) -> Frame:
    rgb = np.full((h, w, 3), 50, np.uint8)
    return Frame(av.VideoFrame.from_ndarray(rgb, format="rgb24"), ts, time.time(), outage_s=outage_s)


def test_a_resolution_change_restarts_the_chunk():
    chunker = Chunker(stream("cam", "x.mp4", fps=4, tasks=tasks(("det", 1, 100.0))), IMAGE_SIZE)
    out = [chunker.add(synthetic(64, 48, t / 4)) for t in range(3)]
    out += [chunker.add(synthetic(32, 32, t / 4)) for t in range(3, 7)]  # the camera switched resolution
    built = [c for c in out if c is not None]
    assert len(built) == 1 and out[-1] is built[0]  # the 3 old frames were dropped, 4 new ones make a chunk
    h = built[0].header
    assert h.seq == 0 and h.orig_size == (32, 32) and h.letterbox.scale == pytest.approx(IMAGE_SIZE / 32)
    assert h.frame_ts == (1.25,)  # spread(4, 1) == (2,): the third frame of the new chunk


@pytest.mark.parametrize("before, outage_s, expected", [
    # the outage falls between chunks: the next chunk reports exactly the missing time
    (4, 3.0, 3.0),
    # it falls inside a chunk: the 2 frames from before it (0.5 s at 4 fps) are dropped and counted with it
    (6, 3.0, 3.5),
])
def test_an_outage_starts_a_new_chunk_that_reports_the_missing_media_time(before, outage_s, expected):
    """outage_s of a chunk = the media time between the previous chunk's last frame and its first, less one
    frame interval: what no chunk covers. A chunk never spans an outage."""
    chunker = Chunker(stream("cam", "x.mp4", fps=4, tasks=tasks(("all", 4, 100.0))), IMAGE_SIZE)
    ts = [t / 4 for t in range(before)]
    resume = ts[-1] + 0.25 + outage_s
    frames = [synthetic(64, 48, t) for t in ts] + [synthetic(64, 48, resume, outage_s)]
    frames += [synthetic(64, 48, resume + k / 4) for k in range(1, 8)]
    built = [c for c in map(chunker.add, frames) if c is not None]
    assert [c.header.seq for c in built] == [0, 1, 2]  # sequence numbers stay contiguous: nothing was dropped
    assert [c.header.outage_s for c in built] == [0.0, expected, 0.0]
    prev, after = built[0].header, built[1].header
    assert after.frame_ts[0] == resume  # the chunk after the outage starts at the first frame after it
    assert after.frame_ts[0] - prev.frame_ts[-1] - 0.25 == pytest.approx(expected)


def test_task_budgets_and_priorities_come_from_the_parsed_config():
    """Priority: the task's own, else its stream's; deadline_ms: the task's budget, relative (never a wall time)."""
    cfg = parse_config(
        "adapters: {detect: a/detect, actions: a/actions}\n"
        "streams:\n"
        "  - id: cam\n    source: x.mp4\n    fps: 4\n    priority: 5\n    tasks:\n"
        "      - {name: det, adapter: detect, frames_per_chunk: 1, deadline_ms: 750}\n"
        "      - {name: act, adapter: actions, frames_per_chunk: 2, deadline_ms: 2500, priority: -3}\n")
    chunker = Chunker(cfg.stream("cam"), IMAGE_SIZE)
    built = [chunker.add(synthetic(64, 48, t / 4)) for t in range(4)]
    assert built[:3] == [None, None, None]
    h = built[3].header
    # act: spread(4, 2) == (0, 3); det picks among them: spread(2, 1) == (1,) -> frame 3; sent: frames 0, 3
    assert h.frame_ts == (0.0, 0.75)
    # a file paced like a camera (realtime: true, the default) is live: not best-effort
    assert h.tasks == (TaskRequest("det", "detect", (1,), 750.0, 5), TaskRequest("act", "actions", (0, 1), 2500.0, -3))
    assert h.ready_wall == pytest.approx(time.time(), abs=5.0)


def test_a_stream_without_tasks_is_refused():
    with pytest.raises(ValueError, match="no tasks"):
        Chunker(stream("cam", "x.mp4", tasks=()), IMAGE_SIZE)


def test_a_file_read_as_fast_as_possible_is_best_effort_a_camera_never():
    """Deadlines belong to live sources: a file with realtime: false is served when live work leaves room
    (and its reading waits), never shed; a paced file or an RTSP camera is live."""
    from dataclasses import replace

    base = stream("cam", BIKES, fps=10, tasks=(TaskConfig("det", "detect", 1, 500.0),))
    assert Chunker(replace(base, realtime=False), IMAGE_SIZE).best_effort is True
    assert Chunker(replace(base, realtime=True), IMAGE_SIZE).best_effort is False
    assert Chunker(replace(base, realtime=False, source="rtsp://127.0.0.1:8554/x"), IMAGE_SIZE).best_effort is False


# ---------------------------------------------------------------- tracked tasks and snapshots (issue 29)
def test_stride_runs_evenly_across_chunk_boundaries():
    from vlora_va.ingest.chunker import stride
    assert stride(10, 5) == (0, 2, 4, 6, 8)  # the next chunk starts 2 frames after 8: even across the boundary
    assert stride(10, 2) == (0, 5) and stride(10, 1) == (0,) and stride(10, 10) == tuple(range(10))
    with pytest.raises(ValueError):
        stride(10, 11)


def test_a_tracked_task_keeps_its_stride_and_the_others_share_frames_around_it():
    both = (TaskConfig("det", "detect", 5, 2000.0, track=True), TaskConfig("act", "actions", 8, 3000.0))
    send, picks = plan_chunk(10, both)
    assert [send[i] for i in picks[0]] == [0, 2, 4, 6, 8]
    assert [send[i] for i in picks[1]] == list(spread(10, 8))  # untouched by the tracked task
    # untracked, the same task would have been spread over the chunk instead
    send, picks = plan_chunk(10, (TaskConfig("det", "detect", 5, 2000.0),))
    assert [send[i] for i in picks[0]] == list(spread(10, 5)) == [0, 2, 4, 7, 9]


def test_a_stream_with_snapshots_sends_a_jpeg_of_each_tracked_frame_at_source_resolution():
    import cv2

    from vlora_va.contracts.scene import SnapshotConfig
    cfg = stream("cam", BIKES, fps=10, snapshots=True,
                 tasks=(TaskConfig("det", "detect", 2, 2000.0, track=True), TaskConfig("act", "actions", 4, 3000.0)))
    frames = real_frames(10, 10)
    chunk = next(c for c in map(Chunker(cfg, IMAGE_SIZE, snapshots=SnapshotConfig(max_width=320)).add, frames) if c)
    h = chunk.header
    assert [h.frame_ts[i] for i in h.snapshots] == pytest.approx([frames[0].ts, frames[5].ts])
    assert len(chunk.jpegs) == 2
    image = cv2.imdecode(np.frombuffer(chunk.jpegs[1], np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (136, 320, 3)  # 640 x 272 scaled to max_width 320
    want = cv2.resize(frames[5].to_rgb(), (320, 136), interpolation=cv2.INTER_AREA)[:, :, ::-1]
    assert np.abs(image.astype(int) - want).mean() < 4  # the frame itself, JPEG-compressed
    # without snapshots: no JPEG
    plain = next(c for c in map(Chunker(stream("cam", BIKES, fps=10, tasks=cfg.tasks), IMAGE_SIZE).add, frames) if c)
    assert plain.header.snapshots == () and plain.jpegs == []


def test_a_live_streams_lines_and_zones_are_checked_at_its_first_frame(caplog):
    from vlora_va.contracts.scene import LineConfig, ZoneConfig
    cfg = stream("cam", BIKES, fps=10, tasks=(TaskConfig("det", "detect", 2, 2000.0, track=True),),
                 lines=(LineConfig("in_frame", ((10.0, 10.0), (600.0, 200.0))),
                        LineConfig("off", ((10.0, 10.0), (700.0, 200.0)))),
                 zones=(ZoneConfig("low", ((0.0, 200.0), (100.0, 200.0), (100.0, 300.0))),))  # 300 > 272
    chunker = Chunker(cfg, IMAGE_SIZE)
    with caplog.at_level("ERROR"):
        for frame in real_frames(10, 3):  # 640 x 272
            chunker.add(frame)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["stream cam: lines 'off': point(s) [700, 200] outside the 640x272 frame: it can never be "
                    "crossed or entered there",
                    "stream cam: zones 'low': point(s) [100, 300] outside the 640x272 frame: it can never "
                    "be crossed or entered there"]  # once, at the first frame
