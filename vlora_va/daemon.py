"""The inference daemon: receive chunks over ZeroMQ, batch requests across streams, run the engine, write results.

One thread, one loop (simple and deterministic):
    poll the PULL socket ─► decode each message (malformed: log + count, never fatal) ─► requests queue
    ─► when the batch is full or its oldest request has waited max_wait_ms: pick requests earliest
       deadline first ─► Engine.run ─► result records ─► sinks
On stop the daemon drains: it reads what is still in flight, serves every queued request and flushes sinks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import ExitStack
import dataclasses
from dataclasses import dataclass

import torch
import zmq

from .adapters import Adapter, AdapterError, load_adapter_dir
from .config import PipelineConfig
from .engine import Engine
from .metrics import DaemonMetrics
from .models import load_backbone
from .requests import Request, requests_from_chunk
from .results import error_record, result_record
from .sinks import ZmqPubSink, make_sink
from .wire import WireError, decode_chunk

log = logging.getLogger(__name__)

DRAIN_QUIET_S = 0.3  # on stop, keep reading until the socket has been quiet this long...
DRAIN_MAX_S = 30.0  # ...but stop reading new messages after this long
QUEUE_BATCHES = 2  # the request queue holds at most this many batches' worth of images


@dataclass
class DaemonStats:
    chunks: int = 0
    malformed: int = 0
    results: int = 0
    errors: int = 0
    deadline_missed: int = 0
    images: int = 0
    batches: int = 0
    ingest_dropped: int = 0
    max_queue_images: int = 0  # high-water mark of the request queue


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("daemon.device is cuda but no CUDA device is available (install a CUDA torch build)")
    return name


def load_adapters(config: PipelineConfig, hidden: int) -> tuple[dict[str, Adapter], dict[str, str]]:
    """Every configured adapter that loads, and a clear error for each one that does not."""
    loaded, failed = {}, {}
    for name, path in config.adapters.items():
        try:
            loaded[name] = load_adapter_dir(name, path, hidden)
            a = loaded[name]
            log.info("adapter %s: %s head, rank %d on %d layers, %s (%s)", name, a.task, a.rank, len(a.lora),
                     "trained" if a.trained else "UNTRAINED", path)
        except AdapterError as e:
            failed[name] = str(e)
            log.error("adapter %s not loaded: %s", name, e)
    return loaded, failed


def select_batch(queue: list[Request], max_images: int) -> list[Request]:
    """Earliest deadline first, up to max_images frames (always at least one request). Removes them from queue."""
    queue.sort(key=lambda r: (r.deadline_wall, r.ready_wall, r.stream, r.seq))
    batch, images = [], 0
    while queue and (not batch or images + queue[0].num_images <= max_images):
        images += queue[0].num_images
        batch.append(queue.pop(0))
    return batch


class Daemon:
    def __init__(self, config: PipelineConfig, engine: Engine | None = None):
        self.config = config
        d = config.daemon
        self.metrics = DaemonMetrics()
        self.stats = DaemonStats()
        self.failed_adapters: dict[str, str] = {}
        if engine is None:
            device = pick_device(d.device)
            torch.set_num_threads(d.threads or os.cpu_count() or 1)
            backbone = load_backbone(d.backbone, d.allow_download, device)
            adapters, self.failed_adapters = load_adapters(config, backbone.config.hidden_size)
            engine = Engine(backbone, adapters, d.image_size, d.max_slots, d.max_rank, device, d.premerge_max_mb)
            self.failed_adapters.update(engine.rejected)
        self.engine = engine
        self.queue: list[Request] = []
        self._last_log = time.monotonic()
        self._logged = DaemonStats()

    # ------------------------------------------------------------------ receive
    def _queued_images(self) -> int:
        return sum(r.num_images for r in self.queue)

    def _queue_full(self) -> bool:
        # Bounded: a slow daemon must leave chunks in ZeroMQ, where backpressure reaches ingest and its
        # drop policy, instead of piling them up here as latency (and memory).
        return self._queued_images() >= QUEUE_BATCHES * self.config.daemon.max_batch_images

    def _receive(self, sock: zmq.Socket, timeout_ms: int, sinks) -> int:
        """Read the messages available while the queue has room (waiting up to timeout_ms for the first).
        Returns messages read."""
        n = 0
        while not self._queue_full() and sock.poll(timeout_ms if n == 0 else 0):
            parts = sock.recv_multipart(copy=False)
            n += 1
            self._accept(parts, sinks)
        return n

    def _accept(self, parts, sinks) -> None:
        now = time.time()
        try:
            chunk = decode_chunk(parts)
        except WireError as e:
            self.stats.malformed += 1
            self.metrics.malformed.inc()
            log.error("malformed message rejected (%d parts): %s", len(parts), e)
            return
        h = chunk.header
        self.stats.chunks += 1
        self.metrics.chunks.labels(h.stream).inc()
        if h.dropped_before:
            self.stats.ingest_dropped += h.dropped_before
            self.metrics.ingest_dropped.labels(h.stream).inc(h.dropped_before)
            log.warning("stream %s: ingest dropped %d chunk(s) before chunk %d", h.stream, h.dropped_before, h.seq)
        for req in requests_from_chunk(chunk, now):
            problem = self._unservable(req)
            if problem:
                self._write_error(req, problem, sinks)
            else:
                self.queue.append(req)
        self.stats.max_queue_images = max(self.stats.max_queue_images, self._queued_images())
        self.metrics.queue_depth.set(len(self.queue))

    def _unservable(self, req: Request) -> str | None:
        if req.adapter in self.failed_adapters:
            return f"adapter {req.adapter!r} failed to load: {self.failed_adapters[req.adapter]}"
        if req.adapter not in self.engine.slots:
            return f"unknown adapter {req.adapter!r} (loaded: {', '.join(self.engine.slots) or 'none'})"
        shape = req.frames[0].shape
        if shape[0] != self.engine.image_size or shape[1] != self.engine.image_size:
            return f"frames are {shape[1]}x{shape[0]} but the daemon's image_size is {self.engine.image_size}"
        return None

    def _write_error(self, req: Request, message: str, sinks) -> None:
        self.stats.errors += 1
        self.metrics.results.labels(req.stream, req.task, "error").inc()
        log.error("stream %s chunk %d task %s: %s", req.stream, req.seq, req.task, message)
        for s in sinks:
            s.write([error_record(req, message, time.time())])

    # ------------------------------------------------------------------ serve
    def _batch_ready(self, stopping: bool) -> bool:
        if not self.queue:
            return False
        if stopping or self._queued_images() >= self.config.daemon.max_batch_images:
            return True
        oldest = min(r.received_wall for r in self.queue)
        return time.time() - oldest >= self.config.daemon.max_wait_ms / 1000.0

    def _serve_one_batch(self, sinks) -> None:
        batch = select_batch(self.queue, self.config.daemon.max_batch_images)
        t0 = time.time()
        try:
            outputs = self.engine.run(batch)
        except Exception as e:  # a bad batch must not take the daemon down
            log.exception("engine failed on a batch of %d requests", len(batch))
            for req in batch:
                self._write_error(req, f"inference failed: {type(e).__name__}: {e}", sinks)
            return
        t1 = time.time()
        records = []
        for out in outputs:
            req = out.request
            rec = result_record(req, out.result, compute_start=t0, compute_end=t1, batch_images=out.batch_images,
                                trained=self.engine.adapters[req.adapter].trained)
            records.append(rec)
            self.metrics.results.labels(req.stream, req.task, "ok").inc()
            self.metrics.latency_s.labels(req.task).observe(t1 - req.ready_wall)
            if not rec["deadline_met"]:
                self.stats.deadline_missed += 1
                self.metrics.deadline_missed.labels(req.stream, req.task).inc()
        for s in sinks:
            s.write(records)
        images = outputs[0].batch_images if outputs else 0
        self.stats.results += len(records)
        self.stats.images += images
        self.stats.batches += 1
        self.metrics.batch_images.observe(images)
        self.metrics.compute_s.observe(t1 - t0)
        self.metrics.queue_depth.set(len(self.queue))

    def _log_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        dt = now - self._last_log
        if not force and dt < self.config.daemon.log_every_s:
            return
        s, p = self.stats, self._logged
        log.info("%.1f chunks/s, %.1f results/s, %.1f images/s, %d deadline misses, %d ingest drops, "
                 "%d malformed, queue %d", (s.chunks - p.chunks) / dt, (s.results - p.results) / dt,
                 (s.images - p.images) / dt, s.deadline_missed - p.deadline_missed,
                 s.ingest_dropped - p.ingest_dropped, s.malformed - p.malformed, len(self.queue))
        self._logged = dataclasses.replace(s)
        self._last_log = now

    def _sinks(self, stack: ExitStack) -> list:
        sinks = [stack.enter_context(make_sink(c)) for c in self.config.sinks]
        if self.config.daemon.results_endpoint:
            sinks.append(stack.enter_context(ZmqPubSink(self.config.daemon.results_endpoint)))
        return sinks

    def run(self, stop: threading.Event | None = None, ready: threading.Event | None = None,
            drained: threading.Event | None = None) -> DaemonStats:
        """Serve until stop is set, then drain. `ready` is set once the socket is bound, `drained` once
        every request received has been answered and the sinks flushed (senders may disconnect then)."""
        stop = stop or threading.Event()
        d = self.config.daemon
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 4)  # small: backpressure reaches ingest, whose drop policy decides
        sock.setsockopt(zmq.RCVBUF, 1 << 20)  # the kernel buffer too: chunks hidden there are only latency
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(d.endpoint)
        if d.metrics_port:
            self.metrics.serve(d.metrics_port)
        log.info("daemon listening on %s (image %d px, %d adapter(s) loaded, %d failed)", d.endpoint,
                 d.image_size, len(self.engine.slots), len(self.failed_adapters))
        try:
            with ExitStack() as stack:
                sinks = self._sinks(stack)
                if ready is not None:
                    ready.set()
                while not stop.is_set():
                    self._receive(sock, 0 if self._batch_ready(False) else 50, sinks)
                    while self._batch_ready(False):
                        self._serve_one_batch(sinks)
                        self._receive(sock, 0, sinks)
                    self._log_progress()
                self._drain(sock, sinks)
        finally:
            sock.close()
            ctx.term()
            if drained is not None:
                drained.set()
        log.info("daemon stopped: %d chunks, %d results, %d errors, %d deadline misses, %d malformed messages",
                 self.stats.chunks, self.stats.results, self.stats.errors, self.stats.deadline_missed,
                 self.stats.malformed)
        return self.stats

    def _drain(self, sock: zmq.Socket, sinks) -> None:
        """Read what is still arriving, then serve every queued request."""
        log.info("draining: %d request(s) queued", len(self.queue))
        start = last = time.monotonic()
        while True:
            # Senders stay connected until we are drained, so what is in flight still arrives; a sender
            # that never stops is cut off after DRAIN_MAX_S.
            reading = time.monotonic() - start < DRAIN_MAX_S
            if reading and self._receive(sock, 0 if self.queue else 50, sinks):
                last = time.monotonic()
            if self.queue:
                self._serve_one_batch(sinks)
            elif not reading or time.monotonic() - last >= DRAIN_QUIET_S:
                break
        self._log_progress(force=True)
