"""Result sinks: where result records go. Each sink is a small context manager with `write(records)`; every
sink writes the same row, `ResultRecord.to_json()` (schema and example: contracts/results.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable

from contracts.config import SinkConfig
from contracts.results import ResultRecord

log = logging.getLogger(__name__)


class JsonlSink:
    """Appends one JSON object per line; flushed after every batch so a crash loses at most one batch."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = None

    def __enter__(self) -> "JsonlSink":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        log.info("writing results to %s", self.path)
        return self

    def write(self, records: Iterable[ResultRecord]) -> None:
        for rec in records:
            self._file.write(json.dumps(rec.to_json(), separators=(",", ":")) + "\n")
        self._file.flush()

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class ZmqPubSink:
    """Publishes every result as a JSON message on a ZeroMQ PUB socket, topic = stream id (strict real time:
    slow subscribers lose messages, the daemon never waits)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._ctx = self._sock = None

    def __enter__(self) -> "ZmqPubSink":
        import zmq

        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 1000)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.endpoint)
        log.info("publishing results on %s", self.endpoint)
        return self

    def write(self, records: Iterable[ResultRecord]) -> None:
        import zmq

        for rec in records:
            try:
                self._sock.send_multipart([rec.stream.encode(), json.dumps(rec.to_json()).encode()], flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # PUB drops for slow subscribers by design

    def __exit__(self, *exc) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def make_sink(cfg: SinkConfig):
    if cfg.type == "jsonl":
        return JsonlSink(cfg.path)
    raise ValueError(f"unknown sink type {cfg.type!r}")
