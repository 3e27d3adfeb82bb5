"""streams.worker: real decoding, real ZeroMQ sockets, the receiving side decoding with contracts.wire."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import streams.worker as worker_mod
from contracts.geometry import Letterbox
from contracts.wire import ChunkHeader
from streams.chunker import ReadyChunk
from streams.worker import ChunkQueue, StreamStats, plan_workers, run_ingest
from tests.conftest import BIKES, PEDESTRIANS, free_port
from tests.streams.ingest_helpers import IMAGE_SIZE, Receiver, WorkerThread, pipeline, stream
from tests.streams.test_source import corrupt_copy


@pytest.mark.parametrize("n_streams, per_worker, expected", [
    (1, 2, [["s0"]]),
    (4, 2, [["s0", "s1"], ["s2", "s3"]]),
    (5, 2, [["s0", "s1"], ["s2", "s3"], ["s4"]]),
    (3, 1, [["s0"], ["s1"], ["s2"]]),
    (3, 8, [["s0", "s1", "s2"]]),
])
def test_plan_workers_groups_streams(n_streams, per_worker, expected):
    cfg = pipeline("tcp://127.0.0.1:1", *[stream(f"s{i}", BIKES) for i in range(n_streams)],
                   streams_per_worker=per_worker)
    assert plan_workers(cfg) == expected


def test_unknown_stream_id_is_refused():
    with pytest.raises(KeyError, match="nope"):
        run_ingest(pipeline("tcp://127.0.0.1:1", stream("a", BIKES)), ["nope"])


def check_stream_chunks(chunks, stream_id, n_chunks, orig_size, fps, frames_per_chunk):
    """Every chunk of one stream: in order, complete, well-formed, with consistent letterbox maths."""
    assert [c.header.seq for c in chunks] == list(range(n_chunks)), stream_id
    all_ts = [t for c in chunks for t in c.header.frame_ts]
    assert all(b > a for a, b in zip(all_ts, all_ts[1:])), "timestamps must increase across chunks"
    for c in chunks:
        h = c.header
        assert h.stream == stream_id and h.fps == fps and h.orig_size == orig_size and h.dropped_before == 0
        assert len(c.frames) == len(h.frame_ts) == 6  # union of det (2) and act (4) of 10 frames
        assert all(f.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) for f in c.frames)
        assert h.frame_ts[0] >= h.seq * frames_per_chunk / fps - 1e-6
        assert h.frame_ts[-1] < (h.seq + 1) * frames_per_chunk / fps
        w, hgt = orig_size
        lb = h.letterbox
        assert lb.scale == pytest.approx(min(IMAGE_SIZE / w, IMAGE_SIZE / hgt))
        assert lb.pad_y == (IMAGE_SIZE - round(hgt * lb.scale)) // 2 and lb.pad_x == 0
        assert [len(t.frames) for t in h.tasks] == [2, 4]
        assert h.ready_wall <= h.sent_wall <= time.time()  # the sender stamps sent_wall
        assert [(t.deadline_ms, t.priority) for t in h.tasks] == [(500.0, 0), (1000.0, 0)]


def test_two_streams_arrive_complete_and_in_order(receiver):
    cfg = pipeline(receiver.endpoint,
                   stream("bikes", BIKES, fps=10),  # 10 s -> 10 chunks, then the file ends
                   stream("peds", PEDESTRIANS, fps=10, max_chunks=4))
    w = WorkerThread(cfg)
    w.start()
    receiver.drain(w, timeout=20)
    stats = w.finish()
    got = receiver.by_stream()
    check_stream_chunks(got["bikes"], "bikes", 10, (640, 272), 10.0, 10)
    check_stream_chunks(got["peds"], "peds", 4, (768, 576), 10.0, 10)
    assert stats["bikes"] == {"chunks_made": 10, "chunks_sent": 10, "chunks_dropped": 0, "errors": 0,
                              "reconnects": 0, "last_error": None}
    assert stats["peds"]["chunks_sent"] == 4


@pytest.mark.parametrize("bad", ["missing", "garbage", "truncated"])
def test_a_failing_stream_does_not_stop_the_other(receiver, tmp_path, caplog, bad):
    path = tmp_path / "missing.mp4" if bad == "missing" else corrupt_copy(tmp_path, bad)
    cfg = pipeline(receiver.endpoint, stream("broken", path, fps=10), stream("good", BIKES, fps=10, max_chunks=5))
    with caplog.at_level(logging.INFO, logger="streams"):
        w = WorkerThread(cfg)
        w.start()
        receiver.drain(w, timeout=20)
        stats = w.finish()
    assert [c.header.seq for c in receiver.by_stream()["good"]] == [0, 1, 2, 3, 4]
    assert stats["good"]["errors"] == 0 and stats["good"]["chunks_sent"] == 5
    assert stats["broken"]["errors"] == 1 and str(path) in stats["broken"]["last_error"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(str(path) in m and "stream broken" in m for m in errors), errors
    # a truncated file delivered what decoded before the damage; the others delivered nothing
    assert (stats["broken"]["chunks_sent"] > 0) == (bad == "truncated")


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest"])
def test_slow_daemon_drops_chunks_with_exact_accounting(zmq_ctx, caplog, policy):
    # a daemon that keeps little in its socket, as it must for the ingest drop policy to work
    slow = Receiver(zmq_ctx, rcvhwm=1, rcvbuf=64 * 1024)
    n = 20
    cfg = pipeline(slow.endpoint, stream("peds", PEDESTRIANS, fps=10, max_chunks=n), send_hwm=2, drop_policy=policy)
    with caplog.at_level(logging.WARNING, logger="streams"):
        w = WorkerThread(cfg)
        w.start()
        chunks = slow.drain(w, timeout=30, delay=0.2)  # the daemon takes 0.2 s per chunk; ingest makes them faster
        stats = w.finish()
    seqs = [c.header.seq for c in chunks]
    assert seqs == sorted(seqs) and len(seqs) == stats["peds"]["chunks_sent"]
    assert stats["peds"]["chunks_made"] == n
    assert stats["peds"]["chunks_dropped"] == n - len(seqs) > 0
    # each header says exactly how many chunks of its stream were dropped since the previous one sent
    prev = -1
    for c in chunks:
        assert c.header.dropped_before == c.header.seq - prev - 1
        prev = c.header.seq
    assert sum(c.header.dropped_before for c in chunks) + (n - 1 - seqs[-1]) == stats["peds"]["chunks_dropped"]
    # drops followed by a sent chunk are logged when it is sent (drop_newest may drop only at the end)
    logged = any("dropped before chunk" in r.getMessage() for r in caplog.records)
    assert logged == any(c.header.dropped_before for c in chunks)
    if policy == "drop_oldest":
        assert seqs[-1] == n - 1  # the newest chunk always gets through: latency stays bounded
    else:
        assert seqs[:2] == [0, 1]  # the oldest are kept (which later ones get in depends on timing)


def queued_chunk(seq: int) -> ReadyChunk:
    header = ChunkHeader(stream="s", seq=seq, fps=10.0, frame_ts=(), frame_shape=(1, 1, 3), orig_size=(1, 1),
                         letterbox=Letterbox(1.0, 0.0, 0.0), tasks=(), ready_wall=0.0)
    return ReadyChunk(header, [])


@pytest.mark.parametrize("policy, kept, accepted", [
    ("drop_oldest", [2, 3], [True, True, True, True]),  # the newest win: bounded latency
    ("drop_newest", [0, 1], [True, True, False, False]),  # the oldest win: no gaps early on
])
def test_queue_drop_policies(policy, kept, accepted):
    stats = {"s": StreamStats()}
    q = ChunkQueue(2, policy, stats)
    stop = threading.Event()
    assert [q.put(queued_chunk(i), stop) for i in range(4)] == accepted
    assert [q.get(0).header.seq for _ in range(len(q))] == kept
    assert stats["s"].chunks_dropped == 2 and q.get(0) is None


def test_queue_block_policy_waits_for_room_and_honours_stop():
    stats = {"s": StreamStats()}
    q = ChunkQueue(1, "block", stats)
    stop = threading.Event()
    assert q.put(queued_chunk(0), stop)
    threading.Timer(0.3, q.get, args=(0,)).start()  # the sender takes one chunk a little later
    t0 = time.monotonic()
    assert q.put(queued_chunk(1), stop) and time.monotonic() - t0 >= 0.25  # waited for the room
    threading.Timer(0.2, stop.set).start()
    assert not q.put(queued_chunk(2), stop)  # stop ends the wait; the chunk counts as dropped
    assert stats["s"].chunks_dropped == 1 and [q.get(0).header.seq for _ in range(len(q))] == [1]


def test_block_policy_loses_nothing(zmq_ctx):
    slow = Receiver(zmq_ctx, rcvhwm=1)
    cfg = pipeline(slow.endpoint, stream("bikes", BIKES, fps=10, max_chunks=6), send_hwm=1, drop_policy="block")
    w = WorkerThread(cfg)
    w.start()
    chunks = slow.drain(w, timeout=30, delay=0.2)
    stats = w.finish()
    assert [c.header.seq for c in chunks] == list(range(6))
    assert all(c.header.dropped_before == 0 for c in chunks) and stats["bikes"]["chunks_dropped"] == 0


def test_stop_event_ends_a_looping_realtime_worker(receiver):
    cfg = pipeline(receiver.endpoint, stream("cam", BIKES, fps=10, chunk_seconds=0.5, loop=True, realtime=True))
    w = WorkerThread(cfg)
    w.start()
    deadline = time.monotonic() + 10
    while len(receiver.chunks) < 2 and time.monotonic() < deadline:
        receiver.receive(0.2)
    t0 = time.monotonic()
    w.stop_event.set()
    stats = w.finish(timeout=10)
    assert time.monotonic() - t0 < 3.0
    receiver.drain(w, timeout=2)
    assert len(receiver.chunks) == stats["cam"]["chunks_sent"] >= 2
    # realtime: a chunk of 0.5 s of media is ready about 0.5 s after the previous one
    a, b = receiver.chunks[0].header, receiver.chunks[1].header
    assert b.ready_wall - a.ready_wall == pytest.approx(0.5, abs=0.2)


def test_absent_daemon_cannot_keep_a_finished_worker_alive(monkeypatch):
    monkeypatch.setattr(worker_mod, "FLUSH_TIMEOUT_S", 0.5)
    cfg = pipeline(f"tcp://127.0.0.1:{free_port()}", stream("bikes", BIKES, fps=10, max_chunks=3))
    t0 = time.monotonic()
    stats = run_ingest(cfg)
    assert time.monotonic() - t0 < 5.0
    assert stats["bikes"]["chunks_sent"] == 0 and stats["bikes"]["chunks_dropped"] == 3
