"""RTSP ingest against a real local RTSP server (GStreamer, see tests/rtsp_server.py).

- A camera killed mid-stream is reconnected with backoff, delivers again within seconds of its return, and the
  first chunk after the outage reports the missing media time; the worker's other stream never stops.
- A camera that never comes back is retried forever at the capped interval, without fd or memory growth.
- Cameras at frame rates and sizes the project was not tuned on are resampled and letterboxed right.

Every wait is on a condition with a generous time-out: these machines are shared and slow."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time

import numpy as np
import pytest

from tests.conftest import BIKES, free_port
from tests.ingest.ingest_helpers import (
    BACKGROUND,
    IMAGE_SIZE,
    WorkerThread,
    make_video,
    pipeline,
    square_box,
    stream,
    tasks,
)
from vlora_va.contracts.geometry import letterbox_geometry
from vlora_va.ingest.chunker import PAD_VALUE

RESUME_LIMIT_S = 6.0  # "within a few seconds": measured ~1.2-1.9 s (backoff <= 1 s, RTSP set-up, a 0.5-s chunk)


def reconnect_delays(records) -> list[float]:
    """The backoff delay of every 'reconnect attempt' warning, in order."""
    return [float(re.search(r"reconnect attempt \d+ in ([\d.]+) s", r.getMessage()).group(1))
            for r in list(records) if "reconnect attempt" in r.getMessage()]


@pytest.mark.rtsp
def test_rtsp_camera_killed_and_restarted_resumes_and_reports_the_outage(rtsp_server, receiver, caplog):
    fps, chunk_s = 10, 0.5  # 5 frames a chunk, all sent: the chunks' frame_ts are the whole media timeline
    cfg = pipeline(receiver.endpoint,
                   stream("cam", rtsp_server.url, fps=fps, chunk_seconds=chunk_s, tasks=tasks(("det", 5, 500.0))),
                   stream("file", BIKES, fps=fps, chunk_seconds=chunk_s, loop=True, realtime=True,
                          tasks=tasks(("det", 1, 500.0))),
                   reconnect_initial_s=0.2, reconnect_max_s=1.0)
    cam = lambda: receiver.by_stream().get("cam", [])  # noqa: E731
    w = WorkerThread(cfg)
    with caplog.at_level(logging.INFO, logger="vlora_va.ingest"):
        w.start()
        assert receiver.pump(lambda: len(cam()) >= 2, timeout=30), "no chunks from the RTSP server"
        h = cam()[0].header
        assert h.orig_size == (768, 576) and h.frame_shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and len(h.frame_ts) == 5

        rtsp_server.kill()  # the camera loses power mid-stream
        killed = time.time()
        # down until the fifth reconnect attempt is due: 0.2 + 0.4 + 0.8 + 1.0 s of backoff at least
        assert receiver.pump(lambda: len(reconnect_delays(caplog.records)) >= 5, timeout=30)
        assert w.is_alive(), "the worker must survive its camera"
        rtsp_server.start()  # the camera comes back on the same address
        back = time.time()
        assert receiver.pump(lambda: sum(c.header.ready_wall > back for c in cam()) >= 2, timeout=30), \
            "no chunks after the RTSP server came back"
        w.stop_event.set()
        receiver.drain(w, timeout=30)
        stats = w.finish(timeout=30)

    chunks = cam()
    assert [c.header.seq for c in chunks] == list(range(len(chunks)))  # nothing dropped, nothing reordered
    ts = [t for c in chunks for t in c.header.frame_ts]
    assert all(b > a for a, b in zip(ts, ts[1:])), "media time must keep increasing across the reconnect"

    # the outage is reported once, by the first chunk after it, and it is exactly the hole in media time
    reported = [c for c in chunks if c.header.outage_s > 0]
    assert len(reported) == 1, [(c.header.seq, c.header.outage_s) for c in reported]
    first_after = reported[0]
    last_before = chunks[first_after.header.seq - 1]
    outage = first_after.header.outage_s
    hole = first_after.header.frame_ts[0] - last_before.header.frame_ts[-1] - 1 / fps
    assert outage == pytest.approx(hole, abs=2e-3)
    # ... and it matches the wall clock (frames are timed when decoded, so a busy machine shifts it a little):
    # about the time the server was down, plus the wait for the next attempt (<= reconnect_max_s) and the
    # connection's set-up; never more than until the first chunk after it was complete
    down = back - killed
    resume = first_after.header.ready_wall - back  # the server's return -> a whole chunk delivered again
    print(f"server down {down:.2f} s; outage reported {outage:.2f} s; first chunk complete {resume:.2f} s "
          f"after the server's return; {stats['cam']['reconnects']} reconnect(s)")
    assert down - 1.0 <= outage <= down + cfg.ingest.reconnect_max_s + 1.5
    assert outage <= first_after.header.ready_wall - killed + 0.5
    assert first_after.header.ready_wall > back and resume < RESUME_LIMIT_S
    assert stats["cam"]["reconnects"] >= 1 and stats["cam"]["errors"] == 0
    assert stats["cam"]["outages"] == 1 and stats["cam"]["outage_s"] == pytest.approx(outage)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "source outage" in r.getMessage()]
    assert warnings == [f"stream cam: source outage: {outage:.2f} s of media missing before chunk "
                        f"{first_after.header.seq} ({stats['cam']['reconnects']} reconnects so far)"]

    # the other stream of the same worker went on through the outage
    files = receiver.by_stream()["file"]
    assert [c.header.seq for c in files] == list(range(len(files))) and all(c.header.outage_s == 0 for c in files)
    during = [c for c in files if killed < c.header.ready_wall < back]
    assert len(during) >= max(1, int(down / chunk_s) // 2), (len(during), down)  # at half its rate at least
    assert stats["file"]["errors"] == 0 and stats["file"]["outages"] == 0

    messages = [r.getMessage() for r in caplog.records]
    attempts = [m for m in messages if "reconnect attempt" in m]
    assert "RTSP source ended" in attempts[0]
    delays = reconnect_delays(caplog.records)
    assert delays[:5] == [0.2, 0.4, 0.8, 1.0, 1.0] and all(d <= 1.0 for d in delays)  # exponential, capped
    assert any("reconnected to" in m for m in messages)


def test_unreachable_rtsp_camera_is_retried_with_backoff_until_stopped(receiver, caplog):
    url = f"rtsp://127.0.0.1:{free_port()}/stream"  # nothing listens there
    cfg = pipeline(receiver.endpoint, stream("cam", url, fps=10), reconnect_initial_s=0.1, reconnect_max_s=0.4)
    w = WorkerThread(cfg)
    with caplog.at_level(logging.WARNING, logger="vlora_va.ingest"):
        w.start()
        assert receiver.pump(lambda: len(reconnect_delays(caplog.records)) >= 5, timeout=30)
        assert w.is_alive(), "a missing camera must not end the worker"
        w.stop_event.set()
        stats = w.finish(timeout=30)
    assert reconnect_delays(caplog.records)[:5] == [0.1, 0.2, 0.4, 0.4, 0.4]  # doubling, capped at reconnect_max_s
    assert any("Connection refused" in r.getMessage() and url in r.getMessage() for r in caplog.records)
    assert stats["cam"]["chunks_sent"] == 0 and stats["cam"]["errors"] == 0


class _ClosingListener:
    """A TCP port that accepts every connection and closes it at once: a camera whose RTSP server is broken."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class _AttemptCounter(logging.Handler):
    """Counts 'reconnect attempt' warnings and keeps their delays (a few floats, not the records)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.delays: list[float] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        m = re.search(r"reconnect attempt \d+ in ([\d.]+) s", record.getMessage())
        if m:
            with self.changed:
                self.delays.append(float(m.group(1)))
                self.changed.notify_all()

    def wait_for(self, n: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.delays) >= n, timeout)


@pytest.mark.parametrize("camera", ["refused", "closes_at_once"])
def test_a_camera_that_never_returns_is_retried_forever_without_leaking(receiver, monkeypatch, camera):
    """Hundreds of failed attempts at the capped interval: the open files and the memory of the process stay
    flat after the first few (every attempt's container, socket and decoder are released)."""
    warm, measured, cap = 30, 150, 0.03
    listener = _ClosingListener() if camera == "closes_at_once" else None
    port = listener.port if listener else free_port()
    cfg = pipeline(receiver.endpoint, stream("cam", f"rtsp://127.0.0.1:{port}/stream", fps=10),
                   reconnect_initial_s=0.01, reconnect_max_s=cap)
    counter = _AttemptCounter()
    logger = logging.getLogger("vlora_va.ingest")
    logger.addHandler(counter)
    # pytest keeps every captured record: hundreds of them would be memory growth of the test, not the worker
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    w = WorkerThread(cfg)
    try:
        w.start()
        assert counter.wait_for(warm, timeout=60)
        fds0, rss0, t0 = _open_fds(), _rss_kb(), time.monotonic()
        assert counter.wait_for(warm + measured, timeout=120)
        fds1, rss1, t1 = _open_fds(), _rss_kb(), time.monotonic()
        n = len(counter.delays)
        assert w.is_alive(), "a camera that never returns must not end the worker"
        w.stop_event.set()
        stats = w.finish(timeout=30)
    finally:
        logger.removeHandler(counter)
        if listener:
            listener.close()
    interval = (t1 - t0) / (n - warm)
    print(f"{camera}: {n} attempts; {fds0} -> {fds1} open fds and {rss0} -> {rss1} kB RSS over the last "
          f"{n - warm}; one attempt every {interval * 1000:.1f} ms (cap {cap * 1000:.0f} ms)"
          + (f"; {listener.accepted} connections accepted" if listener else ""))
    assert counter.delays[:3] == [0.01, 0.02, cap] and set(counter.delays[2:]) == {cap}
    assert interval >= cap * 0.9  # waits the capped interval every time: no busy retrying
    assert fds1 - fds0 <= 1, f"{fds1 - fds0} more open fds after {n - warm} attempts"
    assert rss1 - rss0 < 2048, f"RSS grew {rss1 - rss0} kB over {n - warm} attempts"
    assert stats["cam"]["chunks_sent"] == 0 and stats["cam"]["errors"] == 0 and stats["cam"]["reconnects"] == 0
    if listener:
        assert listener.accepted >= measured  # every attempt really reached the camera's port


# ---------------------------------------------------------------- cameras the project was not tuned on

CAMERAS = [  # (source fps, width, height, configured fps)
    (24, 720, 528, 10),  # fewer frames than the camera sends: every 2.4th
    (15, 320, 240, 15),  # one to one
    (15, 320, 240, 30),  # more frames than the camera sends: each one twice
]


@pytest.fixture(scope="module")
def camera_videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cameras")
    return {(f, w, h): make_video(folder / f"cam-{f}fps-{w}x{h}.mp4", fps=f, width=w, height=h, seconds=8)
            for f, w, h in sorted({c[:3] for c in CAMERAS})}


@pytest.mark.rtsp
def test_cameras_at_other_frame_rates_and_sizes_over_rtsp(rtsp_server_for, camera_videos, receiver, caplog):
    """Three generated cameras over the real RTSP server, in one worker: chunks come at the camera's pace with
    frames exactly 1/fps apart at the configured fps, and each picture is letterboxed where the header says."""
    n_chunks = 4
    streams = []
    for i, (src_fps, w, h, fps) in enumerate(CAMERAS):
        server = rtsp_server_for(camera_videos[src_fps, w, h])
        streams.append(stream(f"cam{i}", server.url, fps=fps, chunk_seconds=1.0, tasks=tasks(("all", fps, 1000.0))))
    cfg = pipeline(receiver.endpoint, *streams, reconnect_initial_s=0.2, reconnect_max_s=1.0)
    w = WorkerThread(cfg)
    with caplog.at_level(logging.INFO, logger="vlora_va.ingest"):
        w.start()
        done = lambda: all(len(receiver.by_stream().get(s.id, [])) >= n_chunks for s in streams)  # noqa: E731
        assert receiver.pump(done, timeout=60), {k: len(v) for k, v in receiver.by_stream().items()}
        w.stop_event.set()
        receiver.drain(w, timeout=30)
        stats = w.finish(timeout=30)
    messages = [r.getMessage() for r in caplog.records]
    for s, (src_fps, width, height, fps) in zip(streams, CAMERAS):
        chunks = receiver.by_stream()[s.id][:n_chunks]
        where = f"{s.id} ({src_fps} fps {width}x{height} at {fps} fps)"
        assert any(f"stream {s.id}: opened" in m and f"({width}x{height}, h264, {src_fps:g} fps source -> {fps:g} fps"
                   in m for m in messages), where
        assert [c.header.seq for c in chunks] == list(range(n_chunks)), where
        ts = [t for c in chunks for t in c.header.frame_ts]
        assert len(ts) == n_chunks * fps and np.allclose(np.diff(ts), 1 / fps, atol=1e-5), where
        # at the camera's pace: chunks 1..3 (2 s of media after chunk 1) over about 2 s of wall time, not in a burst
        ready = [c.header.ready_wall for c in chunks]
        assert 1.0 <= ready[3] - ready[1] <= 6.0, (where, [round(r - ready[0], 2) for r in ready])
        _, new_h, expected_lb = letterbox_geometry(width, height, IMAGE_SIZE)
        x1, y1, x2, y2 = square_box(width, height)
        for c in chunks:
            h = c.header
            assert h.orig_size == (width, height) and h.fps == fps and h.frame_shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
            assert h.outage_s == 0 and h.dropped_before == 0
            assert h.letterbox == expected_lb, where
            pad = int(h.letterbox.pad_y)
            for f in c.frames[:: max(1, fps // 3)]:
                # the padding bands are exactly the pad value, the picture between them is the camera's
                assert (f[:pad] == PAD_VALUE).all() and (f[pad + new_h:] == PAD_VALUE).all(), where
                middle = f[pad + new_h // 2 + new_h // 3]  # a row below the square: background only
                assert np.abs(np.median(middle, axis=0) - BACKGROUND).max() <= 12, (where, np.median(middle, axis=0))
                # the white square maps back to where it is in the camera's picture
                ys, xs = np.nonzero(f.min(axis=2) > 200)
                cx, cy = h.letterbox.to_original(xs.mean() + 0.5, ys.mean() + 0.5)
                assert abs(cx - (x1 + x2) / 2) <= 2 / h.letterbox.scale and \
                    abs(cy - (y1 + y2) / 2) <= 2 / h.letterbox.scale, (where, cx, cy)
        assert stats[s.id]["errors"] == 0
