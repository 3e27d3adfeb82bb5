"""Event snapshots: the JPEG ingest sent with the frame an event happened on, with the event's box drawn, kept on
disk within `snapshots: {dir, max_mb, max_age_s}` (the oldest go first).

Ingest encodes the tracked frames of streams that declare `snapshots: true` at source resolution (up to
`max_width`); the daemon decodes, draws and writes one only when an event happens, so a quiet stream costs the
daemon nothing.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import cv2
import numpy as np

from vlora_va.common.logs import Throttle
from vlora_va.contracts.scene import SnapshotConfig

log = logging.getLogger(__name__)
PRUNE_EVERY_S = 10.0
BOX_BGR = (0, 200, 255)


class SnapshotStore:
    def __init__(self, cfg: SnapshotConfig):
        self.cfg = cfg
        self.dir = Path(cfg.dir)
        self._files: list[tuple[float, int, Path]] = []  # (written at, bytes, path), oldest first
        self._bytes = 0
        self._next_prune = 0.0
        self._log = Throttle(log, "snapshot failures")
        self.written = self.failed = 0
        self._adopt()

    def _adopt(self) -> None:
        """Snapshots an earlier run left in the directory count against the limits too (oldest first)."""
        try:
            found = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.dir.glob("*.jpg")]
        except OSError:
            return
        self._files = sorted(found)
        self._bytes = sum(size for _, size, _ in found)

    def save(self, name: str, jpeg: bytes, box: tuple | None, orig_size: tuple[int, int],
             quality: int = 85) -> str | None:
        """Write the JPEG with box (original-frame pixels, orig_size = width, height) drawn; its path, or None
        when it cannot be written (logged, never raised: an event goes out without its snapshot)."""
        try:
            image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            if image is None:
                raise ValueError("not a decodable JPEG")
            if box is not None:
                sx, sy = image.shape[1] / orig_size[0], image.shape[0] / orig_size[1]
                x1, y1, x2, y2 = (int(round(v)) for v in (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy))
                cv2.rectangle(image, (x1, y1), (x2, y2), BOX_BGR, max(2, image.shape[1] // 400))
            ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if not ok:
                raise ValueError("JPEG encoding failed")
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / f"{name}.jpg"
            tmp = path.with_suffix(".jpg.tmp")
            tmp.write_bytes(buf.tobytes())
            os.replace(tmp, path)  # a reader never sees half a file
        except (OSError, ValueError, cv2.error) as e:
            self.failed += 1
            self._log.error(time.monotonic(), "snapshot %s not written: %s", name, e)
            return None
        self.written += 1
        self._files.append((time.time(), len(buf), path))
        self._bytes += len(buf)
        self.prune()
        return str(path)

    def prune(self, now: float | None = None) -> None:
        """Delete the oldest snapshots beyond max_mb, and those older than max_age_s."""
        now = time.time() if now is None else now
        limit = self.cfg.max_mb * 1e6
        while self._files and (self._bytes > limit or now - self._files[0][0] > self.cfg.max_age_s):
            _, size, path = self._files.pop(0)
            self._bytes -= size
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                self._log.error(time.monotonic(), "snapshot %s not deleted: %s", path, e)
