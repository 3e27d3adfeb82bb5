"""Reused results: the row of a task whose frames ingest filtered out (nothing new since chunk N) is chunk N's result.

    frame-carrying request accepted ─► expect (stream, task, N)       its row written ─► written(row): remembered,
    reuse request (reuse_chunk N)   ─► take(): N's row known: a row now                 the reuse requests that
                                             N still coming: held until it is written   waited for it get rows
                                             N unknown here: shed, "reused chunk N not served"
    tick ─► expire(): held past their deadline: shed, "reused chunk N not served" (best-effort ones wait: their
             source is best-effort too, never shed, served when live work leaves room)

A reused row is N's row with this chunk's number, frame_ts, times and deadline, and `"reused_chunk": N`; no compute
ran for it. If N was not served (shed, error), neither is the reuse: it is shed, saying so. N is unknown when the
daemon never received it (ingest dropped it after filtering against it, or the daemon restarted since): ingest
sends frames again within the task's refresh_chunks, so such rows stop by themselves.
"""

from __future__ import annotations

import collections
import dataclasses

from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import Latency, ResultRecord

KEEP = 4  # rows remembered per stream and task (a reuse names the last chunk ingest sent frames in)


def reused_row(req: Request, source: ResultRecord | None, now: float, provenance: dict | None = None) -> ResultRecord:
    """The row of a reuse request from its source chunk's row (None: the daemon has none). provenance: for a row
    without a source (what would have served it)."""
    n = req.reuse_chunk
    if source is None or source.status != "ok":
        rec = ResultRecord.not_served(req, "shed", f"reused chunk {n} not served", now,
                                      source.provenance if source is not None else provenance)
        return dataclasses.replace(rec, extra={"reused_chunk": n})
    return dataclasses.replace(
        source, chunk=req.seq, frame_ts=tuple(req.frame_ts), latency=Latency(0.0, 0.0, now - req.ready),
        deadline_ms=req.deadline_ms, deadline_met=now <= req.deadline, batch_images=None, mode=None,
        dropped_before=req.dropped_before, outage_before_s=req.outage_before_s, captured_at=req.ready,
        extra={**{k: v for k, v in source.extra.items() if k not in ("degraded", "best_effort")}, "reused_chunk": n})


class Reuse:
    def __init__(self):
        self._rows: dict[tuple[str, str], collections.OrderedDict[int, ResultRecord]] = {}
        self._open: set[tuple[str, str, int]] = set()  # frame-carrying requests accepted, row not yet written
        self._held: dict[tuple[str, str, int], list[Request]] = collections.defaultdict(list)

    def __len__(self) -> int:
        """Reuse requests waiting for their source chunk's row."""
        return sum(len(v) for v in self._held.values())

    def expect(self, keys: list[tuple[str, str, int]]) -> None:
        """(stream, task, chunk) of accepted requests that carry frames: a reuse of their chunk waits for their row."""
        self._open.update(keys)

    def written(self, rec: ResultRecord) -> list[tuple[Request, ResultRecord]]:
        """A result row went out: remembered; the held reuse requests of its chunk, with it."""
        key = (rec.stream, rec.task, rec.chunk)
        if rec.extra.get("reused_chunk") is not None:
            return []
        self._open.discard(key)
        rows = self._rows.setdefault(key[:2], collections.OrderedDict())
        rows[rec.chunk] = rec
        while len(rows) > KEEP:
            rows.popitem(last=False)
        return [(req, rec) for req in self._held.pop(key, [])]

    def take(self, req: Request, now: float, provenance: dict | None = None) -> ResultRecord | None:
        """The reuse request's row now, or None: held until its source row is written (or its deadline passes)."""
        key = (req.stream, req.task, req.reuse_chunk)
        source = self._rows.get(key[:2], {}).get(req.reuse_chunk)
        if source is None and key in self._open:
            self._held[key].append(req)
            return None
        return reused_row(req, source, now, provenance)

    def expire(self, now: float, everything: bool = False) -> list[tuple[Request, ResultRecord]]:
        """Held requests past their deadline (all of them when `everything`: the daemon drains), with their shed
        rows. A best-effort request (a file read as fast as it goes) is never shed for time: it waits for its source
        row, which comes however late."""
        def gone(r: Request) -> bool:
            return everything or (not r.best_effort and now > r.deadline)

        out = []
        for key in list(self._held):
            held = self._held.pop(key)
            waiting = [r for r in held if not gone(r)]
            if waiting:
                self._held[key] = waiting
            out += [(r, reused_row(r, None, now)) for r in held if gone(r)]
        return out
