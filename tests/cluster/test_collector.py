"""The cluster collector (vlora_va/cluster/collector.py) without Ray: a real Collector on loopback, real ZeroMQ PUSH
sockets standing in for the daemons' CollectorSinks, and the JSONL sink it writes, read back once it is closed.

Every wait is on the collector's own counters (snapshot()), with a generous time-out: never a fixed sleep."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from tests.pipeline_helpers import tiny_pipeline, write
from vlora_va.cluster.collector import Collector
from vlora_va.contracts.config import load_config
from vlora_va.ingest.route import SentChunk

WAIT_S = 30.0
SINCE_A = "2026-01-01T10:00:00.000Z"
SINCE_B = "2026-01-01T10:05:00.000Z"  # the daemon the stream moved to started counting later


class Harness:
    """A Collector writing to results.jsonl in tmp_path, and PUSH sockets named like the daemons they stand for."""

    def __init__(self, tmp_path: Path):
        # the collector loads no model: a backbone path that does not exist still makes a valid config
        cfg = tiny_pipeline(tmp_path, tmp_path / "no-backbone", {"det": tmp_path / "no-adapter"}, [{"id": "cam"}])
        self.sink = tmp_path / "results.jsonl"
        self.collector = Collector(load_config(write(tmp_path / "pipeline.yaml", cfg)))
        self.ctx = zmq.Context()
        self._socks: dict[str, zmq.Socket] = {}
        self.closed = False

    def send(self, daemon: str, *parts: bytes) -> None:
        """One raw message from `daemon`'s socket (parts as given: malformed ones too)."""
        sock = self._socks.get(daemon)
        if sock is None:
            sock = self._socks[daemon] = self.ctx.socket(zmq.PUSH)
            sock.connect(self.collector.endpoint)
        sock.send_multipart(list(parts))

    def push(self, daemon: str, *rows: dict) -> None:
        for row in rows:
            self.send(daemon, daemon.encode(), json.dumps(row).encode())

    def wait(self, **want: int) -> dict:
        """Until the collector's stats reach `want` (e.g. rows=3, duplicates=1); its snapshot then."""
        deadline = time.monotonic() + WAIT_S
        while True:
            snap = self.collector.snapshot()
            if all(snap[k] >= n for k, n in want.items()):
                return snap
            assert time.monotonic() < deadline, f"timed out waiting for {want}: {snap}"
            time.sleep(0.01)

    def finish(self) -> list[dict]:
        """Close the collector (its sinks flush) and read back every row it wrote."""
        self.close()
        return [json.loads(line) for line in self.sink.read_text().splitlines()] if self.sink.exists() else []

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for sock in self._socks.values():
            sock.close(linger=0)
        self.ctx.term()
        self.collector.close()


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.close()


def result(stream: str, chunk: int, task: str = "det") -> dict:
    ts = chunk * 0.5
    return {"v": 3, "type": "result", "stream": stream, "chunk": chunk, "task": task, "adapter": "det",
            "status": "ok", "frame_ts": [ts, ts + 0.25]}


def crossing(counts: dict, since: str, line: str = "path") -> dict:
    return {"type": "event", "event": "line_crossed", "stream": "cam", "task": "det", "line": line,
            "counts": counts, "counts_since": since}


def zone(counts: dict, since: str) -> dict:
    return {"type": "event", "event": "zone_entered", "stream": "cam", "task": "det", "zone": "lawn",
            "counts": counts, "counts_since": since}


def sent(stream: str, seq: int, tasks=("det", "act")) -> SentChunk:
    return SentChunk(stream, seq, tuple((t, t, 2000.0) for t in tasks), frame_ts=(seq * 0.5, seq * 0.5 + 0.25),
                     ready_wall=time.time() - 1.0, sent_wall=time.time() - 0.9)


def keys(rows: list[dict]) -> list[tuple]:
    return sorted((r["stream"], r["task"], r["chunk"]) for r in rows if r.get("type", "result") == "result")


def test_rows_from_two_daemons_all_arrive_once_each_stamped_with_its_daemon(harness):
    harness.push("d1", *[result("a", i) for i in range(5)])
    harness.push("d2", *[result("b", i) for i in range(5)])
    snap = harness.wait(rows=10)
    assert snap["by_daemon"] == {"d1": 5, "d2": 5} and snap["duplicates"] == 0 and snap["malformed"] == 0
    rows = harness.finish()
    assert keys(rows) == [("a", "det", i) for i in range(5)] + [("b", "det", i) for i in range(5)]
    assert all(r["daemon"] == {"a": "d1", "b": "d2"}[r["stream"]] for r in rows)


def test_a_second_row_for_the_same_chunk_and_task_is_dropped_and_counted(harness):
    harness.push("d1", result("cam", 0), result("cam", 0, task="act"))
    harness.wait(rows=2)
    harness.push("d2", result("cam", 0))  # the same (stream, task, chunk) from another daemon
    harness.push("d1", result("cam", 0, task="act"), result("cam", 1))  # ... and from the same one
    snap = harness.wait(rows=3, duplicates=2)
    assert snap["rows"] == 3 and snap["by_daemon"] == {"d1": 3}
    rows = harness.finish()
    assert keys(rows) == [("cam", "act", 0), ("cam", "det", 0), ("cam", "det", 1)]
    assert {r["daemon"] for r in rows} == {"d1"}  # the first row of each key is the one kept


def test_a_lost_daemon_gets_an_error_row_for_each_chunk_and_task_it_never_answered(harness):
    harness.push("d1", result("cam", 0), result("cam", 1), result("cam", 1, task="act"))
    harness.wait(rows=3)
    written = harness.collector.lost("d1", [sent("cam", 0), sent("cam", 1), sent("cam", 2)])
    assert written == 3  # (0, act), (2, det), (2, act): the answered ones get none
    assert harness.collector.snapshot()["lost"] == 3
    harness.push("d1", result("cam", 2))  # the dead daemon's last packet, after its lost row: dropped
    snap = harness.wait(duplicates=1)
    assert snap["rows"] == 6
    rows = harness.finish()
    assert keys(rows) == [("cam", t, c) for t, c in [("act", 0), ("act", 1), ("act", 2), ("det", 0), ("det", 1),
                                                     ("det", 2)]]
    lost = sorted((r["chunk"], r["task"]) for r in rows if r["status"] == "error")
    assert lost == [(0, "act"), (2, "act"), (2, "det")]
    for r in rows:
        if r["status"] == "error":
            assert r["reason"] == "daemon lost: d1" and r["daemon"] == "d1" and r["deadline_met"] is False
            assert r["frame_ts"] == [r["chunk"] * 0.5, r["chunk"] * 0.5 + 0.25]


def test_malformed_messages_are_counted_and_the_collector_goes_on(harness):
    harness.send("d1", b"d1")  # one part
    harness.send("d1", b"d1", b"{not json")
    harness.send("d1", b"d1", b"[1, 2]")  # JSON, but not a row
    harness.send("d1", b"d1", json.dumps(result("cam", 0)).encode(), b"extra")  # three parts
    harness.push("d1", result("cam", 1))
    snap = harness.wait(rows=1)  # one socket keeps its order: the bad ones were read before
    assert snap["malformed"] == 4 and snap["rows"] == 1
    assert keys(harness.finish()) == [("cam", "det", 1)]


def test_counts_continue_across_the_daemons_a_stream_moved_between(harness):
    harness.push("A", crossing({"in": {"person": 1}, "out": {}}, SINCE_A),
                 crossing({"in": {"person": 2}, "out": {"person": 1}}, SINCE_A),
                 zone({"inside": {"person": 1}, "entered": {"person": 2}, "left": {"person": 1}}, SINCE_A))
    harness.wait(rows=3)
    # the stream moved to B: B counts from zero, since it started
    harness.push("B", crossing({"in": {"person": 1}, "out": {}}, SINCE_B),
                 crossing({"in": {"person": 2, "bike": 1}, "out": {}}, SINCE_B),
                 zone({"inside": {"person": 1}, "entered": {"person": 1}, "left": {}}, SINCE_B))
    harness.wait(rows=6)
    rows = harness.finish()
    lines = [r for r in rows if r.get("line") == "path"]
    assert [r["counts"] for r in lines] == [
        {"in": {"person": 1}, "out": {}},
        {"in": {"person": 2}, "out": {"person": 1}},
        {"in": {"person": 3}, "out": {"person": 1}},  # A's last (2, 1) + B's current (1, 0)
        {"in": {"person": 4, "bike": 1}, "out": {"person": 1}},
    ]
    assert [r["counts_since"] for r in lines] == [SINCE_A] * 4  # the totals still count from A's start
    zones = [r for r in rows if r.get("zone") == "lawn"]
    assert zones[-1]["counts"] == {"inside": {"person": 1}, "entered": {"person": 3}, "left": {"person": 1}}
    assert zones[-1]["counts_since"] == SINCE_A  # "inside" is B's alone: who is in the zone now
    assert [r["daemon"] for r in lines] == ["A", "A", "B", "B"]


def test_a_controller_event_is_placed_at_the_streams_latest_media_time(harness):
    harness.push("d1", result("cam", 10), result("cam", 11))
    harness.wait(rows=2)
    harness.collector.event({"type": "event", "event": "stream_moved", "stream": "cam", "ts": None, "to": "d2"})
    harness.collector.event({"type": "event", "event": "stream_moved", "stream": "quiet", "ts": 1.5, "to": "d2"})
    rows = harness.finish()
    moved = {r["stream"]: r for r in rows if r.get("event") == "stream_moved"}
    assert moved["cam"]["ts"] == 11 * 0.5 + 0.25  # frame_ts[-1] of chunk 11, its latest row
    assert moved["quiet"]["ts"] == 1.5  # no row of that stream yet: the controller's own ts stays
    assert "daemon" not in moved["cam"]  # the controller's rows are no daemon's
