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
import hashlib
import json
import logging
import os
import queue
import threading
import time
from contextlib import ExitStack
from typing import Callable

import torch
import zmq

from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import ResultRecord, not_served, served

from vlora_va.serving import costs as C
from vlora_va.engine import precision
from vlora_va.engine.adapters import Adapter, AdapterError, load_adapter_dir
from vlora_va.serving.capacity import estimate, offered_images
from vlora_va.serving.control import ControlServer, Operation, control_endpoint
from vlora_va.engine.executor import Engine
from vlora_va.engine.lora import LoRAMode
from vlora_va.common.logs import Throttle
from vlora_va.serving.prometheus import DaemonMetrics, Totals
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.plan import BatchPlan
from vlora_va.serving.scheduling import POLICIES, OverloadControl, Settings, Shed
from vlora_va.outputs.sinks import ZmqPubSink, close_all, make_sink
from vlora_va.serving.transport import Malformed, Received, Transport

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


def pick_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, name)


def build_engine(config: PipelineConfig) -> tuple[Engine, dict[str, str]]:
    """The engine for a pipeline, and the adapters that could not be served (name -> why)."""
    d = config.daemon
    device = pick_device(d.device)
    torch.set_num_threads(d.threads or os.cpu_count() or 1)
    backbone = load_backbone(d.backbone, d.allow_download, device)
    adapters, failed = load_adapters(config, backbone.config.hidden_size)
    sizes = {n: int(a.head_config.get("image_size", d.image_size)) for n, a in adapters.items()}
    # The precision that serves this pipeline's mix of image sizes fastest (no streams yet: one image per size).
    workload = offered_images(config, sizes)[0] or {s: 1.0 for s in set(sizes.values()) or {d.image_size}}
    choice = precision.pick(d.precision, d.dtype, device, backbone, d.backbone, adapters, workload,
                            C.profile_dir(d.profile_cache))
    log.info("backbone precision %s: %s", choice.precision, choice.reason)
    dtype = precision.dtype_of(choice.precision) if d.dtype == "auto" else pick_dtype(d.dtype, device)
    engine = Engine(backbone, adapters, d.image_size, d.max_slots, d.max_rank, device, d.premerge_max_mb,
                    d.max_batch_images, dtype,
                    precision=choice.precision if choice.precision in precision.PRECISIONS else None)
    failed.update(engine.rejected)
    return engine, failed


def cost_model(config: PipelineConfig, engine: Engine, remeasure: bool = False) -> C.CostModel:
    """The cost profile for this engine on this machine: the cached one, or measured now (and cached)."""
    catalog = engine.catalog()
    ranks = {n: a.rank for n, a in engine.adapters.items()}
    modes = C.MEASURED_MODES[config.daemon.policy]
    key = C.profile_key(engine.device, config.daemon.backbone, engine.backbone, catalog, ranks, modes)
    return C.CostModel(C.load_or_measure(engine, catalog, key, C.profile_dir(config.daemon.profile_cache), modes,
                                         remeasure))


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
        # Observers of served requests (e.g. a dashboard): called with (request, row) after each batch, on the
        # daemon's thread; they must be quick, and one that fails is logged and dropped, never fatal.
        self.taps: list[Callable[[Request, ResultRecord], None]] = []
        # Observers of every row written (ok, shed and error alike), called with the rows of each write on the
        # daemon's thread; same rules as taps.
        self.row_taps: list[Callable[[list[ResultRecord]], None]] = []
        self.ready = threading.Event()  # set once warmed up and listening
        self._last_batch: dict = {}
        self._offered_load = 0.0  # as last computed on the daemon's thread (OverloadControl is not thread-safe)
        self._provenance = self._make_provenance()
        # Adapters at run time (control.py): operations prepared on the control thread, applied here.
        self.operations: queue.Queue[Operation] = queue.Queue()
        self.loading: set[str] = set()  # names whose files are being read: their requests wait
        self.pinned: set[str] = set(self.catalog.adapters)  # the configured adapters are never evicted
        self._last_used: dict[str, float] = {}
        self._held: list[Request] = []
        self.metrics.slots_used.set(len(self.engine.slots))
        self.heartbeat = time.monotonic()  # the loop's last round (for /healthz)
        self._log_malformed = Throttle(log, "malformed messages")
        self._log_errors = Throttle(log, "error rows")

    def _make_provenance(self) -> dict[str | None, dict]:
        """What every row says produced it, per adapter: the adapter's content hash (and version if its trainer
        wrote one), the backbone and its weights' digest, and the pipeline config's hash."""
        config = json.dumps(dataclasses.asdict(self.config), sort_keys=True, default=str)
        common = {"backbone": f"{self.config.daemon.backbone}@{self.engine.backbone_digest[:12]}",
                  "config_sha256": hashlib.sha256(config.encode()).hexdigest()[:16]}
        out: dict[str | None, dict] = {None: common}
        for name, a in self.engine.adapters.items():
            out[name] = {"adapter_sha256": a.sha256[:16], **({"adapter_version": a.version} if a.version else {}),
                         **common}
        return out

    # ------------------------------------------------------------------ adapters at run time
    def _apply_operations(self, sinks) -> None:
        while True:
            try:
                op = self.operations.get_nowait()
            except queue.Empty:
                return
            try:
                op.reply = {"load": self._load, "unload": self._unload, "list": self._list}[op.op](op, sinks)
            except Exception as e:  # noqa: BLE001 - an operation must not take serving down
                log.exception("adapter %s of %r failed", op.op, op.name)
                op.reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            finally:
                if op.op == "load":
                    self.loading.discard(op.name)
                    self._release_held(op.name, op.reply, sinks)
                op.done.set()

    def _load(self, op: Operation, sinks) -> dict:
        name, adapter = op.name, op.adapter
        problem = self.engine._misfit(adapter, self.engine.max_rank)
        if problem:
            return {"ok": False, "error": f"adapter {name!r} does not fit this backbone: {problem}"}
        evicted = None
        if name not in self.engine.slots and not self.engine.free_slots():
            victims = [n for n in self.engine.slots if n not in self.pinned]
            if not victims:
                return {"ok": False, "error": f"no free slot for {name!r}: all {self.engine.max_slots} "
                                              f"(daemon.max_slots) hold pinned adapters ({', '.join(self.engine.slots)}); "
                                              f"unload one first"}
            evicted = min(victims, key=lambda n: self._last_used.get(n, 0.0))  # least recently used
            self.metrics.eviction()
            self._remove(evicted, f"adapter {evicted!r} was evicted (least recently used) to load {name!r}", sinks)
        reloaded = name in self.engine.slots
        target = self.engine.slots.get(name, (self.engine.free_slots() or [None])[0])
        if target is not None and self.engine.weights_slot == target:
            self._pristine_weights()
        slot = self.engine.load(name, adapter)
        self.failed_adapters.pop(name, None)
        if op.pin:
            self.pinned.add(name)
        self._last_used[name] = time.time()
        self._refresh()
        log.info("adapter %s %s into slot %d (%s, sha256 %s)%s", name, "reloaded" if reloaded else "loaded", slot,
                 adapter.path, adapter.sha256[:16], f"; evicted {evicted}" if evicted else "")
        return {"ok": True, "name": name, "slot": slot, "reloaded": reloaded, "evicted": evicted,
                "sha256": adapter.sha256[:16], "slots": {"used": len(self.engine.slots), "total": self.engine.max_slots}}

    def _unload(self, op: Operation, sinks) -> dict:
        if op.name not in self.engine.slots:
            return {"ok": False, "error": f"adapter {op.name!r} is not loaded (loaded: {', '.join(self.engine.slots) or 'none'})"}
        slot = self._remove(op.name, f"adapter {op.name!r} was unloaded", sinks)
        return {"ok": True, "name": op.name, "slot": slot,
                "slots": {"used": len(self.engine.slots), "total": self.engine.max_slots}}

    def _list(self, op: Operation, sinks) -> dict:
        adapters = [{"name": n, "slot": s, "pinned": n in self.pinned, "size": self.engine.sizes[n],
                     "task": self.catalog.adapters[n].task, "sha256": a.sha256[:16], "path": str(a.path),
                     "last_used": self._last_used.get(n)} for n, s in sorted(self.engine.slots.items(), key=lambda x: x[1])
                    for a in [self.engine.adapters[n]]]
        return {"ok": True, "adapters": adapters, "failed": dict(self.failed_adapters),
                "slots": {"used": len(self.engine.slots), "total": self.engine.max_slots}}

    def _remove(self, name: str, reason: str, sinks) -> int:
        """Take an adapter out of its slot; its queued requests get error rows saying why."""
        if self.engine.weights_slot == self.engine.slots[name]:
            self._pristine_weights()
        slot = self.engine.unload(name)
        self.pinned.discard(name)
        self._last_used.pop(name, None)
        dropped = [r for r in self.scheduler.queue if r.adapter == name]
        self.scheduler.queue = [r for r in self.scheduler.queue if r.adapter != name]
        now = time.time()
        self._write([(not_served(r, "error", reason, now, self.provenance(name)), None) for r in dropped], sinks)
        self._refresh()
        log.info("%s (slot %d freed)", reason, slot)
        return slot

    def _pristine_weights(self) -> None:
        self.engine.switch(LoRAMode("premerged") if self.catalog.can_premerge else LoRAMode("unmerged"))
        self.scheduler.weights_slot = self.engine.weights_slot

    def _refresh(self) -> None:
        self.metrics.slots_used.set(len(self.engine.slots))
        self.catalog = self.engine.catalog()
        self.scheduler.catalog = self.catalog
        self._provenance = self._make_provenance()

    def _release_held(self, name: str, reply: dict, sinks) -> None:
        """Requests that waited for an adapter being loaded: queued once it is in, answered if it failed."""
        held = [r for r in self._held if r.adapter == name]
        if not held:
            return
        self._held = [r for r in self._held if r.adapter != name]
        if reply.get("ok"):
            for r in held:
                self.scheduler.add(r)
        else:
            now = time.time()
            self._write([(not_served(r, "error", f"adapter {name!r} failed to load: {reply.get('error')}", now,
                                     self.provenance(name)), None) for r in held], sinks)

    def _shed_held(self, sinks) -> None:
        now = time.time()
        late = [r for r in self._held if now > r.deadline]
        if late:
            self._held = [r for r in self._held if now <= r.deadline]
            self._write([(not_served(r, "shed", f"adapter {r.adapter!r} was still loading at its deadline", now,
                                     self.provenance(r.adapter)), "deadline") for r in late], sinks)

    def provenance(self, adapter: str) -> dict:
        return self._provenance.get(adapter, self._provenance[None])

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
            self._log_malformed.error(time.monotonic(), "malformed message rejected (%d parts): %s", item.parts,
                                      item.reason)
            return
        assert isinstance(item, Received)
        self.metrics.chunk(item.stream, len(item.requests), item.dropped_before)
        outage = item.requests[0].outage_before_s if item.requests else 0.0
        self.metrics.ingest_report(item.stream, item.reconnects, item.decoded, outage)
        if outage:
            log.warning("stream %s: its source missed %.1f s of media before chunk %d (outage)", item.stream, outage,
                        item.seq)
        if item.dropped_before:
            log.warning("stream %s: ingest dropped %d chunk(s) before chunk %d", item.stream, item.dropped_before,
                        item.seq)
        rows = []
        now = time.time()
        for req in item.requests:
            if req.adapter in self.loading and req.adapter not in self.catalog.adapters:
                self._held.append(req)  # its adapter is being loaded: wait for it (within its deadline)
                continue
            problem = self._unservable(req)
            if problem:
                rows.append((not_served(req, "error", problem, now, self.provenance(req.adapter)), None))
                continue
            if req.best_effort:  # not live: never shed; the transport's backpressure paces its source
                self.scheduler.add(req)
                continue
            info = self.catalog.adapters[req.adapter]
            mode = LoRAMode("premerged") if self.catalog.can_premerge else LoRAMode("unmerged")
            cost = self.costs.image_s(info.size, mode) * req.num_images
            admitted = self.overload.admit(req, cost, now, info.min_frames)
            if admitted.request is None:
                rows.append((not_served(req, "shed", admitted.reason, now, self.provenance(req.adapter)), "overload"))
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
                self._log_errors.error(time.monotonic(), "stream %s chunk %d task %s: %s", rec.stream, rec.chunk,
                                       rec.task, rec.reason)
        records = [rec for rec, _ in rows]
        for s in sinks:
            s.write(records)
        for tap in list(self.row_taps):
            try:
                tap(records)
            except Exception:  # noqa: BLE001 - an observer must not take serving down
                log.exception("a row observer failed and is removed")
                self.row_taps.remove(tap)

    def _shed_rows(self, shed: list[Shed]) -> list:
        now = time.time()
        return [(not_served(s.request, "shed", s.reason, now, self.provenance(s.request.adapter)), s.cause)
                for s in shed]

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
            self._write([(not_served(r, "error", f"inference failed: {type(e).__name__}: {e}", now,
                                     self.provenance(r.adapter)), None) for r in plan.requests], sinks)
            return
        t1 = time.time()
        self.costs.observe(plan.raw_s, t1 - t0)
        label = self._mode_label(plan.mode)
        rows = [(served(r, p, compute_start=t0, compute_end=t1, batch_images=plan.images, mode=label,
                        trained=self.catalog.adapters[r.adapter].trained, provenance=self.provenance(r.adapter)), None)
                for r, p in zip(plan.requests, payloads)]
        self.metrics.batch(label, plan.images, t1 - t0, switched=before != self.engine.weights_slot)
        for r in plan.requests:
            self._last_used[r.adapter] = t1
        self._last_batch = {"mode": label, "images": plan.images, "requests": len(plan.requests),
                            "compute_ms": round((t1 - t0) * 1000, 1), "predicted_ms": round(plan.est_s * 1000, 1),
                            "at": t1}
        self._write(rows, sinks)
        self._tap(plan.requests, [rec for rec, _ in rows])

    def _tap(self, requests: list[Request], records: list[ResultRecord]) -> None:
        for tap in list(self.taps):
            try:
                for req, rec in zip(requests, records):
                    tap(req, rec)
            except Exception:  # noqa: BLE001 - an observer must not take serving down
                log.exception("a result observer failed and is removed")
                self.taps.remove(tap)

    def status(self) -> dict:
        """A snapshot of what the daemon is doing (for a dashboard or a health check; read from any thread:
        every dict is copied through list(items()), one step under the GIL, never iterated while it grows)."""
        t = self.stats
        catalog = self.catalog  # replaced whole on a load or unload, never changed in place
        adapters = list(catalog.adapters.items())
        slot_names = {a.slot: n for n, a in adapters}
        weights = self.engine.weights_slot
        return {
            "ready": self.ready.is_set(), "policy": self.config.daemon.policy,
            "device": str(self.engine.device), "last_batch": dict(list(self._last_batch.items())),
            "weights_hold": slot_names.get(weights) if weights is not None else None,
            "adapters": {n: {"slot": a.slot, "size": a.size, "task": a.task, "trained": a.trained} for n, a in adapters},
            "failed_adapters": dict(list(self.failed_adapters.items())),
            "slots": {"used": len(adapters), "total": self.config.daemon.max_slots},
            "queue": {"requests": len(self.scheduler.queue), "images": self.scheduler.queued_images},
            "offered_load": round(self._offered_load, 3), "admitted": dict(list(self.overload.fractions.items())),
            "cost_correction": round(self.costs.correction, 3), "cost_margin": round(self.costs.margin, 3),
            "capacity": self.estimate.message if self.estimate else None,
            "totals": {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "shed_by"},
            "ingest": {s: dict(list(v.items())) for s, v in list(self.metrics.ingest.items())},
            "loop_age_s": round(time.monotonic() - self.heartbeat, 3),
        }

    def _step(self, transport: Transport, sinks, stopping: bool) -> int:
        """Take what arrived, then run one batch if one is due. Returns the items taken."""
        self.heartbeat = time.monotonic()
        self._apply_operations(sinks)
        self._shed_held(sinks)
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
        self._offered_load = self.overload.load(now)
        m.offered_load.set(self._offered_load)
        for tier, f in self.overload.fractions.items():
            m.degraded.labels(str(tier)).set(f)
        for sink in getattr(self, "sinks", ()):
            m.sink_stats(sink.name, sink.stats())

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
        """Every configured sink, entered on the stack. A sink never blocks: its failures are logged and
        counted in its stats(), exported by _gauges. On exit all sinks start their final flush together."""
        sinks = [stack.enter_context(make_sink(c)) for c in self.config.sinks]
        if self.config.daemon.results_endpoint:
            sinks.append(stack.enter_context(ZmqPubSink(self.config.daemon.results_endpoint,
                                                         curve=self.config.security.curve)))
        stack.callback(close_all, sinks)  # runs before the sinks' own exits (last in, first out)
        self.sinks = sinks
        return sinks

    def run(self, stop: threading.Event | None = None, ready: threading.Event | None = None,
            drained: threading.Event | None = None) -> Totals:
        """Serve until stop is set, then drain. `ready` is set once warmed up and listening, `drained` once
        every request received has been answered and the sinks flushed (senders may disconnect then)."""
        from vlora_va.outputs.dashboard.server import start_http

        http = start_http(self)  # /healthz, /readyz, /metrics, dashboard (daemon.http_port): up during warm-up
        try:
            return self._run(stop, ready, drained)
        finally:
            if http is not None:
                http.close()

    def _run(self, stop: threading.Event | None, ready: threading.Event | None,
             drained: threading.Event | None) -> Totals:
        stop = stop or threading.Event()
        d = self.config.daemon
        if not self.warmed:
            self.warm_up()
        if self.estimate is not None:
            (log.info if self.estimate.fits else log.warning)("capacity: %s", self.estimate.message)
        transport = Transport(d.endpoint, d.image_size, QUEUE_BATCHES * d.max_batch_images,
                              curve=self.config.security.curve)
        control = self._control()
        try:
            with ExitStack() as stack:
                sinks = self._sinks(stack)
                transport.start()
                if control is not None:
                    control.start()
                log.info("daemon ready on %s (policy %s, image %d px, %d adapter(s) loaded, %d failed)",
                         d.endpoint, d.policy, d.image_size, len(self.catalog.adapters), len(self.failed_adapters))
                self.ready.set()
                if ready is not None:
                    ready.set()
                while not stop.is_set():
                    self._step(transport, sinks, stopping=False)
                self._drain(transport, sinks)
        finally:
            self.ready.clear()
            transport.close()
            if control is not None:
                control.close()
            if drained is not None:
                drained.set()
        s = self.stats
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
            server = ControlServer(endpoint, self.engine.backbone.config.hidden_size, self.operations, self.loading,
                                   curve=self.config.security.curve)
        except zmq.ZMQError as e:
            log.error("control socket %s not bound (%s): adapters cannot be loaded at run time", endpoint, e)
            return None
        log.info("control socket on %s (vlora-va adapters load / unload / list)", endpoint)
        return server

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
