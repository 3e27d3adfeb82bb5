"""The daemon over real ZeroMQ sockets, with a tiny random-weight backbone."""

import json
import threading
import time

import numpy as np
import pytest
import zmq

from vlora_va.config import parse_config
from vlora_va.daemon import Daemon, select_batch
from vlora_va.wire import ChunkHeader, Letterbox, TaskRequest, encode_chunk

from .conftest import TINY_IMAGE


def config(tmp_path, backbone, adapters, **daemon):
    opts = "".join(f"\n  {k}: {v}" for k, v in daemon.items())
    text = f"""
daemon:
  endpoint: ipc://{tmp_path}/daemon.sock
  backbone: {backbone}
  image_size: {TINY_IMAGE}
  threads: 1
  max_wait_ms: 5{opts}
adapters:
""" + "".join(f"  {n}: {p}\n" for n, p in adapters.items()) + f"""
streams:
  - id: cam
    source: unused.mp4
    tasks:
      - adapter: {next(iter(adapters))}
sinks:
  - type: jsonl
    path: {tmp_path}/results.jsonl
"""
    return parse_config(text, "test.yaml", tmp_path)


def chunk_parts(stream, seq, tasks, n_frames=2, side=TINY_IMAGE, deadline_s=30.0):
    now = time.time()
    rng = np.random.default_rng(seq)
    frames = [rng.integers(0, 255, (side, side, 3), dtype=np.uint8) for _ in range(n_frames)]
    header = ChunkHeader(stream=stream, seq=seq, fps=10.0, frame_ts=tuple(seq + 0.1 * i for i in range(n_frames)),
                         frame_shape=(side, side, 3), orig_size=(640, 480),
                         letterbox=Letterbox(side / 640, 0.0, (side - 480 * side / 640) / 2),
                         tasks=tuple(TaskRequest(name, adapter, tuple(range(n_frames)), now + deadline_s)
                                     for name, adapter in tasks),
                         ready_wall=now, sent_wall=now)
    return encode_chunk(header, frames)


class RunningDaemon:
    def __init__(self, cfg):
        self.cfg = cfg
        self.daemon = Daemon(cfg)
        self.stop, ready, self.drained = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.daemon.run, args=(self.stop, ready, self.drained), daemon=True)
        self.thread.start()
        assert ready.wait(30), "daemon did not start"
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(cfg.daemon.endpoint)

    def send(self, parts):
        self.push.send_multipart(parts, copy=False)

    def finish(self):
        # Like an ingest worker: stay connected until the daemon has drained (ZeroMQ drops what is still
        # in flight to a throttled receiver when the sender disconnects).
        self.stop.set()
        assert self.drained.wait(120), "daemon did not drain"
        self.push.close(linger=0)
        self.ctx.term()
        self.thread.join(60)
        assert not self.thread.is_alive()
        with open(self.cfg.sinks[0].path) as f:
            return [json.loads(line) for line in f]


@pytest.fixture
def running(tmp_path, tiny_backbone_dir, tiny_adapters):
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, tiny_adapters))
    yield d
    d.stop.set()


def test_serves_chunks_from_several_streams_in_order(running):
    for seq in range(4):
        for stream in ("a", "b"):
            running.send(chunk_parts(stream, seq, [("det", "detect"), ("act", "actions")]))
    rows = running.finish()
    assert len(rows) == 16 and not any("error" in r for r in rows)
    for stream in ("a", "b"):
        for task in ("det", "act"):
            mine = [r for r in rows if r["stream"] == stream and r["task"] == task]
            assert [r["chunk"] for r in mine] == [0, 1, 2, 3]
    det = next(r for r in rows if r["task"] == "det")
    assert det["untrained"] is True and len(det["frames"]) == 2 and det["frame_ts"] == [0.0, 0.1]
    act = next(r for r in rows if r["task"] == "act")
    assert act["label"] in ("standing", "walking")
    for r in rows:
        lat = r["latency_ms"]
        assert 0 <= lat["queue"] and 0 < lat["compute"] <= lat["total"] < 60_000
        assert r["deadline_met"] is True and r["deadline_ms"] == pytest.approx(30_000, abs=1)


def test_malformed_messages_are_logged_and_counted_never_fatal(running, caplog):
    good = lambda seq: chunk_parts("cam", seq, [("det", "detect")])
    running.send(good(0))
    running.send([b"{not json"])
    truncated = good(1)
    truncated[2] = truncated[2][:-100]
    running.send(truncated)
    running.send([good(2)[0]])  # header only: frames missing
    running.send(chunk_parts("cam", 3, [("det", "nosuch")]))  # unknown adapter
    running.send(chunk_parts("cam", 4, [("det", "detect")], side=28))  # wrong model image size
    running.send(good(5))
    rows = running.finish()
    assert running.daemon.stats.malformed == 3
    ok = [r for r in rows if "error" not in r]
    assert [r["chunk"] for r in ok] == [0, 5]
    errors = {r["chunk"]: r["error"] for r in rows if "error" in r}
    assert "unknown adapter 'nosuch'" in errors[3]
    assert "frames are 28x28 but the daemon's image_size is 56" in errors[4]
    assert "malformed message rejected" in caplog.text


def test_queue_is_bounded_so_backpressure_reaches_the_sender(tmp_path, tiny_backbone_dir, tiny_adapters):
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, tiny_adapters, max_batch_images=4))
    for seq in range(30):  # far more than the daemon can hold: it must leave them in ZeroMQ
        d.send(chunk_parts("cam", seq, [("det", "detect")]))
    rows = d.finish()
    assert sorted(r["chunk"] for r in rows) == list(range(30))  # nothing lost...
    assert 0 < d.daemon.stats.max_queue_images <= 2 * 4 + 2  # ...and never more than two batches queued (+1 chunk)


def test_stop_drains_every_received_chunk(running):
    for seq in range(10):
        running.send(chunk_parts("cam", seq, [("det", "detect"), ("act", "actions")], n_frames=3))
    rows = running.finish()  # stop right after sending: all 20 requests must still be answered
    assert sorted((r["chunk"], r["task"]) for r in rows) == sorted((s, t) for s in range(10) for t in ("det", "act"))


def test_missing_adapter_is_reported_and_the_others_keep_working(tmp_path, tiny_backbone_dir, tiny_adapters):
    adapters = {"detect": tiny_adapters["detect"], "gone": tmp_path / "no-such-adapter"}
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, adapters))
    d.send(chunk_parts("cam", 0, [("det", "detect"), ("x", "gone")]))
    rows = d.finish()
    by_task = {r["task"]: r for r in rows}
    assert "error" not in by_task["det"]
    assert "adapter 'gone' failed to load" in by_task["x"]["error"] and "does not exist" in by_task["x"]["error"]


def test_adapter_for_another_backbone_is_rejected_alone(tmp_path, tiny_backbone_dir, tiny_adapters):
    from .conftest import make_adapter

    alien = make_adapter(tmp_path / "alien", "detection", ["person"], targets=("attention.qkv",), nonzero=False)
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"], "alien": alien}))
    d.send(chunk_parts("cam", 0, [("det", "detect"), ("x", "alien")]))
    rows = d.finish()
    by_task = {r["task"]: r for r in rows}
    assert "error" not in by_task["det"]
    assert "not a linear layer of this backbone" in by_task["x"]["error"]


def test_expired_deadline_is_reported_as_missed(running):
    running.send(chunk_parts("cam", 0, [("det", "detect")], deadline_s=-1.0))
    (row,) = running.finish()
    assert row["deadline_met"] is False


def test_select_batch_is_earliest_deadline_first_within_the_image_limit():
    from vlora_va.requests import Request

    def req(seq, deadline, n):
        return Request("s", seq, "t", "a", [None] * n, [0.0] * n, Letterbox(1, 0, 0), (1, 1), 0.0, 0.0, deadline)

    queue = [req(0, 5.0, 4), req(1, 1.0, 4), req(2, 3.0, 4), req(3, 2.0, 8)]
    batch = select_batch(queue, 8)
    assert [r.seq for r in batch] == [1]  # the next (8 images) does not fit beside it
    assert [r.seq for r in select_batch(queue, 8)] == [3]
    assert [r.seq for r in select_batch(queue, 8)] == [2, 0]
    assert select_batch([req(9, 1.0, 20)], 8)[0].seq == 9  # an oversized request still runs alone


def test_prometheus_metrics_count_what_happened(tmp_path, tiny_backbone_dir, tiny_adapters):
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, tiny_adapters, metrics_port=port))
    d.send(chunk_parts("cam", 0, [("det", "detect")]))
    d.send([b"garbage"])
    d.send(chunk_parts("cam", 1, [("det", "detect")], deadline_s=-1.0))
    deadline = time.monotonic() + 30
    while d.daemon.stats.results < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    d.finish()
    assert 'vlora_chunks_received_total{stream="cam"} 2.0' in text
    assert "vlora_messages_malformed_total 1.0" in text
    assert 'vlora_results_total{status="ok",stream="cam",task="det"} 2.0' in text
    assert 'vlora_deadline_missed_total{stream="cam",task="det"} 1.0' in text
