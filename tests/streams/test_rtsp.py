"""RTSP ingest against a real local RTSP server (GStreamer, see tests/rtsp_server.py): a camera that
drops mid-stream is reconnected with backoff and delivers again; a camera that is not there is retried."""

from __future__ import annotations

import logging
import re
import time

import pytest

from tests.conftest import free_port
from tests.streams.ingest_helpers import IMAGE_SIZE, WorkerThread, pipeline, stream, tasks


def receive_until(receiver, n: int, timeout: float, after_wall: float = 0.0) -> list:
    """Chunks received until n of them were ready after `after_wall` (a wall-clock time)."""
    fresh, deadline = [], time.monotonic() + timeout
    while len(fresh) < n and time.monotonic() < deadline:
        chunk = receiver.receive(0.2)
        if chunk is not None and chunk.header.ready_wall > after_wall:
            fresh.append(chunk)
    return fresh


@pytest.mark.rtsp
def test_rtsp_camera_that_drops_is_reconnected(rtsp_server, receiver, caplog):
    cfg = pipeline(receiver.endpoint,
                   stream("cam", rtsp_server.url, fps=10, chunk_seconds=0.5, tasks=tasks(("det", 2, 500.0))),
                   reconnect_initial_s=0.2, reconnect_max_s=1.0)
    w = WorkerThread(cfg)
    with caplog.at_level(logging.INFO, logger="streams"):
        w.start()
        before = receive_until(receiver, 2, timeout=20)
        assert len(before) == 2, "no chunks from the RTSP server"
        h = before[0].header
        assert h.orig_size == (768, 576) and h.frame_shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and len(h.frame_ts) == 2

        rtsp_server.kill()  # the camera loses power mid-stream
        killed = time.time()
        time.sleep(2.0)  # long enough for a few reconnect attempts to fail
        assert w.is_alive(), "the worker must survive its camera"
        rtsp_server.start()  # the camera comes back on the same address
        after = receive_until(receiver, 2, timeout=20, after_wall=killed + 2.0)
        w.stop_event.set()
        stats = w.finish()

    assert len(after) == 2, "no chunks after the RTSP server came back"
    assert stats["cam"]["reconnects"] >= 1 and stats["cam"]["errors"] == 0
    seqs = [c.header.seq for c in receiver.chunks]
    assert seqs == list(range(len(seqs)))  # nothing dropped, nothing reordered
    ts = [t for c in receiver.chunks for t in c.header.frame_ts]
    assert all(b > a for a, b in zip(ts, ts[1:])), "media time must keep increasing across the reconnect"
    assert max(b - a for a, b in zip(ts, ts[1:])) >= 1.5, "the outage shows as a gap in media time"
    messages = [r.getMessage() for r in caplog.records]
    attempts = [m for m in messages if "reconnect attempt" in m]
    assert attempts and "RTSP source ended" in attempts[0]
    delays = [float(re.search(r"in ([\d.]+) s", m).group(1)) for m in attempts]
    assert delays[:3] == [0.2, 0.4, 0.8][:len(delays[:3])]  # exponential backoff
    assert all(d <= 1.0 for d in delays)
    assert any("reconnected to" in m for m in messages)


def test_unreachable_rtsp_camera_is_retried_with_backoff_until_stopped(receiver, caplog):
    url = f"rtsp://127.0.0.1:{free_port()}/stream"  # nothing listens there
    cfg = pipeline(receiver.endpoint, stream("cam", url, fps=10), reconnect_initial_s=0.1, reconnect_max_s=0.4)
    w = WorkerThread(cfg)
    with caplog.at_level(logging.WARNING, logger="streams"):
        w.start()
        time.sleep(1.5)
        assert w.is_alive(), "a missing camera must not end the worker"
        w.stop_event.set()
        stats = w.finish(timeout=10)
    attempts = [r.getMessage() for r in caplog.records if "reconnect attempt" in r.getMessage()]
    delays = [float(re.search(r"in ([\d.]+) s", m).group(1)) for m in attempts]
    assert delays[:4] == [0.1, 0.2, 0.4, 0.4]  # doubling, capped at reconnect_max_s
    assert any("Connection refused" in r.getMessage() and url in r.getMessage() for r in caplog.records)
    assert stats["cam"]["chunks_sent"] == 0 and stats["cam"]["errors"] == 0
