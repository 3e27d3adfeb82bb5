"""streams.source: real PyAV decoding of the sample videos, resampling, looping, pacing, bad files."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time

import av
import pytest

from streams.source import Frame, FrameSource, SourceError, resample
from tests.conftest import BIKES, PEDESTRIANS


def digest(rgb) -> str:
    return hashlib.sha1(rgb.tobytes()).hexdigest()


def direct_digests(path, n: int | None = None) -> list[str]:
    """Digests of the first n frames decoded straight with PyAV, for comparison."""
    with av.open(str(path)) as c:
        frames = c.decode(c.streams.video[0])
        return [digest(f.to_ndarray(format="rgb24")) for f in itertools.islice(frames, n)]


# ---------------------------------------------------------------- resample (synthetic timestamps)

def fake(ts_list):
    """Frames whose `video` is just the input index, so outputs can name the input they show."""
    return [Frame(video=i, ts=t, wall=0.0) for i, t in enumerate(ts_list)]


@pytest.mark.parametrize("src_ts, fps, expected", [
    # same rate: one to one
    ([0.0, 0.1, 0.2, 0.3], 10, [(0.0, 0), (0.1, 1), (0.2, 2), (0.3, 3)]),
    # 25 -> 10: the latest input at or before each slot
    ([i * 0.04 for i in range(8)], 10, [(0.0, 0), (0.1, 2), (0.2, 5)]),
    # 10 -> 30: each input repeated for the slots until the next one
    ([0.0, 0.1, 0.2], 30, [(0.0, 0), (0.033333, 0), (0.066667, 0), (0.1, 1), (0.133333, 1), (0.166667, 1), (0.2, 2)]),
    # a 3-s outage: the grid restarts at the new frame instead of repeating a stale one 30 times
    ([0.0, 0.1, 3.2, 3.3], 10, [(0.0, 0), (0.1, 1), (3.2, 2), (3.3, 3)]),
    # the grid starts at the first frame, whatever its time
    ([5.0, 5.5], 4, [(5.0, 0), (5.25, 0), (5.5, 1)]),
])
def test_resample_sample_and_hold(src_ts, fps, expected):
    out = [(f.ts, f.video) for f in resample(fake(src_ts), fps)]
    assert [i for _, i in out] == [i for _, i in expected]
    assert [t for t, _ in out] == pytest.approx([t for t, _ in expected], abs=1e-6)


# ---------------------------------------------------------------- real files

def test_bikes_25fps_at_10fps_drops_frames_by_timestamp():
    frames = list(FrameSource(str(BIKES), fps=10))
    assert len(frames) == 100  # 10 s at 10 fps
    assert [f.ts for f in frames] == pytest.approx([k / 10 for k in range(100)], abs=1e-6)
    direct = direct_digests(BIKES)
    assert len(direct) == 250
    # slot k at k/10 s shows the 25-fps frame at or before it: floor(k * 2.5)
    for k in (0, 1, 2, 3, 37, 99):
        assert digest(frames[k].to_rgb()) == direct[int(k * 2.5)], k
    assert (frames[0].width, frames[0].height) == (640, 272)


def test_pedestrians_10fps_at_30fps_repeats_frames():
    frames = list(itertools.islice(FrameSource(str(PEDESTRIANS), fps=30), 31))
    assert [f.ts for f in frames] == pytest.approx([k / 30 for k in range(31)], abs=1e-6)
    direct = direct_digests(PEDESTRIANS, 11)
    assert [digest(f.to_rgb()) for f in frames] == [direct[k // 3] for k in range(31)]


def test_loop_keeps_timestamps_increasing():
    frames = list(itertools.islice(FrameSource(str(BIKES), fps=25, loop=True), 260))
    ts = [f.ts for f in frames]
    assert all(b > a for a, b in zip(ts, ts[1:]))
    assert ts[249] == pytest.approx(9.96) and ts[250] == pytest.approx(10.0)  # no gap, no overlap
    assert digest(frames[250].to_rgb()) == digest(frames[0].to_rgb())  # the second pass starts over
    assert digest(frames[251].to_rgb()) != digest(frames[250].to_rgb())


def test_without_loop_the_file_ends():
    assert len(list(FrameSource(str(BIKES), fps=25))) == 250


def test_realtime_paces_frames_on_the_wall_clock():
    t0 = time.monotonic()
    frames = list(itertools.islice(FrameSource(str(BIKES), fps=10, realtime=True), 11))
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.95  # 10 frame intervals of 0.1 s
    walls = [f.wall - frames[0].wall for f in frames]
    assert walls == pytest.approx([f.ts for f in frames], abs=0.25)


def test_not_realtime_runs_faster_than_the_media():
    t0 = time.monotonic()
    n = sum(1 for _ in FrameSource(str(BIKES), fps=10, realtime=False))
    assert n == 100 and time.monotonic() - t0 < 5.0  # 10 s of media


def test_stop_event_ends_a_looping_source():
    stop = threading.Event()
    source = FrameSource(str(BIKES), fps=10, loop=True, realtime=True, stop=stop)
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    n = sum(1 for _ in source)
    assert time.monotonic() - t0 < 2.0 and 2 <= n <= 10


# ---------------------------------------------------------------- bad input

def test_missing_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.mp4"
    with pytest.raises(SourceError, match=r"stream cam1: cannot open '.*nope\.mp4': no such file"):
        list(FrameSource(str(missing), fps=10, name="cam1"))


def corrupt_copy(tmp_path, kind: str):
    data = BIKES.read_bytes()
    path = tmp_path / f"{kind}.mp4"
    if kind == "garbage":
        path.write_bytes(bytes((i * 7919 + 13) % 251 for i in range(50_000)))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 3])
    return path


CORRUPT_MESSAGES = {
    "garbage": r"stream cam: cannot open '.*garbage\.mp4': Invalid data found when processing input",
    "empty": r"stream cam: cannot open '.*empty\.mp4': Invalid data found",
    "truncated": r"stream cam: cannot decode '.*truncated\.mp4' at \d+\.\d+ s after \d+ frames: .*corrupt or truncated",
}


@pytest.mark.parametrize("kind", sorted(CORRUPT_MESSAGES))
def test_corrupt_file_raises_a_clear_error(tmp_path, kind):
    message = CORRUPT_MESSAGES[kind]
    path = corrupt_copy(tmp_path, kind)
    delivered = []
    with pytest.raises(SourceError, match=message):
        for f in FrameSource(str(path), fps=25, name="cam"):
            delivered.append(f)
    if kind == "truncated":
        assert 10 < len(delivered) < 250  # what decoded before the damage was delivered
