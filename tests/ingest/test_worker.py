"""vlora_va.ingest.worker: real decoding, real ZeroMQ sockets, the receiving side decoding with vlora_va.contracts.wire."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

import vlora_va.ingest.worker as worker_mod
from tests.conftest import BIKES, PEDESTRIANS, free_port
from tests.ingest.ingest_helpers import IMAGE_SIZE, Receiver, WorkerThread, make_video, pipeline, stream, tasks
from tests.ingest.test_source import CORRUPT_MESSAGES, corrupt_copy
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.results import DetectionResult, ResultRecord
from vlora_va.contracts.wire import ChunkHeader
from vlora_va.ingest.chunker import ReadyChunk
from vlora_va.ingest.worker import ChunkQueue, StreamStats, plan_workers, run_ingest


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
        assert len(c.frames) == len(h.frame_ts) == 4  # det (2) shares act's (4) frames of 10
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
                              "reconnects": 0, "outages": 0, "outage_s": 0.0, "last_error": None, "state": "ended"}
    assert all(c.header.outage_s == 0 for c in receiver.chunks)
    assert stats["peds"]["chunks_sent"] == 4


def _error_time(caplog, stream_id: str) -> float | None:
    """When the worker logged that stream's failure (None: not yet)."""
    for r in list(caplog.records):
        if r.levelno == logging.ERROR and f"stream {stream_id}:" in r.getMessage():
            return r.created
    return None


# the failures a worker meets (test_source.py checks every kind's message): nothing to open, nothing decodable,
# cut short (inside a packet, at a packet boundary), overwritten in the middle (undecodable, concealed by the decoder)
BAD_FILES = ["missing", "garbage", "half", "cut_at_packet", "garbage_in_middle", "damaged_frame"]


@pytest.mark.parametrize("bad", BAD_FILES)
def test_a_bad_file_stops_its_stream_alone_with_a_clear_error(receiver, tmp_path, caplog, bad):
    """A missing, corrupt or truncated file: an error naming the file and the problem, that stream stops after
    what decoded before the damage, and the worker's other stream keeps sending afterwards."""
    path = tmp_path / "missing.mp4" if bad == "missing" else corrupt_copy(tmp_path, bad)
    problem = (r"cannot open '.*missing\.mp4': no such file" if bad == "missing"
               else CORRUPT_MESSAGES[bad][0].replace("stream cam: ", ""))
    cfg = pipeline(receiver.endpoint, stream("broken", path, fps=10),
                   stream("good", BIKES, fps=10, chunk_seconds=0.5, loop=True, realtime=True),
                   drop_policy="block",  # lossless: this test is about failures, not drops
                   skip_frames=False)  # every frame decoded: the error names how many came before the damage
    with caplog.at_level(logging.INFO, logger="vlora_va.ingest"):
        w = WorkerThread(cfg)
        w.start()
        assert receiver.pump(lambda: _error_time(caplog, "broken") is not None, timeout=30), "no error logged"
        failed = _error_time(caplog, "broken")
        good_after = lambda: [c for c in receiver.by_stream().get("good", [])  # noqa: E731
                              if c.header.ready_wall > failed]
        assert receiver.pump(lambda: len(good_after()) >= 2, timeout=30), "the other stream stopped too"
        assert w.is_alive()
        w.stop_event.set()
        receiver.drain(w, timeout=30)
        stats = w.finish(timeout=30)
    good = receiver.by_stream()["good"]
    assert [c.header.seq for c in good] == list(range(len(good))) and len(good) == stats["good"]["chunks_sent"]
    assert stats["good"]["errors"] == 0 and stats["good"]["last_error"] is None
    assert stats["broken"]["errors"] == 1 and str(path) in stats["broken"]["last_error"]
    assert re.search(f"stream broken: {problem}", stats["broken"]["last_error"]), stats["broken"]["last_error"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0]
    assert "this stream stops, the worker's other streams go on" in errors[0]
    # a damaged file delivered what decoded before the damage; one that cannot be opened delivered nothing
    assert (stats["broken"]["chunks_sent"] > 0) == (bad not in ("missing", "garbage"))
    assert len(receiver.by_stream().get("broken", [])) == stats["broken"]["chunks_sent"]


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest"])
def test_slow_daemon_drops_chunks_with_exact_accounting(zmq_ctx, caplog, policy):
    # a daemon that keeps little in its socket, as it must for the ingest drop policy to work
    slow = Receiver(zmq_ctx, rcvhwm=1, rcvbuf=64 * 1024)
    n = 20
    cfg = pipeline(slow.endpoint, stream("peds", PEDESTRIANS, fps=10, max_chunks=n), send_hwm=2, drop_policy=policy)
    with caplog.at_level(logging.WARNING, logger="vlora_va.ingest"):
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


def queued_chunk(seq: int, outage_s: float = 0.0) -> ReadyChunk:
    header = ChunkHeader(stream="s", seq=seq, fps=10.0, frame_ts=(), frame_shape=(1, 1, 3), orig_size=(1, 1),
                         letterbox=Letterbox(1.0, 0.0, 0.0), tasks=(), ready_wall=0.0, outage_s=outage_s)
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


def test_the_outage_of_a_dropped_chunk_is_owed_to_the_next_one_sent():
    stats = {"s": StreamStats()}
    q = ChunkQueue(1, "drop_oldest", stats)
    stop = threading.Event()
    q.put(queued_chunk(0, outage_s=2.5), stop)
    q.put(queued_chunk(1), stop)  # drops chunk 0 and its outage report
    q.put(queued_chunk(2, outage_s=0.5), stop)  # drops chunk 1
    assert stats["s"].chunks_dropped == 2 and q.get(0).header.seq == 2
    assert q.take_lost_outage("s") == 2.5 and q.take_lost_outage("s") == 0.0


def test_queue_block_policy_waits_for_room_and_honours_stop():
    stats = {"s": StreamStats()}
    q = ChunkQueue(1, "block", stats)
    stop = threading.Event()
    assert q.put(queued_chunk(0), stop)
    accepted = {}

    def put(seq: int) -> None:
        accepted[seq] = q.put(queued_chunk(seq), stop)

    waiting = threading.Thread(target=put, args=(1,))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive(), "a full queue must make the source wait"  # a lower bound: safe when slow
    assert q.get(0).header.seq == 0  # the sender takes one: room
    waiting.join(10)
    assert not waiting.is_alive() and accepted[1] is True
    waiting = threading.Thread(target=put, args=(2,))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()
    stop.set()  # stop ends the wait; the chunk counts as dropped
    waiting.join(10)
    assert not waiting.is_alive() and accepted[2] is False
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
    assert receiver.pump(lambda: len(receiver.chunks) >= 4, timeout=30)
    t0 = time.monotonic()
    w.stop_event.set()
    assert w.flushed.wait(15), "the worker did not finish within 15 s of stop"
    stopped_in = time.monotonic() - t0
    receiver.drain(w, timeout=30)
    stats = w.finish(timeout=30)
    print(f"worker flushed {stopped_in:.3f} s after stop")
    assert len(receiver.chunks) == stats["cam"]["chunks_sent"] >= 4
    # realtime: chunk 3 is ready 1.5 s of media after chunk 0, never earlier on the wall clock (as fast as
    # possible: ~0.1 s); only chunk 0 can be late, and half the span is left as slack for a slow machine
    ready = [c.header.ready_wall for c in receiver.chunks[:4]]
    assert ready[3] - ready[0] >= 0.75, [round(r - ready[0], 3) for r in ready]


def test_absent_daemon_cannot_keep_a_finished_worker_alive(monkeypatch):
    monkeypatch.setattr(worker_mod, "FLUSH_TIMEOUT_S", 0.5)
    monkeypatch.setattr(worker_mod, "ENDED_FLUSH_TIMEOUT_S", 0.5)  # the stream ends by itself (max_chunks)
    cfg = pipeline(f"tcp://127.0.0.1:{free_port()}", stream("bikes", BIKES, fps=10, max_chunks=3))
    t0 = time.monotonic()
    stats = run_ingest(cfg)
    assert time.monotonic() - t0 < 30.0  # not forever (typically ~1 s: 3 chunks, then 0.5 s to flush)
    assert stats["bikes"]["chunks_sent"] == 0 and stats["bikes"]["chunks_dropped"] == 3


@pytest.mark.parametrize("daemon", ["keeps_up", "slow"])
def test_a_stalled_source_reports_its_outage_in_the_chunk_the_log_and_the_result_rows(zmq_ctx, tmp_path, caplog,
                                                                                      daemon):
    """A file whose timestamps jump 3 s after 2.4 s (a camera that stalled while recording), at 10 fps in 1-s
    chunks: chunks 0-1 cover 0-1.9 s; the partial chunk 2.0-2.4 s is dropped with the stall; the next chunk
    starts at 5.5 s and says 3.5 s are missing; the rows of its requests say so too. A slow daemon (drop_oldest)
    may drop that chunk: the next one sent then carries its report, so the reports always add up."""
    path = make_video(tmp_path / "stall.mp4", fps=10, width=160, height=120, seconds=6, gap=(25, 30))
    slow = daemon == "slow"
    rx = Receiver(zmq_ctx, rcvhwm=1, rcvbuf=64 * 1024) if slow else Receiver(zmq_ctx)
    cfg = pipeline(rx.endpoint, stream("stall", path, fps=10, tasks=tasks(("det", 10, 500.0))),
                   send_hwm=1 if slow else 4, drop_policy="drop_oldest" if slow else "block")
    with caplog.at_level(logging.INFO, logger="vlora_va.ingest"):
        w = WorkerThread(cfg)
        w.start()
        chunks = rx.drain(w, timeout=30, delay=0.3 if slow else 0.0)
        stats = w.finish()
    assert stats["stall"]["outages"] == 1 and stats["stall"]["outage_s"] == pytest.approx(3.5)
    assert sum(c.header.outage_s for c in chunks) == pytest.approx(3.5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "outage" in r.getMessage()]
    assert warnings == ["stream stall: source outage: 3.50 s of media missing before chunk 2 (0 reconnects so far)"]
    if not slow:
        assert [c.header.seq for c in chunks] == [0, 1, 2, 3, 4]
        assert [c.header.outage_s for c in chunks] == [0.0, 0.0, 3.5, 0.0, 0.0]
        assert [c.header.frame_ts[0] for c in chunks] == pytest.approx([0.0, 1.0, 5.5, 6.5, 7.5])
    # what the daemon makes of it (contracts.requests and contracts.results, as the daemon uses them)
    for c in chunks:
        req = c.requests(received=time.time())[0]
        assert req.outage_before_s == c.header.outage_s
        ok = ResultRecord.served(req, DetectionResult(()), compute_start=req.received, compute_end=req.received + 0.1,
                    batch_images=1, mode="premerged").to_json()
        shed = ResultRecord.not_served(req, "shed", "overload", now=req.received).to_json()
        for row in (ok, shed):
            assert row.get("outage_before_s") == (c.header.outage_s or None)


def test_streams_that_need_few_frames_skip_decoding_frames_nothing_refers_to(receiver):
    """A detect-only stream (1 frame of 10 a chunk) does not decode the frames no other frame refers to: fewer
    frames decoded for the same chunks, the same frame times sent. A clip task (8 of 10) decodes them all."""
    def run(skip):
        cfg = pipeline(receiver.endpoint, stream(f"bikes-{skip}", BIKES, fps=10), skip_frames=skip, drop_policy="block")
        w = WorkerThread(cfg)
        w.start()
        receiver.drain(w, timeout=30)
        w.finish(timeout=30)
        chunks = receiver.by_stream()[f"bikes-{skip}"]
        return chunks, chunks[-1].header.decoded

    skipped, n_skipped = run(True)
    full, n_full = run(False)
    assert [c.header.frame_ts for c in skipped] == [c.header.frame_ts for c in full]
    assert len(skipped) == len(full) == 10 and 0 < n_skipped < 0.8 * n_full


def test_a_slow_daemon_still_gets_every_chunk_of_a_file_that_ended(zmq_ctx, monkeypatch):
    """The file ends while chunks still wait for a daemon that takes one every 0.6 s (a best-effort file on a busy
    CPU): the flush time starts again each time a chunk leaves, so all of them arrive although together they need
    far longer than that time."""
    monkeypatch.setattr(worker_mod, "ENDED_FLUSH_TIMEOUT_S", 1.5)
    rx = Receiver(zmq_ctx, rcvhwm=1, rcvbuf=64 * 1024)
    cfg = pipeline(rx.endpoint, stream("bikes", BIKES, fps=10, max_chunks=8, tasks=tasks(("det", 10, 500.0))),
                   send_hwm=8, drop_policy="block")
    w = WorkerThread(cfg)
    w.start()
    chunks = rx.drain(w, timeout=60, delay=0.6)
    stats = w.finish(timeout=30)
    assert stats["bikes"]["chunks_dropped"] == 0 and [c.header.seq for c in chunks] == list(range(8))


def test_a_heartbeat_sent_while_a_stream_stamps_a_frame_says_age_zero_not_negative():
    """A stream's thread may stamp last_frame after the heartbeat read its clock: the age was negative, which the
    wire refuses (a CI run failed on it: `frame_age_s: must be in [0, 1e+11], got -0.003`)."""
    from types import SimpleNamespace

    import zmq

    from vlora_va.contracts.wire import SourceStatus, decode_message

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        stats = {"cam": StreamStats(last_frame=time.monotonic() + 5.0)}  # stamped "after" the heartbeat's now
        worker_mod.Heartbeat(SimpleNamespace(beat_sock=push), stats).send(wait_s=5.0)
        assert pull.poll(5000), "no heartbeat arrived"
        status = decode_message([pull.recv()])
        assert isinstance(status, SourceStatus) and status.stream == "cam" and status.frame_age_s == 0.0
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()
