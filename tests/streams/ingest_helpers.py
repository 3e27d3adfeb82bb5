"""Helpers for the ingest tests: small pipeline configs, a real PULL receiver, a worker
in a thread."""

from __future__ import annotations

import threading
import time

import zmq

from contracts.config import DaemonConfig, IngestConfig, PipelineConfig, StreamConfig, TaskConfig
from contracts.wire import Chunk, decode_chunk

IMAGE_SIZE = 112  # small model frames keep the tests fast


def tasks(*spec: tuple[str, int, float]) -> tuple[TaskConfig, ...]:
    """tasks(("det", 2, 500.0), ...) -> TaskConfigs whose adapter is named like the task."""
    return tuple(TaskConfig(name=n, adapter=n, frames_per_chunk=k, deadline_ms=d) for n, k, d in spec)


DEFAULT_TASKS = tasks(("det", 2, 500.0), ("act", 4, 1000.0))


def stream(id: str, source, **kw) -> StreamConfig:
    kw.setdefault("realtime", False)
    kw.setdefault("tasks", DEFAULT_TASKS)
    return StreamConfig(id=id, source=str(source), **kw)


def pipeline(endpoint: str, *streams: StreamConfig, **ingest) -> PipelineConfig:
    return PipelineConfig(daemon=DaemonConfig(endpoint=endpoint, image_size=IMAGE_SIZE), ingest=IngestConfig(**ingest),
                          adapters={}, streams=streams, sinks=())


class Receiver:
    """The daemon's side of the wire: a PULL socket bound on loopback that decodes every message."""

    def __init__(self, ctx: zmq.Context, rcvhwm: int = 1000, rcvbuf: int = -1):
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.RCVBUF, rcvbuf)  # -1: the OS default (autotuned, megabytes)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.chunks: list[Chunk] = []
        self.received_wall: list[float] = []

    def receive(self, timeout: float) -> Chunk | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        chunk = decode_chunk(self.sock.recv_multipart(copy=False))
        self.chunks.append(chunk)
        self.received_wall.append(time.time())
        return chunk

    def drain(self, worker: "WorkerThread", timeout: float, delay: float = 0.0) -> list[Chunk]:
        """Receive until the worker has ended and nothing more arrives (at most `timeout` seconds).
        `delay` sleeps after each message: a slow daemon."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.receive(0.2)
            if got is not None and delay:
                time.sleep(delay)
            if got is None and (worker.flushed.is_set() or not worker.is_alive()):
                break
        worker.release.set()  # like the daemon's "drained": everything sent has been read
        return self.chunks

    def by_stream(self) -> dict[str, list[Chunk]]:
        out: dict[str, list[Chunk]] = {}
        for c in self.chunks:
            out.setdefault(c.header.stream, []).append(c)
        return out


class WorkerThread(threading.Thread):
    """run_ingest in a background thread (like the CLI's worker process, without the process)."""

    def __init__(self, config: PipelineConfig, stream_ids=None):
        super().__init__(daemon=True, name="test-ingest-worker")
        self.config, self.stream_ids = config, stream_ids
        self.stop_event = threading.Event()
        self.flushed, self.release = threading.Event(), threading.Event()
        self.stats: dict | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from streams.worker import run_ingest

        try:
            self.stats = run_ingest(self.config, self.stream_ids, self.stop_event, self.flushed, self.release)
        except BaseException as e:  # surfaced by finish()
            self.error = e

    def finish(self, timeout: float = 15.0) -> dict:
        self.release.set()
        self.join(timeout)
        assert not self.is_alive(), f"ingest worker still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.stats
