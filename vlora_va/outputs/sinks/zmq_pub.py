"""The ZeroMQ PUB sink: every result on the daemon's results socket (daemon.results_endpoint), for live
subscribers. It is not a sinks[] type: the daemon builds it from daemon.results_endpoint and security.curve."""

from __future__ import annotations

import json
import logging
from typing import Iterable

from vlora_va.contracts.results import ResultRecord
from vlora_va.contracts.security import CurveConfig, bind_server, close_server
from vlora_va.outputs.sinks.base import Sink

log = logging.getLogger(__name__)


class ZmqPubSink(Sink):
    """Publishes every result as a JSON message on a ZeroMQ PUB socket, topic = stream id (strict real time:
    slow subscribers lose messages, the daemon never waits). Sending is non-blocking, so it runs on the
    daemon's thread; rows refused at the high-water mark are counted as dropped. An endpoint that cannot
    be bound is reported and its rows counted as dropped; the daemon keeps serving."""

    local = True  # sent within write(): the hand-off is the delivery (no lag of its own)

    def __init__(self, endpoint: str, curve: CurveConfig | None = None):
        """curve: the daemon's CURVE keys (security.curve): only authorised subscribers receive, encrypted."""
        self.endpoint, self.curve = endpoint, curve
        self.name = f"zmq:{endpoint}"
        self._ctx = self._sock = self._auth = None
        self._written = self._dropped = self._errors = 0

    def __enter__(self) -> "ZmqPubSink":
        import zmq

        ctx = zmq.Context()  # its own: the key check (ZAP) is per context
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            self._auth = bind_server(ctx, sock, self.endpoint, self.curve, "daemon.results_endpoint")
        except zmq.ZMQError as e:
            self._errors += 1
            log.error("sink %s: cannot bind %s: %s; its results are dropped", self.name, self.endpoint, e)
            return self
        self._ctx, self._sock = ctx, sock
        log.info("publishing results on %s%s", self.endpoint, " (CURVE)" if self._auth else "")
        return self

    def write(self, records: Iterable[ResultRecord]) -> None:
        import zmq

        for rec in records:
            if self._sock is None:
                self._dropped += 1
                continue
            try:
                self._sock.send_multipart([rec.stream.encode(), json.dumps(rec.to_json()).encode()], flags=zmq.NOBLOCK)
                self._written += 1
            except zmq.Again:
                self._dropped += 1  # PUB drops for slow subscribers by design

    def stats(self) -> dict:
        return {"written": self._written, "dropped": self._dropped, "errors": self._errors, "queue": 0}

    def __exit__(self, *exc) -> None:
        if self._sock is not None:
            close_server(self._ctx, self._sock, self._auth)
            self._ctx = self._sock = self._auth = None
