"""RowWriter: the one row every request gets, the events they make, and where they go.

    served plan + payloads ─┐
    refused (admission)     ├─► ResultRecord (+ provenance) ─► analytics (tracked tasks: in chunk order, track
    shed (scheduler)        │   ids, line/zone events; streams going offline) ─► handed off (deadline judged) ─►
    errors (adapters, engine)┘  counted (prometheus) ─► every sink ─► observers

Every request the daemon accepted ends here exactly once: `served` (the engine's result), or not (`refuse`, `shed`:
shed or error, with the reason). Each row says what produced it (`provenance`). A tracked task's row may wait for
the rows of its stream's earlier chunks (vlora_va/analytics/order.py); event rows (contracts/events.py) follow the
row that made them. Sinks are handed the rows of each write together; observers (the dashboard) see them after the
sinks and must be quick: one that fails is logged and dropped, never fatal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from typing import Callable

from vlora_va.analytics.pipeline import Analytics, Item
from vlora_va.common.logs import Throttle
from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import Payload, ResultRecord
from vlora_va.engine.executor import Engine
from vlora_va.engine.plan import BatchPlan, Catalog
from vlora_va.serving.prometheus import DaemonMetrics
from vlora_va.serving.reuse import Reuse, reused_row
from vlora_va.serving.scheduling import Shed
from vlora_va.serving.sink_leg import SinkLeg

log = logging.getLogger(__name__)

ServedObserver = Callable[[Request, ResultRecord], None]
RowObserver = Callable[[list[ResultRecord]], None]


class RowWriter:
    def __init__(self, config: PipelineConfig, engine: Engine, metrics: DaemonMetrics):
        self.config, self.engine, self.metrics = config, engine, metrics
        self.sinks: list = []  # set by attach() while the daemon serves
        self._served_observers: list[ServedObserver] = []
        self._row_observers: list[RowObserver] = []
        self._log_errors = Throttle(log, "error rows")
        self._provenance = self._make_provenance()
        self.analytics = Analytics(config)
        self.sink_leg = SinkLeg()  # measured after each served batch; the scheduler keeps it out of its budget
        # Rows of filtered frames are an earlier chunk's result (serving/reuse.py): kept only where a task filters,
        # so a pipeline without filters pays nothing for it (and a chunk's path stays as short as it was).
        self.reuse: Reuse | None = Reuse() if any(t.filter for s in config.streams for t in s.tasks) else None

    # ------------------------------------------------------------------ where rows go
    def attach(self, sinks: list) -> None:
        """The sinks every row goes to from now on (the daemon's, while it serves)."""
        self.sinks = list(sinks)

    def observe_served(self, fn: ServedObserver) -> None:
        """fn(request, row) after each served request (on the daemon's thread)."""
        self._served_observers.append(fn)

    def observe_rows(self, fn: RowObserver) -> None:
        """fn(rows) after every write: ok, shed and error rows alike (on the daemon's thread)."""
        self._row_observers.append(fn)

    @property
    def observers(self) -> list[Callable]:
        return self._served_observers + self._row_observers

    def forget(self, fn: Callable) -> None:
        for observers in (self._served_observers, self._row_observers):
            if fn in observers:
                observers.remove(fn)

    # ------------------------------------------------------------------ what produced a row
    def _make_provenance(self) -> dict[str | None, dict]:
        """Per adapter: its content hash (and version if its trainer wrote one), the backbone and its weights'
        digest, and the pipeline config's hash."""
        config = json.dumps(dataclasses.asdict(self.config), sort_keys=True, default=str)
        common = {"backbone": f"{self.config.daemon.backbone}@{self.engine.backbone_digest[:12]}",
                  "config_sha256": hashlib.sha256(config.encode()).hexdigest()[:16]}
        out: dict[str | None, dict] = {None: common}
        for name, a in self.engine.adapters.items():
            out[name] = {"adapter_sha256": a.sha256[:16], **({"adapter_version": a.version} if a.version else {}),
                         **common}
        return out

    def adapters_changed(self) -> None:
        """An adapter was loaded or unloaded: rows name the weights that serve now."""
        self._provenance = self._make_provenance()

    def provenance(self, adapter: str) -> dict:
        return self._provenance.get(adapter, self._provenance[None])

    # ------------------------------------------------------------------ rows
    def served(self, plan: BatchPlan, payloads: list[Payload], started: float, ended: float, mode: str,
               catalog: Catalog) -> list[ResultRecord]:
        """The rows of a batch the engine served, written; returns them."""
        records = [ResultRecord.served(r, p, compute_start=started, compute_end=ended, batch_images=plan.images,
                                       mode=mode, trained=catalog.adapters[r.adapter].trained,
                                       provenance=self.provenance(r.adapter))
                   for r, p in zip(plan.requests, payloads)]
        self._write([(rec, None, req) for rec, req in zip(records, plan.requests)])
        self.sink_leg.handed_off(time.time() - ended)
        return records

    def refuse(self, refused: list[tuple[Request, str, str, str | None]]) -> None:
        """Requests not served: (request, "shed" | "error", reason, shed cause or None) each."""
        now = time.time()
        self._write([(ResultRecord.not_served(r, status, reason, now, self.provenance(r.adapter)), cause, r)
                     for r, status, reason, cause in refused])

    def shed(self, shed: list[Shed]) -> None:
        """What the scheduler shed (it could no longer meet its deadline)."""
        self.refuse([(s.request, "shed", s.reason, s.cause) for s in shed])

    def errors(self, requests: list[Request], reason: str) -> None:
        """Requests that cannot be served, for one reason."""
        self.refuse([(r, "error", reason, None) for r in requests])

    def expect(self, keys: list[tuple[str, str, int]], carrying: list[tuple[str, str, int]] | None = None) -> None:
        """(stream, task, chunk) of the requests the daemon accepted (before admission: each gets a row); carrying:
        those of them that carry frames (a reuse of their chunk waits for their row), default all."""
        self.analytics.expect(keys)
        if self.reuse is not None:
            self.reuse.expect(keys if carrying is None else carrying)

    def reused(self, requests: list[Request]) -> None:
        """Requests whose frames ingest filtered out: their rows are an earlier chunk's (now, or once it is written)."""
        if self.reuse is None:  # a sender filters that this daemon's pipeline file did not say: learn from now on
            self.reuse = Reuse()
        now = time.time()
        rows = [(rec, None, r) for r in requests
                if (rec := self.reuse.take(r, now, self.provenance(r.adapter))) is not None]
        if rows:
            self._write(rows)

    def tick(self, now: float, deaf: bool = False) -> None:
        """What time passing makes: streams going offline or coming back (events), the active tracks gauge.
        deaf: the daemon is not reading its socket now (backpressure), so ingest's silence says nothing."""
        self.analytics.liveness.deaf(deaf, now)
        late = self.reuse.expire(now) if self.reuse is not None else []
        if late:
            self._write([(rec, "deadline", req) for req, rec in late])
        events = self.analytics.tick(now)
        if events:
            self._write([(e, None, None) for e in events])
        for stream, n in self.analytics.tracks_active().items():
            self.metrics.tracks_active(stream, n)
        for stream, counts in self.analytics.unique_objects(time.time()).items():
            self.metrics.unique_objects(stream, counts)

    def release(self, stream: str) -> None:
        """The stream moved to another daemon (cluster mode): its held rows and its tracks' last events now."""
        rows = self.analytics.release(stream)
        if rows:
            self._emit(rows)

    def finish(self) -> None:
        """The daemon has answered every request: reuse requests still waiting will get no source row, the tracks
        end, and with them the zone presences (events)."""
        left = self.reuse.expire(time.time(), everything=True) if self.reuse is not None else []
        if left:
            self._write([(rec, "deadline", req) for req, rec in left])
        events = self.analytics.end()
        if events:
            self._write([(e, None, None) for e in events])

    def _write(self, rows: list[Item]) -> list[Item]:
        """Hand rows on (through analytics: tracked rows may wait, events join); returns what was written."""
        if any(rec.type == "result" and (rec.stream, rec.task) in self.analytics.tasks for rec, _, _ in rows):
            rows = self.analytics.rows(rows)  # tracked tasks: in chunk order, with track ids and events
        return self._emit(rows)

    def _emit(self, rows: list[Item]) -> list[Item]:
        """Rows ready to go (tracked already): counted, to every sink, then to the observers."""
        if not rows:
            return rows
        now = time.time()  # the hand-off: where each result row's deadline is judged
        rows = [(rec.handed(now) if rec.type == "result" else rec, cause, req) for rec, cause, req in rows]
        for rec, cause, _ in rows:
            if rec.type != "result":
                continue
            self.metrics.row(rec.stream, rec.task, rec.status, rec.deadline_met, rec.latency.total_s, cause,
                             reused="reused_chunk" in rec.extra)
            if rec.status == "error":
                self._log_errors.error(time.monotonic(), "stream %s chunk %d task %s: %s", rec.stream, rec.chunk,
                                       rec.task, rec.reason)
        records = [rec for rec, _, _ in rows]
        self.metrics.events([rec for rec in records if rec.type == "event"])
        released = []  # reuse requests that waited for one of these rows
        for rec in records if self.reuse is not None else ():
            if rec.type == "result":
                released += self.reuse.written(rec)
        for sink in self.sinks:
            sink.write(records)
        # A tracked task's served row may leave with a later write (a shed row of an earlier chunk releases it):
        # its observers hear of it whenever it leaves.
        # (a reused row has no frames to show: its observers saw them with the chunk it reuses)
        served = [(req, rec) for rec, _, req in rows
                  if req is not None and rec.type == "result" and rec.status == "ok" and req.reuse_chunk < 0]
        for fn in list(self._served_observers):
            try:
                for req, rec in served:
                    fn(req, rec)
            except Exception:  # noqa: BLE001 - an observer must not take serving down
                log.exception("a result observer failed and is removed")
                self._served_observers.remove(fn)
        for fn in list(self._row_observers):
            try:
                fn(records)
            except Exception:  # noqa: BLE001 - an observer must not take serving down
                log.exception("a row observer failed and is removed")
                self._row_observers.remove(fn)
        if released:
            now = time.time()
            self._write([(reused_row(req, source, now), None, req) for req, source in released])
        return rows
