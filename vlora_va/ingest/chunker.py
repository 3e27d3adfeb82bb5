"""Chunks: groups of `frames_per_chunk` frames, with each task's frames selected and letterboxed.

Only the union of the frames some task needs is converted, resized and sent; each task's
`TaskRequest.frames` indexes into that union. Frames are letterboxed as they arrive (not all at
the chunk's end), so the CPU work is spread over the chunk and no decoded frame is held longer
than needed.

A chunk's frames are one contiguous stretch of media: a frame after an outage (`Frame.outage_s`)
starts a new chunk (a partial one from before the outage is dropped, its media time counted as part
of the outage), and that chunk's header says how much media time was missing before it (`outage_s`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import cv2
import numpy as np

from vlora_va.contracts.config import StreamConfig, TaskConfig
from vlora_va.contracts.geometry import Letterbox, letterbox_geometry
from vlora_va.contracts.plugins import SOURCES
from vlora_va.contracts.scene import SnapshotConfig, scene_outside_frame
from vlora_va.contracts.wire import ChunkHeader, TaskRequest
from vlora_va.ingest.exposure import correct_exposure
from vlora_va.ingest.filtering import FrameFilter
from vlora_va.ingest.source import Frame

log = logging.getLogger(__name__)

PAD_VALUE = 114  # the grey YOLO-style letterbox padding: neutral for ImageNet-normalised models


def spread(n: int, k: int) -> tuple[int, ...]:
    """k of n frame indices, as a task sees its chunk and its adapter was trained (training/data.py uses this
    too): one frame is the middle one; several go evenly from the first frame to the last, so a clip spans the
    whole chunk. spread(10, 1) == (5,); spread(10, 4) == (0, 3, 6, 9); spread(n, n) == range(n)."""
    if not 1 <= k <= n:
        raise ValueError(f"cannot pick {k} of {n} frames")
    if k == 1:
        return (n // 2,)
    return tuple(int(round(i * (n - 1) / (k - 1))) for i in range(k))


def stride(n: int, k: int) -> tuple[int, ...]:
    """k of n frame indices on an even stride that runs on across chunk boundaries, as a tracker needs its frames:
    stride(10, 5) == (0, 2, 4, 6, 8), so the next chunk's first frame is 2 frames after this one's last.
    (spread(10, 5) == (0, 2, 4, 7, 9) spans the chunk instead, for clips.) Exactly even when k divides n."""
    if not 1 <= k <= n:
        raise ValueError(f"cannot pick {k} of {n} frames")
    return tuple(i * n // k for i in range(k))


def plan_chunk(n: int, tasks: tuple[TaskConfig, ...]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(chunk indices to send, per task the positions of its frames among those sent).

    Tracked tasks (`track: true`) take their frames on an even stride (`stride`). The other tasks share frames
    wherever they can: the task with the most frames spreads them over the chunk, and a task with fewer spreads
    its own over those already picked. Fewer frames are converted and sent, and the daemon runs the blocks two
    adapters leave untouched once per shared frame (shared prefix)."""
    picks: list[tuple[int, ...] | None] = [None] * len(tasks)
    for i, t in enumerate(tasks):
        if t.track:
            picks[i] = stride(n, t.frames_per_chunk)
    chosen: list[int] = sorted(set().union(*(p for p in picks if p is not None)))
    for i in sorted((i for i in range(len(tasks)) if not tasks[i].track), key=lambda i: -tasks[i].frames_per_chunk):
        k = tasks[i].frames_per_chunk
        if chosen and k <= len(chosen):
            picks[i] = tuple(chosen[j] for j in spread(len(chosen), k))
        else:
            picks[i] = spread(n, k)
            chosen = sorted(set(chosen) | set(picks[i]))
    union = tuple(sorted(set().union(*picks)))
    where = {idx: pos for pos, idx in enumerate(union)}
    return union, tuple(tuple(where[i] for i in p) for p in picks)


def letterbox(image: np.ndarray, size: int, pad_value: int = PAD_VALUE) -> tuple[np.ndarray, Letterbox]:
    """Aspect-preserving resize of an H x W x 3 uint8 image into a new C-contiguous size x size square, with an
    underexposed picture brightened (exposure.py: measured on the resized picture, the padding left out)."""
    h, w = image.shape[:2]
    new_w, new_h, lb = letterbox_geometry(w, h, size)
    out = np.full((size, size, 3), pad_value, dtype=np.uint8)
    x, y = int(lb.pad_x), int(lb.pad_y)
    shrink = new_w <= w  # area averaging to shrink (no aliasing), bilinear to enlarge
    picture = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    out[y:y + new_h, x:x + new_w] = correct_exposure(picture)
    return out, lb


@dataclass
class ReadyChunk:
    """A built chunk waiting to be sent. `frames` are fresh arrays owned by this chunk alone (they are
    handed to zmq without copying, so nothing may write to them afterwards)."""

    header: ChunkHeader
    frames: list[np.ndarray]
    jpegs: list[bytes] = field(default_factory=list)  # one per header.snapshots index


def encode_snapshot(rgb: np.ndarray, max_width: int, quality: int) -> bytes:
    """The frame as a JPEG at source resolution, scaled down to max_width where wider (event snapshots)."""
    h, w = rgb.shape[:2]
    if w > max_width:
        rgb = cv2.resize(rgb, (max_width, round(h * max_width / w)), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return buf.tobytes()


class Chunker:
    """Feed it a stream's frames with `add`; every frames_per_chunk frames it returns a ReadyChunk."""

    def __init__(self, stream: StreamConfig, image_size: int, pad_value: int = PAD_VALUE,
                 snapshots: SnapshotConfig | None = None):
        """snapshots: where the stream declares `snapshots: true`, how to encode the JPEG of each tracked frame
        (events are drawn on them)."""
        if not stream.tasks:
            raise ValueError(f"stream {stream.id}: no tasks, nothing to send")
        self.stream, self.image_size, self.pad_value = stream, image_size, pad_value
        self.n = stream.frames_per_chunk
        self.send_idx, self.task_frames = plan_chunk(self.n, stream.tasks)
        self._wanted = set(self.send_idx)
        self.snapshot = snapshots if stream.snapshots else None
        # the frames whose JPEG travels with the chunk: those of the tracked tasks, which events happen on
        self._checked: tuple[int, int] | None = None  # the frame size the lines and zones were checked against
        self._snap_idx = sorted({self.send_idx[p] for t, ps in zip(stream.tasks, self.task_frames) if t.track
                                 for p in ps}) if self.snapshot is not None else []
        self.seq = 0  # the next chunk's sequence number
        self._outage = 0.0  # media seconds missing before the chunk being built
        # A source that is not live (a file) read as fast as possible: its requests are never shed, the daemon's
        # backpressure slows the reading instead.
        self.best_effort = not stream.realtime and not SOURCES.load(stream.scheme).live
        # frame filtering (vlora_va/ingest/filtering.py): per task that asks for it
        self.filters = {t.name: FrameFilter(t.filter) for t in stream.tasks if t.filter is not None}
        self._reset()

    def _check_scene(self, size: tuple[int, int]) -> None:
        """Lines and zones must lie inside the frame: `vlora-va validate` checks files; a live stream's size is known
        only now, at its first frame (and again when it changes). Said in the log; the stream goes on."""
        self._checked = size
        for problem in scene_outside_frame(self.stream.lines, self.stream.zones, *size):
            log.error("stream %s: %s: it can never be crossed or entered there", self.stream.id, problem)

    def _reset(self) -> None:
        self._count = 0  # frames of the current chunk seen so far
        self._size: tuple[int, int] | None = None
        self._images: list[np.ndarray] = []
        self._ts: list[float] = []
        self._jpegs: list[bytes] = []
        self._letterbox: Letterbox | None = None

    def add(self, frame: Frame) -> ReadyChunk | None:
        if frame.outage_s > 0:
            if self._count:
                # A chunk spanning an outage would be no clip at all: its frames from before are lost too.
                log.info("stream %s: outage before media time %.2f s; dropping a partial chunk of %d frames",
                         self.stream.id, frame.ts, self._count)
                self._outage += self._count / self.stream.fps
                self._reset()
            self._outage += frame.outage_s
        size = (frame.width, frame.height)
        if size != self._checked:
            self._check_scene(size)
        if self._size is not None and size != self._size:
            # A camera changed resolution: one chunk must share one letterbox, so start afresh.
            log.warning("stream %s: frame size changed %dx%d -> %dx%d; dropping a partial chunk of %d frames",
                        self.stream.id, *self._size, *size, self._count)
            self._reset()
        self._size = size
        if self._count in self._wanted:
            rgb = frame.to_rgb()
            image, self._letterbox = letterbox(rgb, self.image_size, self.pad_value)
            self._images.append(image)
            self._ts.append(frame.ts)
            if self._count in self._snap_idx:
                self._jpegs.append(encode_snapshot(rgb, self.snapshot.max_width, self.snapshot.quality))
        self._count += 1
        if self._count < self.n:
            return None
        chunk = self._build(ready_wall=frame.wall)
        self.seq += 1
        self._outage = 0.0
        self._reset()
        return chunk

    def _build(self, ready_wall: float) -> ReadyChunk:
        # Which tasks reuse an earlier chunk (their frames showed nothing new): -1 for those that send.
        reuse = [self.filters[t.name].decide(self.seq, [self._images[p] for p in idx]) if t.name in self.filters
                 else -1 for t, idx in zip(self.stream.tasks, self.task_frames)]
        # Only the frames a sending task refers to travel; positions are renumbered among those.
        keep = sorted({p for r, idx in zip(reuse, self.task_frames) if r < 0 for p in idx})
        where = {p: i for i, p in enumerate(keep)}
        tasks = tuple(
            TaskRequest(name=t.name, adapter=t.adapter, frames=tuple(where[p] for p in idx) if r < 0 else (),
                        deadline_ms=t.deadline_ms, priority=t.priority, best_effort=self.best_effort,
                        reuse_chunk=r, reuse_ts=tuple(self._ts[p] for p in idx) if r >= 0 else ())
            for t, idx, r in zip(self.stream.tasks, self.task_frames, reuse))
        s = self.image_size
        header = ChunkHeader(
            stream=self.stream.id, seq=self.seq, fps=self.stream.fps, frame_ts=tuple(self._ts[p] for p in keep),
            frame_shape=(s, s, 3), orig_size=self._size, letterbox=self._letterbox, tasks=tasks,
            ready_wall=ready_wall, outage_s=round(self._outage, 3),
            snapshots=tuple(where[self.send_idx.index(i)] for i in self._snap_idx))  # tracked frames always travel
        return ReadyChunk(header, [self._images[p] for p in keep], self._jpegs)
