"""The standard output sink (`type: stdout`): JSON Lines on stdout, for piping into another program."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from vlora_va.contracts.results import ResultRecord
from vlora_va.contracts.sinks import SinkConfig, SinkEntry, SinkOptions
from vlora_va.outputs.sinks.jsonl import JSONL_BATCH_MAX, json_line
from vlora_va.outputs.sinks.queued import CLOSE_TIMEOUT_S, QueuedSink


@dataclass(frozen=True)
class StdoutOptions(SinkOptions):
    """A stdout sink has no keys of its own, and there is one standard output: one stdout sink."""

    @classmethod
    def read(cls, entry: SinkEntry) -> StdoutOptions:
        return cls()

    def destination(self) -> tuple[str, str, str]:
        return "type", "stdout", "a second stdout sink, like"


class StdoutSink(QueuedSink):
    """One row per line on standard output (logs go to standard error), flushed after every batch."""

    local = True  # the row's deadline ends here (base.py)

    def __init__(self, *, queue_max: int = 10_000, close_timeout_s: float = CLOSE_TIMEOUT_S, stream=None,
                 name: str = "stdout"):
        super().__init__(name, queue_max=queue_max, batch_max=JSONL_BATCH_MAX, close_timeout_s=close_timeout_s)
        self._stream = stream

    @classmethod
    def from_config(cls, cfg: SinkConfig) -> "StdoutSink":
        return cls(queue_max=cfg.queue_max, close_timeout_s=cfg.close_timeout_s)

    def _start(self) -> None:
        if self._stream is None:
            self._stream = sys.stdout

    def _deliver(self, rows: list[ResultRecord]) -> None:
        self._stream.write("".join(json_line(r) for r in rows))
        self._stream.flush()
