"""The inference daemon: moves data between its parts and decides nothing itself.

    transport (own thread: receive, decode, validate) ─► admission ─► scheduler ─► BatchPlan ─► engine.execute
    ─► rows (every request gets exactly one: ok, shed or error) ─► sinks

One loop round: apply queued adapter operations (adapter_slots.py), take what arrived (transport.py), admit it
(admission.py), let the scheduler plan one batch when one is due (scheduling/), execute it (the engine) and hand
its rows on (rows.py), then the gauges and the log (status.py).

Start-up (startup.py): load the backbone and adapters, measure (or load the cached) cost profile, warm up every
plan key the policy can produce, say whether the configured load fits this machine, then report ready. On stop the
daemon drains: it reads what is still in flight, answers every request it holds and flushes the sinks. Sinks and
the HTTP server are attached from outside (vlora_va/outputs/attach.py): the daemon only writes to what it is given.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from contextlib import ExitStack
from typing import Callable

import zmq

from vlora_va.common.logs import Throttle
from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.plugins import POLICIES
from vlora_va.engine.executor import Engine
from vlora_va.engine.modes import LoRAMode
from vlora_va.engine.plan import BatchPlan, Catalog
from vlora_va.serving.adapter_slots import AdapterSlots
from vlora_va.serving.admission import Admission
from vlora_va.serving.capacity import estimate
from vlora_va.serving.control import ControlServer, control_endpoint
from vlora_va.serving.costs import CostModel
from vlora_va.serving.prometheus import DaemonMetrics, Totals
from vlora_va.serving.rows import RowWriter
from vlora_va.serving.scheduling import Settings
from vlora_va.serving.startup import build_engine, cost_model, warm_up
from vlora_va.serving.status import Reporter
from vlora_va.serving.transport import Heard, Malformed, Received, Transport

log = logging.getLogger(__name__)

DRAIN_QUIET_S = 0.3  # on stop, keep reading until the socket has been quiet this long...
DRAIN_MAX_S = 30.0  # ...but stop reading new messages after this long
QUEUE_BATCHES = 4  # the daemon holds at most this many batches' worth of images (memory bound)
IDLE_WAIT_S = 0.05

OpenSinks = Callable[[ExitStack], list]  # enters the sinks on the stack, returns them


class Daemon:
    def __init__(self, config: PipelineConfig, engine: Engine | None = None, costs: CostModel | None = None):
        self.config = config
        d = config.daemon
        self.metrics = DaemonMetrics()
        failed: dict[str, str] = {}
        if engine is None:
            engine, failed = build_engine(config)
        self.engine = engine
        self.costs = costs or cost_model(config, engine)
        settings = Settings(self._batch_cap(d.max_batch_images), d.max_wait_ms / 1000.0, d.starvation_ms / 1000.0)
        self.scheduler = POLICIES.load(d.policy)(engine.catalog(), self.costs, settings, engine.weights_slot)
        self.admission = Admission(self.costs, d.degrade)
        self.row_writer = RowWriter(config, engine, self.metrics)
        self.adapters = AdapterSlots(engine, self.scheduler, self.row_writer, self.metrics, failed)
        self.reporter = Reporter(self)
        self.estimate = estimate(config, self.catalog, self.costs) if self.catalog.adapters else None
        self.warmed: set = set()
        self.ready = threading.Event()  # set once warmed up and listening
        self.heartbeat = time.monotonic()  # the loop's last round (for /healthz)
        self._log_malformed = Throttle(log, "malformed messages")
        self._released: queue.SimpleQueue[str] = queue.SimpleQueue()  # streams moved away (any thread puts)
        self.cluster_view: dict | None = None  # cluster mode: the controller's latest view (shown on the dashboard)

    def _batch_cap(self, max_batch: int) -> int:
        """max_batch_images, or less where the profile shows larger batches cost more per image (a CPU)."""
        cap = self.costs.efficient_batch(max_batch)
        self.costs.batch_cap = cap  # its load accounting takes the slope of the batches that run
        if cap < max_batch:
            log.info("batches of at most %d images: the cost profile measured the lowest time per image there "
                     "(max_batch_images %d costs more per image on this machine)", cap, max_batch)
        return cap

    # ------------------------------------------------------------------ what others read
    @property
    def catalog(self) -> Catalog:
        return self.adapters.catalog

    @property
    def failed_adapters(self) -> dict[str, str]:
        return self.adapters.failed

    @property
    def totals(self) -> Totals:
        """The running counts since start (chunks, requests, ok, shed, errors, ...): the log and the tests read them."""
        return self.metrics.totals

    def snapshot(self) -> dict:
        """What /status and the dashboard show (any thread may call it)."""
        return self.reporter.snapshot()

    def release_stream(self, stream: str) -> None:
        """The stream now goes to another daemon (cluster mode): at the next round its held rows and its tracks'
        last events go out, and its silence from then on is no outage. Thread-safe."""
        self._released.put(stream)

    # ------------------------------------------------------------------ one loop round
    def _step(self, transport: Transport, stopping: bool) -> int:
        """Take what arrived, then run one batch if one is due. Returns the items taken."""
        self.heartbeat = time.monotonic()
        self.adapters.apply_operations()
        while not self._released.empty():
            self.row_writer.release(self._released.get())
        self.adapters.shed_late()
        now = time.time()
        spent = self.reporter.spent  # where the loop's time goes (the log line's shares)
        t0 = time.perf_counter()
        items = transport.take(0.0 if self.scheduler.ready(now, stopping) else self._wait_s(now))
        t1 = spent("waiting", t0)
        for item in items:
            self._receive(item)
        t2 = spent("intake", t1)
        now = time.time()
        if self.scheduler.ready(now, stopping):
            self.scheduler.reserve_s = self.row_writer.sink_leg.reserve_s(self.row_writer.sinks)
            self.metrics.sink_leg.set(self.scheduler.reserve_s)
            plan, shed = self.scheduler.next_plan(now)
            self.row_writer.shed(shed)
            t2 = spent("planning", t2)
            if plan is not None:
                self._execute(plan)
                t2 = spent("engine", t2)
        transport.hold(self.scheduler.queued_images)
        self.row_writer.tick(time.time(), deaf=transport.backlogged)
        self.reporter.tick()
        spent("rows", t2)
        return len(items)

    def _receive(self, item: Received | Heard | Malformed) -> None:
        if isinstance(item, Malformed):
            self.metrics.malformed()
            self._log_malformed.error(time.monotonic(), "malformed message rejected (%d parts): %s", item.parts,
                                      item.reason)
            return
        if isinstance(item, Heard):
            s = item.status
            self.row_writer.analytics.heard(s.stream, s.state, s.frame_age_s, item.received)
            return
        self._count(item)
        if item.requests:
            first = item.requests[0]
            self.row_writer.analytics.frames(item.stream, first.ready, max(first.frame_ts, default=0.0))
        # Filtered frames (a task that reuses an earlier chunk's result) cost no compute: straight to their rows.
        fresh = [r for r in item.requests if r.reuse_chunk < 0]
        for r in fresh:
            r.embed = self.row_writer.analytics.wants_embeddings(r.stream, r.task)
        self.row_writer.expect([(r.stream, r.task, r.seq) for r in item.requests],
                               [(r.stream, r.task, r.seq) for r in fresh])
        if len(fresh) < len(item.requests):
            self.row_writer.reused([r for r in item.requests if r.reuse_chunk >= 0])
        admitted = self.admission.admit(fresh, self.catalog, self.adapters.failed, self.adapters.waiting,
                                        time.time(), self.scheduler.queue, self.adapters.busy_share())
        self.adapters.hold(admitted.held)
        self.row_writer.refuse(admitted.refused)
        self.scheduler.extend(admitted.queue)

    def _count(self, item: Received) -> None:
        """What ingest reported with a chunk: counted, and said when something went missing before it."""
        self.metrics.chunk(item.stream, len(item.requests), item.dropped_before)
        outage = item.requests[0].outage_before_s if item.requests else 0.0
        self.metrics.ingest_report(item.stream, item.reconnects, item.decoded, outage)
        if outage:
            log.warning("stream %s: its source missed %.1f s of media before chunk %d (outage)", item.stream, outage,
                        item.seq)
        if item.dropped_before:
            log.warning("stream %s: ingest dropped %d chunk(s) before chunk %d", item.stream, item.dropped_before,
                        item.seq)

    def _execute(self, plan: BatchPlan) -> None:
        before = self.engine.weights_slot
        t0 = time.time()
        try:
            payloads = self.engine.execute(plan)
        except Exception as e:  # a bad batch must not take the daemon down
            log.exception("engine failed on a batch of %d requests", len(plan.requests))
            self.scheduler.weights_now(self.engine.weights_slot)
            self.row_writer.errors(plan.requests, f"inference failed: {type(e).__name__}: {e}")
            return
        t1 = time.time()
        self.costs.observe(plan.raw_s, t1 - t0)
        label = self._mode_label(plan.mode)
        self.metrics.batch(label, plan.images, t1 - t0, switched=before != self.engine.weights_slot)
        self.adapters.used({r.adapter for r in plan.requests}, t1)
        self.reporter.batch(label, plan.images, len(plan.requests), plan.est_s, t0, t1)
        self.row_writer.served(plan, payloads, t0, t1, label, self.catalog)

    def _mode_label(self, mode: LoRAMode) -> str:
        if mode.slot is None:
            return str(mode)
        name = next(n for n, a in self.catalog.adapters.items() if a.slot == mode.slot)
        return f"{mode.kind}:{name}" + ("" if mode.impl == "atmm" else f"/{mode.impl}")

    def _wait_s(self, now: float) -> float:
        if not self.scheduler.queue:
            return IDLE_WAIT_S
        oldest = min(r.received for r in self.scheduler.queue)
        return min(IDLE_WAIT_S, max(0.0, oldest + self.scheduler.settings.max_wait_s - now))

    # ------------------------------------------------------------------ start, serve, drain
    def warm_up(self) -> None:
        """Every plan key the policy can produce, once: ready is reported only after this."""
        self.warmed = warm_up(self.engine, self.scheduler)

    def run(self, stop: threading.Event | None = None, ready: threading.Event | None = None,
            drained: threading.Event | None = None, open_sinks: OpenSinks | None = None) -> Totals:
        """Serve until stop is set, then drain. `ready` is set once warmed up and listening, `drained` once every
        request received has been answered and the sinks flushed (senders may disconnect then). open_sinks: enters
        the sinks rows go to (called once warm; vlora_va/outputs/attach.py gives the configured ones)."""
        stop = stop or threading.Event()
        d = self.config.daemon
        if not self.warmed:
            self.warm_up()
        if self.estimate is not None:
            (log.info if self.estimate.fits else log.warning)("capacity: %s", self.estimate.message)
        transport = Transport(d.endpoint, d.image_size, QUEUE_BATCHES * d.max_batch_images,
                              curve=self.config.security.curve,
                              snapshots=any(s.snapshots for s in self.config.streams))
        control = self._control()
        try:
            with ExitStack() as stack:
                self.row_writer.attach(open_sinks(stack) if open_sinks is not None else [])
                transport.start()
                if control is not None:
                    control.start()
                log.info("daemon ready on %s (policy %s, image %d px, %d adapter(s) loaded, %d failed)",
                         d.endpoint, d.policy, d.image_size, len(self.catalog.adapters), len(self.adapters.failed))
                self.ready.set()
                if ready is not None:
                    ready.set()
                while not stop.is_set():
                    self._step(transport, stopping=False)
                self._drain(transport)
        finally:
            self.ready.clear()
            transport.close()
            if control is not None:
                control.close()
            if drained is not None:
                drained.set()
        s = self.totals
        log.info("daemon stopped: %d chunks, %d requests, %d results, %d shed, %d errors, %d deadline misses, "
                 "%d malformed messages", s.chunks, s.requests, s.ok, s.shed, s.errors, s.deadline_missed,
                 s.malformed)
        return s

    def _control(self) -> ControlServer | None:
        """The control socket for adapters at run time; a daemon whose endpoint is taken serves without it."""
        endpoint = control_endpoint(self.config.daemon.control_endpoint, self.config.daemon.endpoint)
        if not endpoint:
            return None
        try:
            server = ControlServer(endpoint, self.engine.backbone.config.hidden_size, self.adapters.operations,
                                   self.adapters.loading, curve=self.config.security.curve)
        except zmq.ZMQError as e:
            log.error("control socket %s not bound (%s): adapters cannot be loaded at run time", endpoint, e)
            return None
        log.info("control socket on %s (vlora-va adapters load / unload / list)", endpoint)
        return server

    def _drain(self, transport: Transport) -> None:
        """Read what is still arriving, then answer every queued request."""
        log.info("draining: %d request(s) queued", len(self.scheduler.queue))
        start = time.monotonic()
        while True:
            # Senders stay connected until we are drained, so what is in flight still arrives; a sender
            # that never stops is cut off after DRAIN_MAX_S.
            reading = time.monotonic() - start < DRAIN_MAX_S
            if not reading:
                transport.pause()
            self._step(transport, stopping=True)
            quiet = time.monotonic() - transport.last_read >= DRAIN_QUIET_S
            # requests held for an adapter still loading or compiling are answered too (they end by their deadline)
            if not self.scheduler.queue and not self.adapters.held and (quiet or not reading) \
                    and not transport.take(0):
                break
            if not reading and not self.scheduler.queue and self.adapters.held:
                self.adapters.refuse_held("the daemon stopped while its adapter was still loading")
                break
        self.row_writer.finish()
        self.reporter.log_progress(force=True)
