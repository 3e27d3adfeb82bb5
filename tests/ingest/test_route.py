"""Cluster mode's routing of a stream (vlora_va/ingest/route.py) and the worker following it (vlora_va/ingest/worker.py,
`_Link`): a real ingest worker on a sample video, moved between two real PULL sockets while it runs, and the ledger
of what went where. Route and SentLedger on their own too.

Every wait is on a condition, with a generous time-out: never a fixed sleep."""

from __future__ import annotations

import time

from tests.conftest import BIKES
from tests.ingest.ingest_helpers import QUIET_S, Receiver, WorkerThread, pipeline, stream
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.wire import ChunkHeader, TaskRequest
from vlora_va.ingest.route import Route, SentChunk, SentLedger

WAIT_S = 60.0


class RoutedWorker(WorkerThread):
    """run_ingest in a thread, as cluster mode runs it: with a Route and a SentLedger."""

    def __init__(self, config, route: Route, ledger: SentLedger):
        super().__init__(config)
        self.route, self.ledger = route, ledger

    def run(self) -> None:
        from vlora_va.ingest.worker import run_ingest

        try:
            self.stats = run_ingest(self.config, None, self.stop_event, self.flushed, self.release, route=self.route,
                                    ledger=self.ledger)
        except BaseException as e:  # surfaced by finish()
            self.error = e


def receive_both(a: Receiver, b: Receiver, until, timeout: float = WAIT_S) -> None:
    """Read both sockets (each keeps what it got) until `until()` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s: a got {seqs(a)}, b got {seqs(b)}"
        a.receive(0.02)
        b.receive(0.02)


def drain_both(a: Receiver, b: Receiver, worker: WorkerThread, timeout: float = WAIT_S) -> None:
    """Read both until the worker has flushed and then neither socket has had a message for QUIET_S."""
    quiet = {"since": None}

    def done() -> bool:
        if not worker.flushed.is_set() and worker.is_alive():
            return False
        n = len(a.chunks) + len(b.chunks) + len(a.statuses) + len(b.statuses)
        if quiet["since"] is None or quiet["n"] != n:
            quiet.update(since=time.monotonic(), n=n)
        return time.monotonic() - quiet["since"] >= QUIET_S

    receive_both(a, b, done, timeout)
    worker.release.set()


def seqs(r: Receiver) -> list[int]:
    return [c.header.seq for c in r.chunks]


def test_a_moved_stream_continues_at_the_new_daemon_with_no_gap_and_a_ledger_of_what_went_where(zmq_ctx):
    a, b = Receiver(zmq_ctx), Receiver(zmq_ctx)
    n = 12  # 0.5-s chunks, paced like a camera: 6 s in all, time enough to move it in the middle
    cfg = pipeline(a.endpoint, stream("cam", BIKES, fps=10, chunk_seconds=0.5, realtime=True, max_chunks=n),
                   drop_policy="block")
    route, ledger = Route(a.endpoint, "a"), SentLedger()
    w = RoutedWorker(cfg, route, ledger)
    w.start()
    try:
        receive_both(a, b, lambda: len(a.chunks) >= 3)
        route.set(b.endpoint, "b", linger_s=1.0)
        receive_both(a, b, route.followed)  # the worker's sockets now point at b
        moved = time.time()
        sent_to_a = ledger.count("a")  # from now on nothing more goes to a
        drain_both(a, b, w)
    finally:
        stats = w.finish(timeout=30)
    got_a, got_b = seqs(a), seqs(b)
    assert len(got_a) >= 3 and got_b, (got_a, got_b)
    assert got_a + got_b == list(range(n)), (got_a, got_b)  # in order, each once, a cut with no gap
    assert all(c.header.dropped_before == 0 for c in a.chunks + b.chunks)
    assert stats["cam"]["chunks_sent"] == n
    # the heartbeats moved too: a heard them until the move, b after it
    assert a.statuses and all(s.sent_wall < moved for s in a.statuses)
    assert b.statuses and {s.stream for s in b.statuses} == {"cam"}
    # the ledger holds what was handed to ZeroMQ for each daemon (a's lingering socket delivered all of it)
    assert sent_to_a == len(got_a)
    assert [c.seq for c in ledger.take("a")] == got_a
    assert [c.seq for c in ledger.take("b")] == got_b
    assert ledger.take("a") == [] and ledger.count("b") == 0  # taken: handed over once


def test_without_a_route_the_worker_keeps_no_ledger_and_stays_on_its_daemon(receiver):
    cfg = pipeline(receiver.endpoint, stream("cam", BIKES, fps=10, max_chunks=3))
    w = WorkerThread(cfg)
    w.start()
    receiver.drain(w, timeout=WAIT_S)
    assert w.finish()["cam"]["chunks_sent"] == 3 and seqs(receiver) == [0, 1, 2]


def test_route_followed_says_whether_the_worker_points_at_the_latest_endpoint():
    route = Route("tcp://127.0.0.1:1", "a")
    assert route.current() == (0, "tcp://127.0.0.1:1", "a", 0.0)
    assert route.followed()  # nothing moved: nothing was sent anywhere else
    route.set("tcp://127.0.0.1:2", "b", linger_s=1.5)
    assert not route.followed()
    assert route.current() == (1, "tcp://127.0.0.1:2", "b", 1.5)
    route.set("tcp://127.0.0.1:3", "c")  # moved again before the worker followed the first move
    route.mark_followed(1)
    assert not route.followed()  # it points at b, the route says c
    route.mark_followed(2)
    assert route.followed() and route.current() == (2, "tcp://127.0.0.1:3", "c", 0.0)


def header(seq: int, sent_wall: float, stream: str = "cam") -> ChunkHeader:
    return ChunkHeader(stream=stream, seq=seq, fps=10.0, frame_ts=(seq * 0.5,), frame_shape=(1, 1, 3),
                       orig_size=(1, 1), letterbox=Letterbox(1.0, 0.0, 0.0),
                       tasks=(TaskRequest("det", "det-v1", (0,), 2000.0),), ready_wall=sent_wall - 0.1,
                       sent_wall=sent_wall, dropped_before=seq % 2, outage_s=0.5 * seq)


def test_the_ledger_keeps_what_was_sent_per_daemon_within_its_window_and_bound():
    now = time.time()
    ledger = SentLedger(window_s=10.0, max_per_daemon=3)
    ledger.sent("a", header(0, now - 60))  # sent long ago: past any deadline
    ledger.sent("a", header(1, now))  # ... forgotten when the next one is booked
    ledger.sent("b", header(0, now, stream="other"))
    assert ledger.count("a") == 1 and ledger.count("b") == 1
    for seq in range(2, 6):
        ledger.sent("a", header(seq, now))
    assert ledger.count("a") == 3  # at most max_per_daemon: the oldest go
    ledger.sent("a", header(9, now, stream="other"))
    assert ledger.latest("a") == {"cam": 5, "other": 9} and ledger.latest("never") == {}
    assert ledger.count("a") == 3  # latest() leaves the ledger as it is
    ledger.sent("a", header(6, now))
    taken = ledger.take("a")
    assert [(c.stream, c.seq) for c in taken] == [("cam", 5), ("other", 9), ("cam", 6)]
    assert taken[0] == SentChunk("cam", 5, (("det", "det-v1", 2000.0),), (2.5,), now - 0.1, now, 1, 2.5)
    assert ledger.take("a") == [] and ledger.count("a") == 0  # handed over once
    assert [c.stream for c in ledger.take("b")] == ["other"]  # another daemon's entries are its own
    assert ledger.take("never") == []


def test_a_sent_chunk_survives_json_on_its_way_to_the_controller():
    c = SentChunk.of(header(7, 1000.0))
    assert SentChunk.from_json(c.to_json()) == c
