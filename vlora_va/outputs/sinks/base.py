"""The sink plug-in point: `Sink`, the one interface every result sink implements, and `close_all`.

A sink is where result records go. Every sink writes the same row, `ResultRecord.to_json()` (schema and example:
vlora_va/contracts/results.py), and keeps this contract:

A sink never holds up the daemon or the other sinks. `write` only appends to the sink's own bounded queue (a
lock held for a deque append); rows that do not fit (`queue_max`) are dropped and counted, never waited on. The
sink's own thread does everything that can be slow: serialising, writing, fsync, HTTP. A delivery that fails
(unwritable path, full disk, server down or hung) is logged, counted and retried with backoff; the rows stay
queued meanwhile, so nothing is lost up to the queue bound. On exit a sink gets `close_timeout_s` to deliver
what it holds (a sink that is failing at that moment gets one more try), then counts the rest as dropped, so
the daemon's drain always ends. `QueuedSink` (queued.py) is that machinery; a new sink subclasses it and writes
only `_deliver(rows)`.

    stats() -> {"written": rows delivered, "dropped": rows given up on, "errors": failed deliveries,
                "queue": rows accepted and not yet delivered}       written + dropped + queue = rows offered

A new sink type is a `Sink` subclass with a `from_config` classmethod, registered with its own keys (a
`SinkOptions`, contracts/sinks.py: the shape every built-in sink's keys take, e.g. jsonl.py's JsonlOptions) before
the pipeline is loaded:

    SINKS.register("memory", "my_pkg.memory_sink:MemorySink", options="my_pkg.memory_sink:MemoryOptions")

makes `sinks: [{type: memory, label: x}]` valid in pipelines.yaml, checked by MemoryOptions.read when the pipeline
is loaded; the keys arrive, checked, in `SinkConfig.options`. (`options=("label",)`, names only: the values arrive
as written, in a dict.)
"""

from __future__ import annotations

import abc
from typing import Iterable

from vlora_va.contracts.sinks import SinkConfig
from vlora_va.contracts.results import ResultRecord


class Sink(abc.ABC):
    """One destination of result rows. Use it as a context manager: `__enter__` starts it, `write` offers rows,
    `__exit__` ends it, delivering what it holds within its close timeout."""

    name: str  # for logs and the Prometheus `sink` label: never holds credentials
    # A local sink (a file, standard output) is where a row's deadline ends: the daemon keeps its measured delivery
    # lag (`delivery_lags`) out of the deadline budget. A network sink (webhook, MQTT) is asynchronous: its delivery
    # depends on the far side and is not part of the deadline (docs/results.md#deadline_met).
    local: bool = False

    def delivery_lags(self) -> list[float]:
        """Seconds from write() to delivered of recent batches (a sink that delivers within write: none)."""
        return []

    @classmethod
    def from_config(cls, cfg: SinkConfig) -> "Sink":
        """The sink its `sinks[]` entry describes (its own keys, checked, in cfg.options). A sink that is not
        configured in sinks[] (ZmqPubSink: daemon.results_endpoint) keeps this refusal."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a sinks[] entry: it defines no from_config")

    @abc.abstractmethod
    def __enter__(self) -> "Sink":
        """Start the sink (its thread, socket...) and return it. A destination that is not reachable yet is
        reported and retried (or its rows counted as dropped), never raised: the daemon keeps serving."""

    @abc.abstractmethod
    def write(self, records: Iterable[ResultRecord]) -> None:
        """Offer rows for delivery. Never blocks beyond a queue append; rows that do not fit are dropped and
        counted."""

    @abc.abstractmethod
    def stats(self) -> dict:
        """{"written", "dropped", "errors", "queue"}: running totals (see the module docstring)."""

    def begin_close(self) -> None:
        """Start the final flush without waiting for it; `__exit__` then waits at most the close timeout. A sink
        that delivers within `write` (ZmqPubSink) has nothing to start."""

    @abc.abstractmethod
    def __exit__(self, *exc) -> None:
        """Deliver what is held within the close timeout, count the rest as dropped, release everything."""


def close_all(sinks: Iterable[Sink]) -> None:
    """Start every sink's final flush at once, so shutdown takes the longest close time, not their sum."""
    for s in sinks:
        s.begin_close()
