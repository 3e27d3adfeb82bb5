"""`QueuedSink`: the machinery every slow sink shares, so a new sink writes only `_deliver(rows)`: a bounded
queue, one delivery thread, retry with backoff, counted drops and a bounded close (the contract: base.py)."""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections import deque
from typing import Iterable

from vlora_va.contracts.results import ResultRecord
from vlora_va.outputs.sinks.base import Sink

log = logging.getLogger(__name__)

REPORT_EVERY_S = 30.0  # a sink that keeps failing or dropping says so again at most this often
LAGS_KEPT = 256  # recent batches whose delivery lag is kept
TICK_S = 0.5  # an idle sink thread wakes this often (time rotation, interval fsync, drop reports)
CLOSE_TIMEOUT_S = 5.0  # default time a sink gets on exit to deliver what it holds


class Rejected(Exception):
    """A delivery the destination refused for good (e.g. HTTP 400): its rows are dropped, not retried."""


class QueuedSink(Sink):
    """The machinery every slow sink shares: bounded queue, one delivery thread, retry with backoff, counted
    drops, bounded close. Subclasses implement `_deliver(rows)` (and optionally `_idle`, `_teardown`)."""

    def __init__(self, name: str, *, queue_max: int, batch_max: int, flush_interval_s: float = 0.0,
                 retry_initial_s: float = 0.5, retry_max_s: float = 10.0, close_timeout_s: float = CLOSE_TIMEOUT_S,
                 tick_s: float = TICK_S):
        self.name = name
        self.queue_max, self.batch_max = queue_max, batch_max
        self.flush_interval_s, self.tick_s = flush_interval_s, tick_s
        self.retry_initial_s, self.retry_max_s = retry_initial_s, max(retry_initial_s, retry_max_s)
        self.close_timeout_s = close_timeout_s
        self._cv = threading.Condition()
        self._queue: deque[tuple[float, ResultRecord]] = deque()  # (arrival, record)
        self._inflight: list[ResultRecord] = []  # the batch being delivered (still counts as queued)
        self._batch_seq = 0  # number of the current batch (a retried batch keeps its number)
        self._written = self._dropped = self._errors = 0
        self._thread: threading.Thread | None = None
        self._closing = self._abandoned = False
        self._close_deadline = 0.0
        self._down_at_close = False
        self._failing_since: float | None = None
        self._last_fail_log = 0.0
        self._reported_drops, self._last_drop_log = 0, 0.0
        # seconds from write() to delivered, per recent batch (its oldest row): a local sink's share of the row's
        # way to its reader, which the daemon keeps out of its deadline budget (serving/sink_leg.py)
        self._lags: deque[float] = deque(maxlen=LAGS_KEPT)
        self._batch_arrival = 0.0

    # ------------------------------------------------------------------ daemon side
    def __enter__(self):
        self._thread = threading.Thread(target=self._run, name=f"sink {self.name}", daemon=True)
        self._thread.start()
        return self

    def write(self, records: Iterable[ResultRecord]) -> None:
        """Queue records for delivery; never blocks beyond a deque append. Rows beyond queue_max are dropped."""
        records = list(records)
        if not records:
            return
        now = time.monotonic()
        with self._cv:
            if self._closing:
                self._dropped += len(records)
                return
            room = self.queue_max - len(self._queue) - len(self._inflight)
            take = records[:max(0, room)]
            self._queue.extend((now, r) for r in take)
            self._dropped += len(records) - len(take)
            if take:
                self._cv.notify_all()

    def stats(self) -> dict:
        with self._cv:
            return self._stats_locked()

    def delivery_lags(self) -> list[float]:
        """Seconds from write() to delivered of the recent batches (their oldest row), oldest first."""
        with self._cv:
            return list(self._lags)

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued has been delivered (or dropped); False if timeout came first."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._inflight, timeout)

    def begin_close(self) -> None:
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._down_at_close = self._failing_since is not None
            self._close_deadline = time.monotonic() + self.close_timeout_s
            self._cv.notify_all()

    def __exit__(self, *exc) -> None:
        self.begin_close()
        if self._thread is not None:
            self._thread.join(max(0.0, self._close_deadline - time.monotonic()))
        with self._cv:
            hung = self._thread is not None and self._thread.is_alive()
            if hung:  # still inside a delivery (e.g. a hung server): give up on everything it holds
                self._abandoned = True
                self._dropped += len(self._queue) + len(self._inflight)
                self._queue.clear()
                self._inflight = []
                self._cv.notify_all()
            s = {"written": self._written, "dropped": self._dropped, "errors": self._errors}
        if not hung:
            try:
                self._teardown()
            except Exception as e:
                self._errors += 1
                log.error("sink %s: closing failed: %s", self.name, e)
        (log.warning if s["dropped"] or s["errors"] else log.info)(
            "sink %s closed: %d rows written, %d dropped, %d errors%s", self.name, s["written"], s["dropped"],
            s["errors"], " (still busy at the close deadline)" if hung else "")

    # ------------------------------------------------------------------ sink thread
    def _run(self) -> None:
        self._safe(self._start)
        backoff = self.retry_initial_s
        while True:
            self._report_drops()
            rows = self._take()
            if rows is None:
                return
            if not rows:
                self._safe(self._idle)
                continue
            rows = self._drop_unwritable(rows)
            if not rows:
                continue
            try:
                self._deliver(rows)
            except Rejected as e:  # the destination is up but refuses these rows: no retry, no failing state
                self._fail(e, failing=False)
                self._drop_inflight()
                continue
            except Exception as e:
                self._fail(e)
                if not self._wait_retry(backoff):
                    return
                backoff = min(backoff * 2, self.retry_max_s)
                continue
            self._delivered(None)
            backoff = self.retry_initial_s

    def _take(self) -> list[ResultRecord] | None:
        """The rows to deliver next: the batch that failed last time, or a new batch when one is due. [] means
        nothing is due this tick; None means stop."""
        with self._cv:
            if self._abandoned:
                return None
            if self._inflight:
                return list(self._inflight)
            tick_end = time.monotonic() + self.tick_s
            while True:
                now = time.monotonic()
                if self._queue:
                    due = self._queue[0][0] + self.flush_interval_s
                    if len(self._queue) >= self.batch_max or self._closing or now >= due:
                        n = min(len(self._queue), self.batch_max)
                        self._batch_arrival = self._queue[0][0]
                        self._inflight = [self._queue.popleft()[1] for _ in range(n)]
                        self._batch_seq += 1
                        return list(self._inflight)
                    wake = min(tick_end, due)
                elif self._closing:
                    return None
                else:
                    wake = tick_end
                if now >= tick_end:
                    return []
                self._cv.wait(max(0.0, wake - now))

    def _delivered(self, n: int | None) -> None:
        """The first n rows of the current batch (None: all that remain) have been delivered."""
        with self._cv:
            if self._abandoned:
                return
            n = len(self._inflight) if n is None else n
            del self._inflight[:n]
            if n and not self._inflight:  # the batch is out (perhaps in parts): its lag
                self._lags.append(time.monotonic() - self._batch_arrival)
            self._written += n
            if self._failing_since is not None and not self._inflight:
                log.warning("sink %s: recovered after %.1f s", self.name, time.monotonic() - self._failing_since)
                self._failing_since = None
            self._cv.notify_all()

    def _drop_unwritable(self, rows: list[ResultRecord]) -> list[ResultRecord]:
        """Rows that cannot even be turned into JSON (a bug, never the destination's fault) are dropped and
        counted, not retried: retrying them would stop every row after them."""
        bad = []
        for r in rows:
            try:
                r.to_json()
            except Exception as e:  # noqa: BLE001 - any row-level failure
                bad.append(r)
                log.error("sink %s: a row of stream %s chunk %s cannot be written (%s: %s): dropped", self.name,
                          getattr(r, "stream", "?"), getattr(r, "chunk", "?"), type(e).__name__, e)
        if not bad:
            return rows
        with self._cv:
            self._inflight = [r for r in self._inflight if all(r is not b for b in bad)]
            self._dropped += len(bad)
            self._errors += len(bad)
            self._cv.notify_all()
        return [r for r in rows if all(r is not b for b in bad)]

    def _drop_inflight(self) -> None:
        with self._cv:
            self._dropped += len(self._inflight)
            self._inflight = []
            self._cv.notify_all()

    def _fail(self, e: Exception, failing: bool = True) -> None:
        """Count and report a failed delivery (rate-limited); failing=True: the sink is down until one works."""
        now = time.monotonic()
        with self._cv:
            if self._abandoned:
                return
            self._errors += 1
            first = failing and self._failing_since is None
            if first:
                self._failing_since = now
            since = self._failing_since
            s = self._stats_locked()
        if first or now - self._last_fail_log >= REPORT_EVERY_S:
            self._last_fail_log = now
            log.error("sink %s: %s%s (%d rows waiting, %d dropped so far, %d errors)%s", self.name,
                      f"still failing after {now - since:.0f} s: " if since is not None and not first else "",
                      describe_error(e), s["queue"], s["dropped"], s["errors"],
                      "; retrying with backoff" if failing else "")

    def _stats_locked(self) -> dict:
        return {"written": self._written, "dropped": self._dropped, "errors": self._errors,
                "queue": len(self._queue) + len(self._inflight)}

    def _wait_retry(self, backoff: float) -> bool:
        """Sleep before retrying a failed batch. While closing, a sink gives up (drops what it holds) when it
        was already failing as the close began or the retry would end past the close deadline. False = stop."""
        with self._cv:
            if self._abandoned:
                return False
            was_closing = self._closing
            if was_closing and (self._down_at_close or time.monotonic() + backoff > self._close_deadline):
                self._dropped += len(self._queue) + len(self._inflight)
                self._queue.clear()
                self._inflight = []
                self._cv.notify_all()
                return True  # the loop ends once it finds nothing left
            self._cv.wait_for(lambda: self._abandoned or (self._closing and not was_closing), backoff)
            return not self._abandoned

    def _report_drops(self) -> None:
        now = time.monotonic()
        if now - self._last_drop_log < REPORT_EVERY_S:
            return
        with self._cv:
            dropped, s = self._dropped, self._stats_locked()
        if dropped > self._reported_drops:
            log.warning("sink %s: %d rows dropped (queue bound %d rows; %d dropped in all, %d written)", self.name,
                        dropped - self._reported_drops, self.queue_max, dropped, s["written"])
            self._reported_drops, self._last_drop_log = dropped, now

    def _safe(self, fn) -> None:
        try:
            fn()
        except Exception as e:
            self._fail(e)

    def _remaining_close_s(self) -> float | None:
        with self._cv:
            return max(0.0, self._close_deadline - time.monotonic()) if self._closing else None

    # ------------------------------------------------------------------ subclass hooks
    def _start(self) -> None:
        """First thing the sink thread does (open files...); a failure is reported and retried by _deliver."""

    @abc.abstractmethod
    def _deliver(self, rows: list[ResultRecord]) -> None:
        """Deliver these rows (in order) or raise: Rejected drops them, any other exception retries them whole.
        A sink that delivers part of a batch calls self._delivered(n) for the first n rows."""

    def _idle(self) -> None:
        """Called about every tick_s when nothing is due."""

    def _teardown(self) -> None:
        """Called on exit after the thread ended (not when it hung)."""


def describe_error(e: Exception) -> str:
    """An exception for a log line: an OSError as its errno text and file, not its repr."""
    if isinstance(e, OSError) and e.strerror:
        where = f" ({e.filename})" if e.filename else ""
        return f"{type(e).__name__}: [Errno {e.errno}] {e.strerror}{where}"
    return f"{type(e).__name__}: {e}"
