"""The inference daemon: moves data between transport, scheduler, engine and sinks; decides nothing itself.

    transport (own thread: receive, decode, validate) ─► requests ─► admission (overload control)
    ─► scheduler (queue, credits, deadlines, shedding, mode) ─► BatchPlan ─► engine.execute(plan)
    ─► result records (ok / shed / error: every request gets exactly one) ─► sinks

Start-up: load the backbone and adapters, measure (or load the cached) cost profile, warm up every plan
key the policy can produce, say whether the configured load fits this machine, then report ready. On stop
the daemon drains: it reads what is still in flight, answers every request it holds and flushes the sinks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from contextlib import ExitStack

import torch

from contracts.config import PipelineConfig
from contracts.requests import Request
from contracts.results import not_served, served

from . import costs as C
from .adapters import Adapter, AdapterError, load_adapter_dir
from .admission import estimate
from .engine import Engine
from .lora import LoRAMode
from .metrics import DaemonMetrics, Totals
from .models import load_backbone
from .plan import BatchPlan
from .scheduling import POLICIES, OverloadControl, Settings, Shed
from .sinks import ZmqPubSink, make_sink
from .transport import Malformed, Received, Transport

log = logging.getLogger(__name__)

DRAIN_QUIET_S = 0.3  # on stop, keep reading until the socket has been quiet this long...
DRAIN_MAX_S = 30.0  # ...but stop reading new messages after this long
QUEUE_BATCHES = 4  # the daemon holds at most this many batches' worth of images (memory bound)
IDLE_WAIT_S = 0.05


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


def build_engine(config: PipelineConfig) -> tuple[Engine, dict[str, str]]:
    """The engine for a pipeline, and the adapters that could not be served (name -> why)."""
    d = config.daemon
    device = pick_device(d.device)
    torch.set_num_threads(d.threads or os.cpu_count() or 1)
    backbone = load_backbone(d.backbone, d.allow_download, device)
    adapters, failed = load_adapters(config, backbone.config.hidden_size)
    engine = Engine(backbone, adapters, d.image_size, d.max_slots, d.max_rank, device, d.premerge_max_mb,
                    d.max_batch_images)
    failed.update(engine.rejected)
    return engine, failed


def cost_model(config: PipelineConfig, engine: Engine) -> C.CostModel:
    """The cost profile for this engine on this machine: the cached one, or measured now (and cached)."""
    catalog = engine.catalog()
    ranks = {n: a.rank for n, a in engine.adapters.items()}
    modes = C.MEASURED_MODES[config.daemon.policy]
    key = C.profile_key(engine.device, config.daemon.backbone, engine.backbone, catalog, ranks, modes)
    return C.CostModel(C.load_or_measure(engine, catalog, key, C.profile_dir(config.daemon.profile_cache), modes))


class Daemon:
    def __init__(self, config: PipelineConfig, engine: Engine | None = None, costs: C.CostModel | None = None):
        self.config = config
        d = config.daemon
        self.metrics = DaemonMetrics()
        self.failed_adapters: dict[str, str] = {}
        if engine is None:
            engine, self.failed_adapters = build_engine(config)
        self.engine = engine
        self.catalog = engine.catalog()
        self.costs = costs or cost_model(config, engine)
        settings = Settings(d.max_batch_images, d.max_wait_ms / 1000.0, d.starvation_ms / 1000.0)
        self.scheduler = POLICIES[d.policy](self.catalog, self.costs, settings, engine.weights_slot)
        self.overload = OverloadControl(d.degrade)
        self.warmed: set = set()
        self.estimate = estimate(config, self.catalog, self.costs) if self.catalog.adapters else None
        self._last_log = time.monotonic()
        self._logged = Totals()
        self._causes: dict[int, str] = {}

    @property
    def stats(self) -> Totals:
        return self.metrics.totals

    # ------------------------------------------------------------------ start-up
    def warm_up(self) -> None:
        """Every plan key the policy can produce, once: ready is reported only after this."""
        t0 = time.perf_counter()
        modes = {}
        for size in self.catalog.sizes:
            slot = next(a.slot for a in self.catalog.adapters.values() if a.size == size)
            modes[size] = self.scheduler.warmup_modes(slot)
        cuda = self.engine.device.type == "cuda"
        self.warmed = C.warm_up(self.engine, self.catalog, modes, C.batch_sizes(self.engine.device,
                                self.catalog.max_batch_images), bucketed=cuda)
        self.engine.switch(LoRAMode("premerged") if self.catalog.can_premerge else LoRAMode("unmerged"))
        self.scheduler.weights_slot = self.engine.weights_slot
        log.info("warmed up %d plan keys in %.1f s", len(self.warmed), time.perf_counter() - t0)

    # ------------------------------------------------------------------ receive
    def _accept(self, item, sinks) -> None:
        if isinstance(item, Malformed):
            self.metrics.malformed()
            log.error("malformed message rejected (%d parts): %s", item.parts, item.reason)
            return
        assert isinstance(item, Received)
        self.metrics.chunk(item.stream, len(item.requests), item.dropped_before)
        if item.dropped_before:
            log.warning("stream %s: ingest dropped %d chunk(s) before chunk %d", item.stream, item.dropped_before,
                        item.seq)
        rows = []
        now = time.time()
        for req in item.requests:
            problem = self._unservable(req)
            if problem:
                rows.append((not_served(req, "error", problem, now), None))
                continue
            if req.best_effort:  # not live: never shed; the transport's backpressure paces its source
                self.scheduler.add(req)
                continue
            info = self.catalog.adapters[req.adapter]
            mode = LoRAMode("premerged") if self.catalog.can_premerge else LoRAMode("unmerged")
            cost = self.costs.image_s(info.size, mode) * req.num_images
            admitted = self.overload.admit(req, cost, now, info.min_frames)
            if admitted.request is None:
                rows.append((not_served(req, "shed", admitted.reason, now), "overload"))
                continue
            if admitted.thinned_from:
                admitted.request.degraded = admitted.reason
            self.scheduler.add(admitted.request)
        self._write(rows, sinks)

    def _unservable(self, req: Request) -> str | None:
        if req.adapter in self.failed_adapters:
            return f"adapter {req.adapter!r} failed to load: {self.failed_adapters[req.adapter]}"
        if req.adapter not in self.catalog.adapters:
            return f"unknown adapter {req.adapter!r} (loaded: {', '.join(self.catalog.adapters) or 'none'})"
        shape = req.frames[0].shape
        if shape[0] != self.engine.image_size or shape[1] != self.engine.image_size:
            return f"frames are {shape[1]}x{shape[0]} but the daemon's image_size is {self.engine.image_size}"
        return None

    # ------------------------------------------------------------------ serve
    def _write(self, rows: list, sinks) -> None:
        if not rows:
            return
        for rec, cause in rows:
            self.metrics.row(rec, cause)
            if rec.status == "error":
                log.error("stream %s chunk %d task %s: %s", rec.stream, rec.chunk, rec.task, rec.reason)
        records = [rec for rec, _ in rows]
        for s in sinks:
            s.write(records)

    def _shed_rows(self, shed: list[Shed]) -> list:
        now = time.time()
        return [(not_served(s.request, "shed", s.reason, now), s.cause) for s in shed]

    def _mode_label(self, mode: LoRAMode) -> str:
        if mode.slot is None:
            return str(mode)
        name = next(n for n, a in self.catalog.adapters.items() if a.slot == mode.slot)
        return f"{mode.kind}:{name}" + ("" if mode.impl == "atmm" else f"/{mode.impl}")

    def _execute(self, plan: BatchPlan, sinks) -> None:
        before = self.engine.weights_slot
        t0 = time.time()
        try:
            payloads = self.engine.execute(plan)
        except Exception as e:  # a bad batch must not take the daemon down
            log.exception("engine failed on a batch of %d requests", len(plan.requests))
            self.scheduler.weights_slot = self.engine.weights_slot
            now = time.time()
            self._write([(not_served(r, "error", f"inference failed: {type(e).__name__}: {e}", now), None)
                         for r in plan.requests], sinks)
            return
        t1 = time.time()
        self.costs.observe(plan.raw_s, t1 - t0)
        label = self._mode_label(plan.mode)
        rows = [(served(r, p, compute_start=t0, compute_end=t1, batch_images=plan.images, mode=label,
                        trained=self.catalog.adapters[r.adapter].trained), None)
                for r, p in zip(plan.requests, payloads)]
        self.metrics.batch(label, plan.images, t1 - t0, switched=before != self.engine.weights_slot)
        self._write(rows, sinks)

    def _step(self, transport: Transport, sinks, stopping: bool) -> int:
        """Take what arrived, then run one batch if one is due. Returns the items taken."""
        now = time.time()
        wait = 0.0 if self.scheduler.ready(now, stopping) else self._wait_s(now)
        items = transport.take(wait)
        for item in items:
            self._accept(item, sinks)
        now = time.time()
        if self.scheduler.ready(now, stopping):
            plan, shed = self.scheduler.next_plan(now)
            self._write(self._shed_rows(shed), sinks)
            if plan is not None:
                self._execute(plan, sinks)
        transport.held_images = self.scheduler.queued_images
        self._gauges()
        self._log_progress()
        return len(items)

    def _wait_s(self, now: float) -> float:
        if not self.scheduler.queue:
            return IDLE_WAIT_S
        oldest = min(r.received for r in self.scheduler.queue)
        return min(IDLE_WAIT_S, max(0.0, oldest + self.scheduler.settings.max_wait_s - now))

    def _gauges(self) -> None:
        m = self.metrics
        m.queue(len(self.scheduler.queue), self.scheduler.queued_images)
        m.correction.set(self.costs.correction)
        now = time.time()
        m.offered_load.set(self.overload.load(now))
        for tier, f in self.overload.fractions.items():
            m.degraded.labels(str(tier)).set(f)

    def _log_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        dt = now - self._last_log
        if not force and dt < self.config.daemon.log_every_s:
            return
        s, p = self.stats, self._logged
        log.info("%.1f chunks/s, %.1f results/s, %.1f images/s, %d shed, %d deadline misses, %d errors, "
                 "%d ingest drops, %d malformed, %d mode switches, queue %d, offered load %.2f s/s, cost x%.2f",
                 (s.chunks - p.chunks) / dt, (s.ok - p.ok) / dt, (s.images - p.images) / dt, s.shed - p.shed,
                 s.deadline_missed - p.deadline_missed, s.errors - p.errors, s.ingest_dropped - p.ingest_dropped,
                 s.malformed - p.malformed, s.switches - p.switches, len(self.scheduler.queue),
                 self.overload.load(time.time()), self.costs.correction)
        self._logged = dataclasses.replace(s, shed_by=dict(s.shed_by))
        self._last_log = now

    def _sinks(self, stack: ExitStack) -> list:
        sinks = [stack.enter_context(make_sink(c)) for c in self.config.sinks]
        if self.config.daemon.results_endpoint:
            sinks.append(stack.enter_context(ZmqPubSink(self.config.daemon.results_endpoint)))
        return sinks

    def run(self, stop: threading.Event | None = None, ready: threading.Event | None = None,
            drained: threading.Event | None = None) -> Totals:
        """Serve until stop is set, then drain. `ready` is set once warmed up and listening, `drained` once
        every request received has been answered and the sinks flushed (senders may disconnect then)."""
        stop = stop or threading.Event()
        d = self.config.daemon
        if not self.warmed:
            self.warm_up()
        if self.estimate is not None:
            (log.info if self.estimate.fits else log.warning)("capacity: %s", self.estimate.message)
        transport = Transport(d.endpoint, d.image_size, QUEUE_BATCHES * d.max_batch_images)
        try:
            if d.metrics_port:
                self.metrics.serve(d.metrics_port)
            with ExitStack() as stack:
                sinks = self._sinks(stack)
                transport.start()
                log.info("daemon ready on %s (policy %s, image %d px, %d adapter(s) loaded, %d failed)",
                         d.endpoint, d.policy, d.image_size, len(self.catalog.adapters), len(self.failed_adapters))
                if ready is not None:
                    ready.set()
                while not stop.is_set():
                    self._step(transport, sinks, stopping=False)
                self._drain(transport, sinks)
        finally:
            transport.close()
            if drained is not None:
                drained.set()
        s = self.stats
        log.info("daemon stopped: %d chunks, %d requests, %d results, %d shed, %d errors, %d deadline misses, "
                 "%d malformed messages", s.chunks, s.requests, s.ok, s.shed, s.errors, s.deadline_missed,
                 s.malformed)
        return s

    def _drain(self, transport: Transport, sinks) -> None:
        """Read what is still arriving, then answer every queued request."""
        log.info("draining: %d request(s) queued", len(self.scheduler.queue))
        start = time.monotonic()
        while True:
            # Senders stay connected until we are drained, so what is in flight still arrives; a sender
            # that never stops is cut off after DRAIN_MAX_S.
            reading = time.monotonic() - start < DRAIN_MAX_S
            if not reading:
                transport.pause()
            self._step(transport, sinks, stopping=True)
            quiet = time.monotonic() - transport.last_read >= DRAIN_QUIET_S
            if not self.scheduler.queue and (quiet or not reading) and not transport.take(0):
                break
        self._log_progress(force=True)
