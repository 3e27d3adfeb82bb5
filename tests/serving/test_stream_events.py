"""Stream events through a real daemon: a camera that goes dark is a stream_offline event and its return a
stream_online event (real RTSP server, real ingest worker, real ZeroMQ, tiny backbone), and a file that ended is
not offline."""

import json
import threading
import time

from tests.conftest import BIKES
from tests.ingest.ingest_helpers import WorkerThread
from vlora_va.contracts.config import parse_config
from vlora_va.contracts.wire import HEARTBEAT_S
from vlora_va.contracts.results import is_result
from vlora_va.outputs.attach import run_with_outputs
from vlora_va.serving.daemon import Daemon
from vlora_va.serving.transport import POLL_MS
from vlora_va.testing.tiny import TINY_IMAGE

# What a busy 2-core machine may add between a camera's last frame and the offline event (ingest's decoder noticing,
# a heartbeat, the daemon's loop, under `make test`'s other work). Measured: 20 runs under two spinning processes
# (docs/benchmarks.md, "Timed tests under load").
LOAD_SLACK_S = 2.0


def config(tmp_path, backbone, adapters, source: str, offline_after_s: float = 1.0):
    text = f"""
daemon:
  endpoint: ipc://{tmp_path}/daemon.sock
  backbone: {backbone}
  image_size: {TINY_IMAGE}
  threads: 1
  max_wait_ms: 5
  http_port: 0
  profile_cache: {tmp_path}/profiles
ingest:
  reconnect_initial_s: 0.2
  reconnect_max_s: 0.5
adapters:
  detect: {adapters["detect"]}
streams:
  - id: cam
    source: {source}
    fps: 5
    realtime: true
    offline_after_s: {offline_after_s}
    tasks:
      - {{adapter: detect, frames_per_chunk: 1, deadline_ms: 5000}}
sinks:
  - type: jsonl
    path: {tmp_path}/rows.jsonl
"""
    return parse_config(text, "test.yaml", tmp_path)


def events(cfg) -> list[dict]:
    try:
        lines = open(cfg.sinks[0].options.path).read().splitlines()
    except FileNotFoundError:
        return []
    return [r for line in lines if line.strip() and (r := json.loads(line)).get("type") == "event"]


def wait_for(what, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.05)
    return False


class Served:
    """A daemon with its sinks, and an ingest worker feeding it."""

    def __init__(self, cfg):
        self.daemon = Daemon(cfg)
        self.stop, self.ready, self.drained = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=run_with_outputs, args=(self.daemon, self.stop, self.ready, self.drained),
                                       daemon=True)
        self.thread.start()
        assert self.ready.wait(60), "daemon did not start"
        self.worker = WorkerThread(cfg)
        self.worker.start()

    def finish(self):
        self.worker.stop_event.set()
        self.stop.set()
        assert self.drained.wait(60)
        self.worker.finish(30)
        self.thread.join(30)


def test_a_camera_that_goes_dark_is_offline_and_its_return_online(tmp_path, tiny_backbone_dir, tiny_adapters,
                                                                  rtsp_server):
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters, rtsp_server.url)
    run = Served(cfg)
    try:
        rows = lambda: [r for r in map(json.loads, open(cfg.sinks[0].options.path)) if is_result(r)]  # noqa: E731
        assert wait_for(lambda: len(rows()) >= 2, 60), "no rows from the camera"
        assert events(cfg) == []  # a camera delivering frames is online, and starting online is no event
        rtsp_server.kill()
        killed = time.time()
        assert wait_for(lambda: [e["event"] for e in events(cfg)] == ["stream_offline"], 30), events(cfg)
        offline = events(cfg)[0]
        assert offline["phase"] == "start" and offline["stream"] == "cam" and offline["id"]
        # offline_after_s after the last frame, noticed at the next heartbeat and the daemon's next loop (it polls
        # every POLL_MS), plus what a busy machine adds (LOAD_SLACK_S)
        bound = cfg.streams[0].offline_after_s + HEARTBEAT_S + POLL_MS / 1000 + LOAD_SLACK_S
        assert time.time() - killed < bound, (time.time() - killed, bound)
        rtsp_server.start()
        assert wait_for(lambda: [e["event"] for e in events(cfg)] == ["stream_offline", "stream_online"], 60), \
            events(cfg)
        online = events(cfg)[1]
        assert online["phase"] == "end" and online["id"] != offline["id"]
        assert online["captured_at"] > offline["captured_at"]
    finally:
        run.finish()


def test_a_file_that_ended_is_not_offline(tmp_path, tiny_backbone_dir, tiny_adapters):
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters, str(BIKES), offline_after_s=1.0)
    run = Served(cfg)
    try:
        assert wait_for(lambda: run.worker.flushed.is_set(), 60), "the file did not end"
        ended = time.monotonic()
        # the worker has said "ended" and then keeps quiet: well past offline_after_s, no event (nor while the
        # file played: its frames came every 0.2 s)
        assert not wait_for(lambda: events(cfg), 3.0), events(cfg)
        assert time.monotonic() - ended >= 3.0
    finally:
        run.finish()
