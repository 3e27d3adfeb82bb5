"""What the daemon is doing, told three ways: a snapshot (the dashboard and /status read it from any thread), the
Prometheus gauges (set once per loop round), and a throughput line in the log every `daemon.log_every_s`."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Protocol

from vlora_va.contracts.config import PipelineConfig
from vlora_va.engine.executor import Engine
from vlora_va.serving.adapter_slots import AdapterSlots
from vlora_va.serving.admission import Admission
from vlora_va.serving.capacity import Estimate
from vlora_va.serving.costs import CostModel
from vlora_va.serving.prometheus import DaemonMetrics, Totals
from vlora_va.serving.rows import RowWriter
from vlora_va.serving.scheduling import Scheduler

log = logging.getLogger(__name__)
PHASES = ("engine", "intake", "planning", "rows", "waiting")  # the daemon loop's parts (Daemon._step)


class ReportedDaemon(Protocol):
    """What the Reporter reads of the daemon (serving/daemon.py's Daemon is one), and nothing else."""

    config: PipelineConfig
    engine: Engine
    metrics: DaemonMetrics
    adapters: AdapterSlots
    scheduler: Scheduler
    admission: Admission
    costs: CostModel
    row_writer: RowWriter
    estimate: Estimate | None  # the configured load against this machine; None without adapters
    ready: threading.Event  # set once warmed up and listening
    heartbeat: float  # time.monotonic() of the loop's last round
    cluster_view: dict | None  # cluster mode: the controller's latest view


class Reporter:
    """Reads the daemon's parts, never writes them."""

    def __init__(self, daemon: ReportedDaemon):
        self.daemon = daemon
        self.last_batch: dict = {}  # the last batch the engine ran (mode, images, times)
        self.offered_load = 0.0  # as last computed on the daemon's thread (overload control is not thread-safe)
        self._last_log = time.monotonic()
        self._logged = Totals()
        # seconds of the daemon's loop per phase since the last log line: under overload, whether the engine or the
        # intake (receiving, admitting, shedding) has the thread is what says where capacity goes
        self._phases: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._batches: list[tuple[int, float]] = []  # (images, seconds) of the batches since the last log line

    def spent(self, phase: str, since: float) -> float:
        """Charge the loop's time since `since` (perf_counter) to `phase`; returns now."""
        now = time.perf_counter()
        self._phases[phase] += now - since
        return now

    def batch(self, label: str, images: int, requests: int, predicted_s: float, started: float, ended: float) -> None:
        """The batch the engine just ran (its numbers: the snapshot shows them)."""
        self._batches.append((images, ended - started))
        self.last_batch = {"mode": label, "images": images, "requests": requests,
                           "compute_ms": round((ended - started) * 1000, 1), "predicted_ms": round(predicted_s * 1000, 1),
                           "at": ended}

    def snapshot(self) -> dict:
        """A snapshot for a dashboard or a health check. Read from any thread: every dict is copied through
        list(items()), one step under the GIL, never iterated while it grows."""
        d = self.daemon
        t = d.metrics.totals
        catalog = d.adapters.catalog  # replaced whole on a load or unload, never changed in place
        adapters = list(catalog.adapters.items())
        slot_names = {a.slot: n for n, a in adapters}
        weights = d.engine.weights_slot
        return {
            "ready": d.ready.is_set(), "policy": d.config.daemon.policy,
            "device": str(d.engine.device), "last_batch": dict(list(self.last_batch.items())),
            "weights_hold": slot_names.get(weights) if weights is not None else None,
            "adapters": {n: {"slot": a.slot, "size": a.size, "task": a.task, "trained": a.trained} for n, a in adapters},
            "failed_adapters": dict(list(d.adapters.failed.items())),
            "slots": {"used": len(adapters), "total": d.config.daemon.max_slots},
            "queue": {"requests": len(d.scheduler.queue), "images": d.scheduler.queued_images},
            "offered_load": round(self.offered_load, 3),
            "admitted": dict(list(d.admission.overload.fractions.items())),
            "cost_correction": round(d.costs.correction, 3), "cost_margin": round(d.costs.margin, 3),
            "capacity": d.estimate.message if d.estimate else None,
            "totals": {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name != "shed_by"},
            "ingest": {s: dict(list(v.items())) for s, v in list(d.metrics.ingest.items())},
            "loop_age_s": round(time.monotonic() - d.heartbeat, 3),
            **({"cluster": d.cluster_view} if d.cluster_view is not None else {}),
        }

    def tick(self) -> None:
        """Once per loop round: the gauges, and the log line when it is due."""
        d = self.daemon
        m = d.metrics
        m.queue(len(d.scheduler.queue), d.scheduler.queued_images)
        m.correction.set(d.costs.correction)
        self.offered_load = d.admission.overload.load(time.time())
        m.offered_load.set(self.offered_load)
        for tier, f in d.admission.overload.fractions.items():
            m.degraded.labels(str(tier)).set(f)
        for sink in d.row_writer.sinks:
            m.sink_stats(sink.name, sink.stats())
        self.log_progress()

    def log_progress(self, force: bool = False) -> None:
        d = self.daemon
        now = time.monotonic()
        dt = now - self._last_log
        if not force and dt < d.config.daemon.log_every_s:
            return
        s, p = d.metrics.totals, self._logged
        total = sum(self._phases.values()) or 1.0
        n = len(self._batches) or 1
        batches = (f"{len(self._batches)} batches of {sum(b[0] for b in self._batches) / n:.1f} images in "
                   f"{1000 * sum(b[1] for b in self._batches) / n:.1f} ms")
        log.info("%.1f chunks/s, %.1f results/s, %.1f images/s, %d shed, %d deadline misses, %d errors, "
                 "%d ingest drops, %d malformed, %d mode switches, queue %d, offered load %.2f s/s, cost x%.2f; "
                 "%s; loop: %s",
                 (s.chunks - p.chunks) / dt, (s.ok - p.ok) / dt, (s.images - p.images) / dt, s.shed - p.shed,
                 s.deadline_missed - p.deadline_missed, s.errors - p.errors, s.ingest_dropped - p.ingest_dropped,
                 s.malformed - p.malformed, s.switches - p.switches, len(d.scheduler.queue),
                 d.admission.overload.load(time.time()), d.costs.correction, batches,
                 ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in self._phases.items()))
        self._phases, self._batches = dict.fromkeys(PHASES, 0.0), []
        self._logged = dataclasses.replace(s, shed_by=dict(s.shed_by))
        self._last_log = now
