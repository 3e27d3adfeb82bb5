"""vlora_va.ingest.source: real PyAV decoding of the sample videos, resampling, looping, pacing, outages, bad files."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time

import av
import pytest

from tests.conftest import BIKES, PEDESTRIANS
from tests.ingest.ingest_helpers import make_video
from vlora_va.ingest.source import Frame, FrameSource, SourceError, resample


def digest(rgb) -> str:
    return hashlib.sha1(rgb.tobytes()).hexdigest()


def direct_digests(path, n: int | None = None) -> list[str]:
    """Digests of the first n frames decoded straight with PyAV, for comparison."""
    with av.open(str(path)) as c:
        frames = c.decode(c.streams.video[0])
        return [digest(f.to_ndarray(format="rgb24")) for f in itertools.islice(frames, n)]


# ---------------------------------------------------------------- resample (synthetic timestamps)

def fake(ts_list, outages=None):
    """Frames whose `video` is just the input index, so outputs can name the input they show.
    outages: {input index: outage_s the source reported on it}."""
    outages = outages or {}
    return [Frame(video=i, ts=t, wall=0.0, outage_s=outages.get(i, 0.0)) for i, t in enumerate(ts_list)]


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


@pytest.mark.parametrize("src_ts, outages, fps, expected", [
    # a 3-s stall: the first frame after it says 3.0 s are missing (slots 0.2 .. 3.1), nothing is repeated
    ([0.0, 0.1, 3.2, 3.3], {}, 10, [(0.0, 0, 0.0), (0.1, 1, 0.0), (3.2, 2, 3.0), (3.3, 3, 0.0)]),
    # a reconnect (the source says media is missing) shorter than max_hold_s: no stale frame fills it either
    ([0.0, 0.1, 0.6, 0.7], {2: 0.4}, 10, [(0.0, 0, 0.0), (0.1, 1, 0.0), (0.6, 2, 0.4), (0.7, 3, 0.0)]),
    # 25 -> 10 fps across a stall: the missing time is counted on the output grid (slots 0.2 .. 2.7)
    ([i * 0.04 for i in range(5)] + [2.8, 2.84, 2.88, 2.92], {}, 10,
     [(0.0, 0, 0.0), (0.1, 2, 0.0), (2.8, 5, 2.6), (2.9, 7, 0.0)]),
    # a gap within max_hold_s without an outage report is a slow source: held frames fill it, no outage
    ([0.0, 0.5, 0.6], {}, 10, [(0.0, 0, 0.0), (0.1, 0, 0.0), (0.2, 0, 0.0), (0.3, 0, 0.0), (0.4, 0, 0.0),
                               (0.5, 1, 0.0), (0.6, 2, 0.0)]),
])
def test_resample_reports_outages_instead_of_filling_them(src_ts, outages, fps, expected):
    out = [(f.ts, f.video, f.outage_s) for f in resample(fake(src_ts, outages), fps)]
    assert [i for _, i, _ in out] == [i for _, i, _ in expected]
    assert [t for t, _, _ in out] == pytest.approx([t for t, _, _ in expected], abs=1e-6)
    assert [o for _, _, o in out] == pytest.approx([o for _, _, o in expected], abs=1e-6)


def test_a_stalled_file_reports_the_missing_media_time(tmp_path):
    """A file whose timestamps jump 3 s (a camera that stalled while recording): the first frame after the
    jump carries the missing time; the frames around it are one contiguous grid on either side."""
    path = make_video(tmp_path / "stall.mp4", fps=10, width=160, height=120, seconds=4, gap=(25, 30))
    frames = list(FrameSource(str(path), fps=10))
    assert [f.ts for f in frames] == pytest.approx([k / 10 for k in range(25)] + [5.5 + k / 10 for k in range(15)])
    assert [(f.ts, f.outage_s) for f in frames if f.outage_s] == [(5.5, pytest.approx(3.0))]


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


class RecordingStop(threading.Event):
    """A stop event that records how long the source asked to wait: pacing shows there, not in timings."""

    def __init__(self):
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return super().wait(timeout)


def test_realtime_paces_frames_on_the_wall_clock():
    stop = RecordingStop()
    t0 = time.monotonic()
    frames = list(itertools.islice(FrameSource(str(BIKES), fps=10, realtime=True, stop=stop), 11))
    # Bounds that hold however slow the machine is: frame 10 is due 1.0 s after frame 0, never earlier
    # (a busy machine only makes frames late); the source waits frame by frame, each wait at most one interval.
    assert time.monotonic() - t0 >= 1.0 - 1e-3
    assert [f.ts for f in frames] == pytest.approx([k / 10 for k in range(11)])
    assert stop.waits and all(0 < w <= 0.1 + 1e-6 for w in stop.waits)


def test_not_realtime_never_waits():
    stop = RecordingStop()
    t0 = time.monotonic()
    n = sum(1 for _ in FrameSource(str(BIKES), fps=10, realtime=False, stop=stop))
    assert n == 100 and stop.waits == []
    assert time.monotonic() - t0 < 10.0  # faster than the 10 s of media, however busy the machine is


def test_stop_event_ends_a_looping_source():
    stop = threading.Event()
    source = FrameSource(str(BIKES), fps=10, loop=True, realtime=True, stop=stop)
    got_three, ended = threading.Event(), threading.Event()
    frames = []

    def consume():
        for f in source:
            frames.append(f)
            if len(frames) == 3:
                got_three.set()
        ended.set()

    threading.Thread(target=consume, daemon=True).start()
    assert got_three.wait(30), "no frames from a looping source"
    t0 = time.monotonic()
    stop.set()
    assert ended.wait(10), "the source did not end within 10 s of stop"
    print(f"looping source ended {time.monotonic() - t0:.3f} s after stop, {len(frames)} frames")


# ---------------------------------------------------------------- bad input

def test_missing_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.mp4"
    with pytest.raises(SourceError, match=r"stream cam1: cannot open '.*nope\.mp4': no such file"):
        list(FrameSource(str(missing), fps=10, name="cam1"))


def _packet_end(path, n: int) -> int:
    """The byte offset just after the n-th video packet (in file order): a cut there leaves whole packets."""
    with av.open(str(path)) as c:
        packets = [p for p in c.demux(c.streams.video[0]) if p.size]
        return packets[n - 1].pos + packets[n - 1].size


def corrupt_copy(tmp_path, kind: str):
    """A damaged copy of bikes.mp4 (640x272, 25 fps, 250 frames, index at the front)."""
    data = BIKES.read_bytes()
    path = tmp_path / f"{kind}.mp4"
    mid = len(data) // 2
    noise = bytes((i * 7919 + 13) % 251 for i in range(50_000))
    if kind == "garbage":  # not a video at all
        path.write_bytes(noise)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":  # a third, cut inside a packet
        path.write_bytes(data[: len(data) // 3])
    elif kind == "half":  # the first half, cut inside a packet
        path.write_bytes(data[:mid])
    elif kind == "cut_at_packet":  # the first 60 packets exactly: they all decode cleanly, then the file ends
        path.write_bytes(data[: _packet_end(BIKES, 60)])
    elif kind == "garbage_in_middle":  # 20 kB overwritten with garbage in the middle
        path.write_bytes(data[:mid] + noise[:20_000] + data[mid + 20_000:])
    elif kind == "damaged_frame":  # 64 bytes overwritten inside one frame: the decoder conceals, flags it
        at = int(len(data) * 0.45) + 37
        path.write_bytes(data[:at] + noise[:64] + data[at + 64:])
    else:
        raise ValueError(kind)
    return path


# kind: (what the error says, frames delivered before it at 25 fps)
CORRUPT_MESSAGES = {
    "garbage": (r"stream cam: cannot open '.*garbage\.mp4': Invalid data found when processing input", 0),
    "empty": (r"stream cam: cannot open '.*empty\.mp4': Invalid data found", 0),
    "truncated": (r"stream cam: cannot decode '.*truncated\.mp4' at \d+\.\d+ s after \d+ frames: "
                  r".*corrupt or truncated", None),
    "half": (r"stream cam: cannot decode '.*half\.mp4' at 5\.16 s after 128 frames: Invalid data found when "
             r"processing input \(corrupt or truncated file\?\)", 128),
    "cut_at_packet": (r"stream cam: '.*cut_at_packet\.mp4' ends at 2\.40 s after 60 frames, but its index declares "
                      r"10\.00 s \(truncated file\?\)", 60),
    "garbage_in_middle": (r"stream cam: cannot decode '.*garbage_in_middle\.mp4' at 5\.16 s after 128 frames: "
                          r"Invalid data found", 128),
    "damaged_frame": (r"stream cam: cannot decode '.*damaged_frame\.mp4': frame 111 at 4\.44 s is damaged \(the "
                      r"decoder had to conceal errors in it; corrupt file\?\)", 111),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT_MESSAGES))
def test_corrupt_file_raises_a_clear_error(tmp_path, kind):
    message, expected = CORRUPT_MESSAGES[kind]
    path = corrupt_copy(tmp_path, kind)
    delivered = []
    with pytest.raises(SourceError, match=message):
        for f in FrameSource(str(path), fps=25, name="cam"):
            delivered.append(f)
    if expected is None:
        assert 10 < len(delivered) < 250  # what decoded before the damage was delivered
    else:
        assert len(delivered) == expected
    assert not any(f.outage_s for f in delivered)


@pytest.mark.parametrize("fps, width, height", [(24, 720, 528), (15, 320, 240)])
def test_generated_camera_files_decode_completely(tmp_path, fps, width, height):
    """The videos the RTSP camera tests serve: whole, with no frame flagged damaged and no early end."""
    path = make_video(tmp_path / "cam.mp4", fps=fps, width=width, height=height, seconds=2)
    frames = list(FrameSource(str(path), fps=fps))
    assert len(frames) == 2 * fps and (frames[0].width, frames[0].height) == (width, height)
    assert [f.ts for f in frames] == pytest.approx([k / fps for k in range(2 * fps)], abs=1e-6)


def test_the_sample_videos_have_no_damaged_frame_and_end_where_their_index_says():
    for path, n in ((BIKES, 250), (PEDESTRIANS, 795)):
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            frames = list(c.decode(stream))
            assert len(frames) == n and not any(f.is_corrupt for f in frames), path
            assert frames[-1].time + 1 / float(stream.average_rate) == pytest.approx(
                float(stream.duration * stream.time_base), abs=0.05), path


def test_hardware_decoding_falls_back_to_software_and_says_so(caplog):
    """ingest.hw_decode asks FFmpeg for a device decoder; where there is none (this host), the source logs it
    once and decodes in software, frame for frame the same."""
    import itertools
    import logging
    import os

    from vlora_va.ingest.source import FrameSource, hw_device

    assert hw_device("off") is None and hw_device("vaapi") == "vaapi"
    assert hw_device("auto") is None  # software, GPU or not: NVDEC measured slower per host thread (docs/gpus.md)
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this host has an NVIDIA GPU: hardware decoding may work here")
    with caplog.at_level(logging.WARNING, logger="vlora_va.ingest"):
        hw = [f.to_rgb() for f in itertools.islice(FrameSource(str(BIKES), fps=10, hw_decode="cuda"), 5)]
    sw = [f.to_rgb() for f in itertools.islice(FrameSource(str(BIKES), fps=10), 5)]
    assert "hardware decoding (cuda) unavailable" in caplog.text
    assert all((a == b).all() for a, b in zip(hw, sw)) and len(hw) == 5
