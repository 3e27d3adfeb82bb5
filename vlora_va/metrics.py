"""Prometheus metrics of the inference daemon (served on daemon.metrics_port when it is set)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class DaemonMetrics:
    def __init__(self) -> None:
        # Own registry: several daemons (e.g. in tests) can live in one process.
        self.registry = r = CollectorRegistry()
        self.chunks = Counter("vlora_chunks_received", "Chunk messages received", ["stream"], registry=r)
        self.malformed = Counter("vlora_messages_malformed", "Messages rejected as malformed", registry=r)
        self.ingest_dropped = Counter("vlora_ingest_chunks_dropped", "Chunks dropped by ingest before sending",
                                      ["stream"], registry=r)
        self.results = Counter("vlora_results", "Results written", ["stream", "task", "status"], registry=r)
        self.deadline_missed = Counter("vlora_deadline_missed", "Results that missed their deadline",
                                       ["stream", "task"], registry=r)
        self.queue_depth = Gauge("vlora_queue_requests", "Requests waiting for a batch", registry=r)
        self.batch_images = Histogram("vlora_batch_images", "Images per batch", registry=r,
                                      buckets=(1, 2, 4, 8, 16, 32, 64))
        self.compute_s = Histogram("vlora_batch_compute_seconds", "Engine time per batch", registry=r,
                                   buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5))
        self.latency_s = Histogram("vlora_result_latency_seconds", "Chunk ready to result", ["task"], registry=r,
                                   buckets=(0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10))

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
