"""The collector sink: in cluster mode every daemon hands its rows to one collector, which writes them to the
configured sinks once (vlora_va/cluster/collector.py). It is not a sinks[] type: the cluster controller gives each
daemon this sink instead of the configured ones.

    daemon rows ─► PUSH (connects; the collector binds PULL) ─► [daemon name, row JSON] per row

PUSH, not PUB: PUB drops everything sent before the subscriber has joined and whatever a slow subscriber cannot
take; PUSH keeps up to SNDHWM rows while the collector is away (a restart) and delivers them when it is back.
Sending never blocks the daemon's thread: a row that does not fit is dropped and counted.
"""

from __future__ import annotations

import json
import logging
from typing import Iterable

from vlora_va.contracts.results import ResultRecord
from vlora_va.contracts.security import CurveConfig, curve_client
from vlora_va.outputs.sinks.base import Sink

log = logging.getLogger(__name__)

SNDHWM = 50_000  # rows held while the collector is away (about a minute of 100 streams with 4 tasks)


class CollectorSink(Sink):
    def __init__(self, endpoint: str, daemon: str, curve: CurveConfig | None = None):
        """daemon: this daemon's name, sent with each row (the collector says which daemon served it).
        curve: security.curve: the collector accepts only authorised daemons, encrypted."""
        self.endpoint, self.daemon, self.curve = endpoint, daemon, curve
        self.name = f"collector:{endpoint}"
        self._ctx = self._sock = None
        self._written = self._dropped = 0

    def __enter__(self) -> "CollectorSink":
        import zmq

        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.PUSH)
        client = curve_client(self.curve)
        if client is not None:
            client.secure(sock)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(zmq.LINGER, 5000)  # on exit: what is queued gets this long to reach the collector
        sock.connect(self.endpoint)
        self._sock = sock
        log.info("rows go to the collector at %s", self.endpoint)
        return self

    def write(self, records: Iterable[ResultRecord]) -> None:
        import zmq

        name = self.daemon.encode()
        for rec in records:
            try:
                self._sock.send_multipart([name, json.dumps(rec.to_json()).encode()], flags=zmq.NOBLOCK)
                self._written += 1
            except zmq.Again:
                self._dropped += 1  # the collector has been away for SNDHWM rows

    def stats(self) -> dict:
        return {"written": self._written, "dropped": self._dropped, "errors": 0, "queue": 0}

    def __exit__(self, *exc) -> None:
        if self._sock is not None:
            self._sock.close()  # lingers: queued rows still leave
            self._ctx.term()
            self._sock = self._ctx = None
