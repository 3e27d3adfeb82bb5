"""The JSON Lines file sink (`type: jsonl`): one row per line, rotation by size and/or age, an fsync policy; its
keys in pipelines.yaml (`JsonlOptions`). `json_line` (one row as a line) is shared with the stdout sink."""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from vlora_va.contracts.results import ResultRecord
from vlora_va.contracts.sinks import SinkConfig, SinkEntry, SinkOptions
from vlora_va.outputs.sinks.queued import CLOSE_TIMEOUT_S, TICK_S, QueuedSink, describe_error

log = logging.getLogger(__name__)

JSONL_BATCH_MAX = 1000  # rows per file write
ROTATE_RETRY_S = 10.0  # after a failed rotation, keep appending to the live file and try again this much later
FSYNC_POLICIES = ("batch", "interval", "never")


@dataclass(frozen=True)
class JsonlOptions(SinkOptions):
    """A jsonl sink's keys in pipelines.yaml."""

    path: str  # the live file (absolute); rotated ones are path.1 (newest) ... path.<keep>
    rotate_mb: float = 0.0  # rotate when the file would grow past this; 0 = off
    rotate_s: float = 0.0  # rotate when the file is this old; 0 = off
    keep: int = 10  # rotated files kept
    fsync: str = "interval"  # one of FSYNC_POLICIES (JsonlSink says what each means)
    fsync_interval_s: float = 1.0

    @classmethod
    def read(cls, entry: SinkEntry) -> JsonlOptions | None:
        path = entry.get("path", str)
        rest = dict(rotate_mb=entry.get("rotate_mb", float, cls.rotate_mb, minimum=0),
                    rotate_s=entry.get("rotate_s", float, cls.rotate_s, minimum=0),
                    keep=entry.get("keep", int, cls.keep, minimum=1, maximum=100_000),
                    fsync=entry.get("fsync", str, cls.fsync, choices=FSYNC_POLICIES),
                    fsync_interval_s=entry.get("fsync_interval_s", float, cls.fsync_interval_s, minimum=0.01,
                                               maximum=3600))
        return cls(path=entry.file(path), **rest) if path is not None else None

    def destination(self) -> tuple[str, str, str]:
        return "path", self.path, "the same file as"


def json_line(rec: ResultRecord) -> str:
    """One row as a JSON Lines line (compact, newline-terminated)."""
    return json.dumps(rec.to_json(), separators=(",", ":")) + "\n"


class JsonlSink(QueuedSink):
    """Appends one JSON object per line to `path`. Rotation (by size and/or age) renames the live file to
    path.1 (older ones shift to .2 … .keep; the oldest beyond keep is replaced) and opens a new one, between
    lines: every row is in exactly one file. A failed write is cut back to the last whole line (ftruncate)
    and retried, so a full disk never leaves a partial or duplicate line.

    fsync policy: "batch" = fsync after every write to the file (each write holds what was queued, so rows
    are on disk before the sink takes the next ones), "interval" = at most fsync_interval_s after a row is
    written, "never" = the OS decides; files are also fsynced when rotated and closed (except "never")."""

    local = True  # the row's deadline ends here (base.py)

    def __init__(self, path: str | Path, *, rotate_mb: float = 0.0, rotate_s: float = 0.0, keep: int = 10,
                 fsync: str = "interval", fsync_interval_s: float = 1.0, queue_max: int = 10_000,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, name: str | None = None):
        if fsync not in FSYNC_POLICIES:
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

    @classmethod
    def from_config(cls, cfg: SinkConfig) -> "JsonlSink":
        o: JsonlOptions = cfg.options
        return cls(o.path, rotate_mb=o.rotate_mb, rotate_s=o.rotate_s, keep=o.keep, fsync=o.fsync,
                   fsync_interval_s=o.fsync_interval_s, queue_max=cfg.queue_max, close_timeout_s=cfg.close_timeout_s)

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
        lines = [json_line(r).encode() for r in rows]
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
                log.error("sink %s: could not cut a partial line from %s: %s", self.name, self.path, describe_error(e))
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
            log.error("sink %s: rotating %s failed, still appending to it: %s", self.name, self.path, describe_error(e))
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
