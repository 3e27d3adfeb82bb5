"""Result sinks: where result records go. Every sink writes the same row, `ResultRecord.to_json()` (schema
and example: contracts/results.py), and is a small context manager with `write(records)` and `stats()`.

A sink never holds up the daemon or the other sinks. `write` only appends to the sink's own bounded queue
(a lock held for a deque append); rows that do not fit (`queue_max`) are dropped and counted, never waited
on. The sink's thread does everything that can be slow: serialising, writing, fsync, HTTP. A delivery that
fails (unwritable path, full disk, server down or hung) is logged, counted and retried with backoff; the
rows stay queued meanwhile, so nothing is lost up to the queue bound. On exit a sink gets `close_timeout_s`
to deliver what it holds (a sink that is failing at that moment gets one more try), then counts the rest as
dropped, so the daemon's drain always ends.

    stats() -> {"written": rows delivered, "dropped": rows given up on, "errors": failed deliveries,
                "queue": rows accepted and not yet delivered}       written + dropped + queue = rows offered
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import urlsplit

from vlora_va.contracts.config import SinkConfig
from vlora_va.contracts.security import CurveConfig, bind_server, close_server
from vlora_va.contracts.results import ResultRecord

log = logging.getLogger(__name__)

REPORT_EVERY_S = 30.0  # a sink that keeps failing or dropping says so again at most this often
TICK_S = 0.5  # an idle sink thread wakes this often (time rotation, interval fsync, drop reports)
CLOSE_TIMEOUT_S = 5.0  # default time a sink gets on exit to deliver what it holds
JSONL_BATCH_MAX = 1000  # rows per file write
ROTATE_RETRY_S = 10.0  # after a failed rotation, keep appending to the live file and try again this much later


def _line(rec: ResultRecord) -> str:
    return json.dumps(rec.to_json(), separators=(",", ":")) + "\n"


def close_all(sinks: Sequence) -> None:
    """Start every sink's final flush at once, so shutdown takes the longest close time, not their sum."""
    for s in sinks:
        begin = getattr(s, "begin_close", None)
        if begin is not None:
            begin()


class Rejected(Exception):
    """A delivery the destination refused for good (e.g. HTTP 400): its rows are dropped, not retried."""


class QueuedSink:
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
                      _describe(e), s["queue"], s["dropped"], s["errors"], "; retrying with backoff" if failing else "")

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

    def _deliver(self, rows: list[ResultRecord]) -> None:
        raise NotImplementedError

    def _idle(self) -> None:
        """Called about every tick_s when nothing is due."""

    def _teardown(self) -> None:
        """Called on exit after the thread ended (not when it hung)."""


def _describe(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f" ({e.filename})" if e.filename else ""
        return f"{type(e).__name__}: [Errno {e.errno}] {e.strerror}{where}"
    return f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------- JSON Lines file
class JsonlSink(QueuedSink):
    """Appends one JSON object per line to `path`. Rotation (by size and/or age) renames the live file to
    path.1 (older ones shift to .2 … .keep; the oldest beyond keep is replaced) and opens a new one, between
    lines: every row is in exactly one file. A failed write is cut back to the last whole line (ftruncate)
    and retried, so a full disk never leaves a partial or duplicate line.

    fsync policy: "batch" = fsync after every write to the file (each write holds what was queued, so rows
    are on disk before the sink takes the next ones), "interval" = at most fsync_interval_s after a row is
    written, "never" = the OS decides; files are also fsynced when rotated and closed (except "never")."""

    def __init__(self, path: str | Path, *, rotate_mb: float = 0.0, rotate_s: float = 0.0, keep: int = 10,
                 fsync: str = "interval", fsync_interval_s: float = 1.0, queue_max: int = 10_000,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, name: str | None = None):
        if fsync not in ("batch", "interval", "never"):
            raise ValueError(f"fsync must be batch, interval or never, got {fsync!r}")
        self.path = Path(path)
        super().__init__(name or f"jsonl:{self.path}", queue_max=queue_max, batch_max=JSONL_BATCH_MAX,
                         close_timeout_s=close_timeout_s,
                         tick_s=min(TICK_S, fsync_interval_s) if fsync == "interval" else TICK_S)
        self.rotate_bytes = int(rotate_mb * 1024 * 1024)
        self.rotate_s, self.keep = rotate_s, keep
        self.fsync, self.fsync_interval_s = fsync, fsync_interval_s
        self.rotations = 0
        self._fd: int | None = None
        self._size = 0
        self._opened = self._last_sync = 0.0
        self._dirty = False
        self._rotate_after = 0.0  # no rotation before this (monotonic), after a failed one

    def _start(self) -> None:
        self._open()
        log.info("sink %s: writing results to %s", self.name, self.path)

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # something that is not a directory is in the way
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(self.path.parent)) from None
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # an earlier run died mid-line: start a new one
                log.warning("sink %s: %s ends with a partial line (an earlier writer stopped mid-line)", self.name,
                            self.path)
                os.write(fd, b"\n")
                size += 1
        except OSError:
            os.close(fd)
            raise
        self._fd, self._size = fd, size
        self._opened = self._last_sync = time.monotonic()

    def _deliver(self, rows: list[ResultRecord]) -> None:
        if self._fd is None:
            self._open()
        lines = [_line(r).encode() for r in rows]
        i = 0
        while i < len(lines):
            if self._rotation_due(len(lines[i])):
                self._rotate()
            j, size = i, self._size
            while j < len(lines) and (j == i or not self.rotate_bytes or size + len(lines[j]) <= self.rotate_bytes):
                size += len(lines[j])
                j += 1
            self._append(b"".join(lines[i:j]))
            self._delivered(j - i)  # in the file: never written again, even if the fsync below fails
            i = j
            if self.fsync == "batch":
                self._sync()
        if self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self._sync()

    def _append(self, data: bytes) -> None:
        fd = self._fd
        start = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            try:
                os.ftruncate(fd, start)  # never leave a partial line behind: the retry writes it whole
            except OSError as e:
                log.error("sink %s: could not cut a partial line from %s: %s", self.name, self.path, _describe(e))
            self._close(sync=False)  # the retry reopens (the directory may have gone)
            raise
        self._size = start + len(data)
        self._dirty = True

    def _rotation_due(self, next_line: int) -> bool:
        if self._size == 0 or time.monotonic() < self._rotate_after:
            return False
        if self.rotate_bytes and self._size + next_line > self.rotate_bytes:
            return True
        return bool(self.rotate_s) and time.monotonic() - self._opened >= self.rotate_s

    def _rotate(self) -> None:
        """Rename-then-reopen: path -> path.1 (older ones shift up, the one at .keep is replaced)."""
        self._close(sync=self.fsync != "never")
        try:
            top = 0  # rotated files present: path.1 .. path.top
            while top < self.keep and os.path.lexists(f"{self.path}.{top + 1}"):
                top += 1
            for k in range(min(top, self.keep - 1), 0, -1):
                os.replace(f"{self.path}.{k}", f"{self.path}.{k + 1}")
            os.replace(self.path, f"{self.path}.1")
            self.rotations += 1
        except FileNotFoundError:
            pass  # someone removed the live file: just start a new one
        except OSError as e:  # keep appending to the live file; try again later
            with self._cv:
                self._errors += 1
            self._rotate_after = time.monotonic() + ROTATE_RETRY_S
            log.error("sink %s: rotating %s failed, still appending to it: %s", self.name, self.path, _describe(e))
        self._open()

    def _sync(self) -> None:
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
        self._dirty, self._last_sync = False, time.monotonic()

    def _close(self, sync: bool) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if sync and self._dirty:
                os.fsync(fd)
        finally:
            self._dirty = False
            os.close(fd)

    def _idle(self) -> None:
        if self._fd is None:
            return
        if self.rotate_s and self._rotation_due(0):
            self._rotate()
        if self.fsync == "interval" and self._dirty and time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self._sync()

    def _teardown(self) -> None:
        self._close(sync=self.fsync != "never")


# ---------------------------------------------------------------- standard output
class StdoutSink(QueuedSink):
    """One row per line on standard output (logs go to standard error), flushed after every batch."""

    def __init__(self, *, queue_max: int = 10_000, close_timeout_s: float = CLOSE_TIMEOUT_S, stream=None,
                 name: str = "stdout"):
        super().__init__(name, queue_max=queue_max, batch_max=JSONL_BATCH_MAX, close_timeout_s=close_timeout_s)
        self._stream = stream

    def _start(self) -> None:
        if self._stream is None:
            self._stream = sys.stdout

    def _deliver(self, rows: list[ResultRecord]) -> None:
        self._stream.write("".join(_line(r) for r in rows))
        self._stream.flush()


# ---------------------------------------------------------------- HTTP webhook
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a POST is never silently turned into a GET elsewhere
        return None


RETRYABLE_HTTP = {408, 425, 429}  # 4xx statuses that mean "try again later"; other 4xx/3xx are final


class WebhookSink(QueuedSink):
    """POSTs rows in batches: body = a JSON array of rows (`Content-Type: application/json`), at most
    batch_max rows, sent when batch_max rows are queued or the oldest has waited flush_interval_s. A failed
    POST (connection refused, timeout, 5xx, 408/425/429) is retried with exponential backoff up to
    retry_max_s, the batch kept whole and in order; a retried batch carries the same `Idempotency-Key`
    header, so a receiver can discard one it already has. Other 3xx/4xx answers drop the batch (counted)."""

    def __init__(self, url: str, *, batch_max: int = 100, flush_interval_s: float = 1.0, queue_max: int = 10_000,
                 timeout_s: float = 5.0, retry_max_s: float = 30.0, headers: dict | None = None,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, retry_initial_s: float = 0.5, name: str | None = None):
        super().__init__(name or f"webhook:{_public_url(url)}", queue_max=queue_max, batch_max=batch_max,
                         flush_interval_s=flush_interval_s, retry_initial_s=min(retry_initial_s, retry_max_s),
                         retry_max_s=retry_max_s, close_timeout_s=close_timeout_s)
        self.url, self.timeout_s = url, timeout_s
        self.headers = {"Content-Type": "application/json", "User-Agent": "vlora-va", **(headers or {})}
        self._run_id = uuid.uuid4().hex[:12]
        self._opener = urllib.request.build_opener(_NoRedirect())

    def _start(self) -> None:
        log.info("sink %s: posting results in batches of up to %d rows", self.name, self.batch_max)

    def _deliver(self, rows: list[ResultRecord]) -> None:
        body = json.dumps([r.to_json() for r in rows], separators=(",", ":")).encode()
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={**self.headers, "Idempotency-Key": f"{self._run_id}-{self._batch_seq}"})
        left = self._remaining_close_s()
        timeout = self.timeout_s if left is None else max(0.05, min(self.timeout_s, left))
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                resp.read(65536)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code < 500 and e.code not in RETRYABLE_HTTP:
                raise Rejected(f"HTTP {e.code} {e.reason}: {len(rows)} rows dropped") from None
            raise


def _public_url(url: str) -> str:
    """The URL without credentials or query (which may hold tokens): safe for logs and metric labels."""
    u = urlsplit(url)
    host = u.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{u.port}" if u.port else ""
    except ValueError:
        port = ""
    return f"{u.scheme}://{host}{port}{u.path}"


# ---------------------------------------------------------------- ZeroMQ PUB
class ZmqPubSink:
    """Publishes every result as a JSON message on a ZeroMQ PUB socket, topic = stream id (strict real time:
    slow subscribers lose messages, the daemon never waits). Sending is non-blocking, so it runs on the
    daemon's thread; rows refused at the high-water mark are counted as dropped. An endpoint that cannot
    be bound is reported and its rows counted as dropped; the daemon keeps serving."""

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


def make_sink(cfg: SinkConfig):
    if cfg.type == "jsonl":
        return JsonlSink(cfg.path, rotate_mb=cfg.rotate_mb, rotate_s=cfg.rotate_s, keep=cfg.keep, fsync=cfg.fsync,
                         fsync_interval_s=cfg.fsync_interval_s, queue_max=cfg.queue_max,
                         close_timeout_s=cfg.close_timeout_s)
    if cfg.type == "stdout":
        return StdoutSink(queue_max=cfg.queue_max, close_timeout_s=cfg.close_timeout_s)
    if cfg.type == "webhook":
        return WebhookSink(cfg.url, batch_max=cfg.batch_max, flush_interval_s=cfg.flush_interval_s,
                           queue_max=cfg.queue_max, timeout_s=cfg.timeout_s, retry_max_s=cfg.retry_max_s,
                           headers=dict(cfg.headers), close_timeout_s=cfg.close_timeout_s)
    raise ValueError(f"unknown sink type {cfg.type!r}")
