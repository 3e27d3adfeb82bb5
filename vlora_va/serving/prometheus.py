"""The daemon's accounting: every event is counted once, here, into Prometheus metrics (served at /metrics by the
daemon's HTTP server, vlora_va/outputs/dashboard, when daemon.http_port is set) and the running totals the log and the
tests read.

Event rows (contracts/events.py) feed the scene series: `vlora_events_total{stream,event}` (any event name, known or
not), `vlora_line_crossings_total{stream,line,direction,class}` and `vlora_zone_occupancy{stream,zone,class}`. The
last two follow the rule's running totals that each event carries (`counts`), not the number of events: a rule's
cooldown holds events back, never counts, so a crossing whose event was held back is counted at the rule's next
event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_STREAM_LABELS = 256  # streams with series of their own; more share one
OTHER_STREAMS = "other"


@dataclass
class Totals:
    chunks: int = 0
    requests: int = 0
    malformed: int = 0
    ok: int = 0
    shed: int = 0
    errors: int = 0
    deadline_missed: int = 0  # ok rows that were late (shed and error rows never count as in deadline)
    images: int = 0
    batches: int = 0
    switches: int = 0
    ingest_dropped: int = 0
    max_queue_images: int = 0  # high-water mark of requests waiting
    events: int = 0  # event rows (line crossings, zone entries, stream offline, ...)
    shed_by: dict = field(default_factory=dict)  # (stream, task) -> shed rows

    @property
    def answered(self) -> int:
        return self.ok + self.shed + self.errors


class DaemonMetrics:
    def __init__(self) -> None:
        # Own registry: several daemons (e.g. in tests) can live in one process.
        self.registry = r = CollectorRegistry()
        self.totals = Totals()
        self._chunks = Counter("vlora_chunks_received", "Chunk messages received", ["stream"], registry=r)
        self._malformed = Counter("vlora_messages_malformed", "Messages rejected as malformed", registry=r)
        self._ingest_dropped = Counter("vlora_ingest_chunks_dropped", "Chunks dropped by ingest before sending",
                                       ["stream"], registry=r)
        self._results = Counter("vlora_results", "Result rows written", ["stream", "task", "status"], registry=r)
        self._shed = Counter("vlora_requests_shed", "Requests shed before compute", ["stream", "task", "cause"],
                             registry=r)
        self._missed = Counter("vlora_deadline_missed", "Served results that missed their deadline",
                               ["stream", "task"], registry=r)
        self._switches = Counter("vlora_mode_switches", "Base-weight switches (merge / unmerge)", registry=r)
        self._batches = Counter("vlora_batches", "Batches run, by LoRA mode", ["mode"], registry=r)
        self.queue_requests = Gauge("vlora_queue_requests", "Requests waiting for a batch", registry=r)
        self.queue_images = Gauge("vlora_queue_images", "Images waiting for a batch", registry=r)
        self.mode = Gauge("vlora_lora_mode", "1 for the LoRA mode of the last batch", ["mode"], registry=r)
        self.correction = Gauge("vlora_cost_correction", "Observed / profiled batch time (online correction)",
                                registry=r)
        self.offered_load = Gauge("vlora_offered_load", "Offered compute, seconds of engine time per second",
                                  registry=r)
        self.degraded = Gauge("vlora_priority_served_fraction", "Share of a priority's work admitted under overload",
                              ["priority"], registry=r)
        self._batch_images = Histogram("vlora_batch_images", "Images per batch", registry=r,
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self._compute_s = Histogram("vlora_batch_compute_seconds", "Engine time per batch", registry=r,
                                    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5))
        self._latency_s = Histogram("vlora_result_latency_seconds", "Chunk ready to result, served rows",
                                    ["stream", "task"], registry=r, buckets=(0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10))
        self._modes_seen: set[str] = set()
        self._reconnects = Gauge("vlora_ingest_reconnects", "Source reconnects so far, as ingest reports them",
                                 ["stream"], registry=r)
        self._decoded = Gauge("vlora_ingest_decoded_frames", "Source frames decoded so far, as ingest reports them "
                              "(rate() gives the decode frames/s)", ["stream"], registry=r)
        self._outage = Counter("vlora_ingest_outage_seconds", "Media time missing in source outages", ["stream"],
                               registry=r)
        self.slots_used = Gauge("vlora_adapter_slots_used", "Adapter slots holding an adapter", registry=r)
        self._evictions = Counter("vlora_adapter_evictions", "Adapters evicted to make room for another", registry=r)
        self.ingest: dict[str, dict] = {}  # per stream: what ingest last reported (for the status view)
        self._labels: set[str] = set()  # stream ids with their own series (bounded: see stream_label)
        self._sink_rows = Counter("vlora_sink_rows", "Result rows by sink and outcome (written: delivered; "
                                  "dropped: queue full, refused, or undelivered at shutdown)", ["sink", "outcome"],
                                  registry=r)
        self._sink_errors = Counter("vlora_sink_errors", "Failed sink deliveries (each is retried or dropped)",
                                    ["sink"], registry=r)
        self._sink_queue = Gauge("vlora_sink_queue_rows", "Rows accepted by a sink and not yet delivered", ["sink"],
                                 registry=r)
        self.sinks: dict[str, dict] = {}  # sink name -> its last stats()
        self.sink_leg = Gauge("vlora_sink_leg_seconds", "Seconds kept out of every deadline budget for a row's way "
                              "from its compute to a local sink (p99 hand-off + p99 local sink lag)", registry=r)
        self._reused = Counter("vlora_results_reused", "Result rows answered from an earlier chunk: the task's frames "
                               "were filtered at ingest (nothing new)", ["stream", "task"], registry=r)
        self._events = Counter("vlora_events", "Event rows written, by event name", ["stream", "event"], registry=r)
        self._crossings = Counter("vlora_line_crossings", "Line crossings of confirmed tracks (a line's running "
                                  "totals)", ["stream", "line", "direction", "class"], registry=r)
        self._occupancy = Gauge("vlora_zone_occupancy", "Confirmed tracks inside a zone now, by class",
                                ["stream", "zone", "class"], registry=r)
        self._tracks = Gauge("vlora_tracks_active", "Confirmed tracks a stream's tracked tasks follow now", ["stream"],
                             registry=r)
        self._unique = Gauge("vlora_unique_objects", "Distinct confirmed tracks a stream saw over the last "
                             "tracking.unique_window_s, by class (a re-identified returning object counts once)",
                             ["stream", "class"], registry=r)
        # (stream id, line) -> (counts_since, {(direction, class): total counted}): what the crossings series holds
        self._line_totals: dict[tuple[str, str], tuple] = {}
        self._zone_classes: dict[tuple[str, str], set[str]] = {}  # classes with an occupancy series, per zone
        self._unique_classes: dict[str, set[str]] = {}  # classes with a unique-objects series, per stream

    # ------------------------------------------------------------------ events
    def chunk(self, stream: str, requests: int, dropped_before: int) -> None:
        stream = self.stream_label(stream)
        t = self.totals
        t.chunks += 1
        t.requests += requests
        self._chunks.labels(stream).inc()
        if dropped_before:
            t.ingest_dropped += dropped_before
            self._ingest_dropped.labels(stream).inc(dropped_before)
            seen = self.ingest.setdefault(stream, {"outage_s": 0.0})
            seen["dropped"] = seen.get("dropped", 0) + dropped_before

    def stream_label(self, stream: str) -> str:
        """A stream's label in the series: its id for the first MAX_STREAM_LABELS streams seen, then "other",
        so senders that invent stream ids cannot grow the daemon's memory."""
        if stream in self._labels:
            return stream
        if len(self._labels) < MAX_STREAM_LABELS:
            self._labels.add(stream)
            return stream
        return OTHER_STREAMS

    def ingest_report(self, stream: str, reconnects: int, decoded: int, outage_s: float) -> None:
        stream = self.stream_label(stream)
        self._reconnects.labels(stream).set(reconnects)
        self._decoded.labels(stream).set(decoded)
        if outage_s:
            self._outage.labels(stream).inc(outage_s)
        seen = self.ingest.setdefault(stream, {"outage_s": 0.0})
        seen.update(reconnects=reconnects, decoded=decoded, outage_s=seen["outage_s"] + outage_s,
                    dropped=seen.get("dropped", 0))

    def eviction(self) -> None:
        self._evictions.inc()

    def malformed(self) -> None:
        self.totals.malformed += 1
        self._malformed.inc()

    def row(self, stream: str, task: str, status: str, deadline_met: bool, total_s: float,
            cause: str | None = None, reused: bool = False) -> None:
        """One result row written (every request gets exactly one): its stream, task, status, whether it met its
        deadline, its total latency, for a shed row why (the label), and whether it reused an earlier chunk's result
        (frame filtering). Metrics count; they never keep a row."""
        t = self.totals
        stream = self.stream_label(stream)
        task = task if stream != OTHER_STREAMS else OTHER_STREAMS
        self._results.labels(stream, task, status).inc()
        if reused:
            self._reused.labels(stream, task).inc()
        if status == "ok":
            t.ok += 1
            self._latency_s.labels(stream, task).observe(total_s)
            if not deadline_met:
                t.deadline_missed += 1
                self._missed.labels(stream, task).inc()
        elif status == "shed":
            t.shed += 1
            key = (stream, task)
            t.shed_by[key] = t.shed_by.get(key, 0) + 1
            self._shed.labels(stream, task, cause or "deadline").inc()
        else:
            t.errors += 1

    def events(self, records: list) -> None:
        """Event rows written (EventRecords; result rows in the list are ignored): counted by name, and the line
        and zone series set from the running totals they carry."""
        for rec in records:
            if getattr(rec, "type", None) != "event":
                continue
            stream = self.stream_label(rec.stream)
            self.totals.events += 1
            self._events.labels(stream, rec.event).inc()
            if rec.line is not None:
                self._line_event(stream, rec)
            if rec.zone is not None:
                self._zone_event(stream, rec)

    def _line_event(self, stream: str, rec) -> None:
        """The crossings counters advance by what the line's totals gained since its last event. An event without
        totals counts itself (and is remembered, so totals that arrive later do not count it twice)."""
        key = (rec.stream, rec.line)  # the stream's own id: beyond MAX_STREAM_LABELS streams share a label, not totals
        since, seen = self._line_totals.get(key, (None, {}))
        counts = rec.counts if isinstance(rec.counts, dict) else None
        if counts is None:
            if rec.event == "line_crossed" and rec.direction and rec.cls:
                k = (rec.direction, rec.cls)
                seen[k] = seen.get(k, 0) + 1
                self._crossings.labels(stream, rec.line, rec.direction, rec.cls).inc()
                self._line_totals[key] = (since, seen)
            return
        if rec.counts_since != since:  # the totals started again (e.g. the rule was reset): a new baseline of 0
            since, seen = rec.counts_since, {}
        for direction in ("in", "out"):
            by_class = counts.get(direction)
            for cls, n in (by_class.items() if isinstance(by_class, dict) else ()):
                if not isinstance(n, (int, float)) or isinstance(n, bool):
                    continue
                gained = n - seen.get((direction, cls), 0)
                if gained > 0:
                    self._crossings.labels(stream, rec.line, direction, cls).inc(gained)
                    seen[(direction, cls)] = n
        self._line_totals[key] = (since, seen)

    def _zone_event(self, stream: str, rec) -> None:
        """Occupancy is the zone's "inside" totals of its latest event; a class no longer listed is 0 again."""
        inside = rec.counts.get("inside") if isinstance(rec.counts, dict) else None
        if not isinstance(inside, dict):
            return
        classes = self._zone_classes.setdefault((rec.stream, rec.zone), set())
        for cls in classes - set(inside):
            self._occupancy.labels(stream, rec.zone, cls).set(0)
        for cls, n in inside.items():
            if isinstance(n, (int, float)) and not isinstance(n, bool):
                self._occupancy.labels(stream, rec.zone, cls).set(n)
                classes.add(cls)

    def tracks_active(self, stream: str, n: int) -> None:
        """How many confirmed tracks a stream's tracked tasks follow now."""
        self._tracks.labels(self.stream_label(stream)).set(n)

    def unique_objects(self, stream: str, counts: dict[str, int]) -> None:
        """Distinct tracks per class a stream saw over the unique window."""
        label = self.stream_label(stream)
        classes = self._unique_classes.setdefault(label, set())
        for cls in classes - set(counts):  # every track of the class was forgotten: 0, not its last value
            self._unique.labels(label, cls).set(0)
        for cls, n in counts.items():
            self._unique.labels(label, cls).set(n)
            classes.add(cls)

    def batch(self, mode: str, images: int, seconds: float, switched: bool) -> None:
        t = self.totals
        t.batches += 1
        t.images += images
        self._batches.labels(mode).inc()
        self._batch_images.observe(images)
        self._compute_s.observe(seconds)
        if switched:
            t.switches += 1
            self._switches.inc()
        for m in self._modes_seen | {mode}:
            self.mode.labels(m).set(1 if m == mode else 0)
        self._modes_seen.add(mode)

    def queue(self, requests: int, images: int) -> None:
        self.queue_requests.set(requests)
        self.queue_images.set(images)
        self.totals.max_queue_images = max(self.totals.max_queue_images, images)

    def sink_stats(self, name: str, stats: dict) -> None:
        """A sink's own running totals (sinks.py: written, dropped, errors, queue) into the Prometheus series;
        counters advance by what changed since the last call."""
        last = self.sinks.get(name, {})
        if name not in self.sinks:  # every sink's series exist from the start, at 0 (rate() and alerts need them)
            for key in ("written", "dropped"):
                self._sink_rows.labels(name, key)
            self._sink_errors.labels(name)
        for key in ("written", "dropped"):
            delta = stats.get(key, 0) - last.get(key, 0)
            if delta > 0:
                self._sink_rows.labels(name, key).inc(delta)
        delta = stats.get("errors", 0) - last.get("errors", 0)
        if delta > 0:
            self._sink_errors.labels(name).inc(delta)
        self._sink_queue.labels(name).set(stats.get("queue", 0))
        self.sinks[name] = dict(stats)
