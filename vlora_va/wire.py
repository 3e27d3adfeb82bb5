"""The ingest → daemon wire format: one ZeroMQ multipart message per chunk.

    part 0      UTF-8 JSON header (versioned, see `ChunkHeader`)
    part 1..N   raw frame buffers, uint8 RGB, each `frame_shape` = [H, W, 3], C order

Frames are already resized/letterboxed to the model input by the ingest worker; only the frames
some task needs are sent. The daemon never trusts a message: `decode_chunk` checks everything
and raises `WireError` with a message saying what is wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

PROTOCOL_VERSION = 1
MAX_HEADER_BYTES = 1 << 20
MAX_FRAMES = 1024
MAX_FRAME_SIDE = 4096


class WireError(ValueError):
    """A message that does not follow the wire format."""


@dataclass(frozen=True)
class Letterbox:
    """How original frame pixels map into the model frame: model = orig * scale + pad."""

    scale: float
    pad_x: float
    pad_y: float

    def to_original(self, x: float, y: float) -> tuple[float, float]:
        return (x - self.pad_x) / self.scale, (y - self.pad_y) / self.scale


@dataclass(frozen=True)
class TaskRequest:
    name: str  # task name, unique within the stream
    adapter: str
    frames: tuple[int, ...]  # indices into the message's frames
    deadline_wall: float  # absolute wall-clock deadline (seconds since the epoch)


@dataclass(frozen=True)
class ChunkHeader:
    stream: str
    seq: int  # chunk sequence number within the stream, from 0
    fps: float
    frame_ts: tuple[float, ...]  # media timestamp (s) of each frame sent
    frame_shape: tuple[int, int, int]  # H, W, 3 of every frame buffer
    orig_size: tuple[int, int]  # width, height of the source frames
    letterbox: Letterbox
    tasks: tuple[TaskRequest, ...]
    ready_wall: float  # wall time the chunk's last frame was captured (the latency origin)
    sent_wall: float = 0.0
    dropped_before: int = 0  # chunks of this stream dropped by ingest since the last sent one
    v: int = PROTOCOL_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


@dataclass
class Chunk:
    header: ChunkHeader
    frames: list[np.ndarray] = field(default_factory=list)  # read-only views on the received buffers


def encode_chunk(header: ChunkHeader, frames: Sequence[np.ndarray]) -> list[Any]:
    """Multipart parts for send_multipart(copy=False). The frame arrays must not be mutated until sent."""
    if len(frames) != len(header.frame_ts):
        raise ValueError(f"{len(frames)} frames but {len(header.frame_ts)} timestamps")
    for f in frames:
        if f.shape != tuple(header.frame_shape) or f.dtype != np.uint8 or not f.flags.c_contiguous:
            raise ValueError(f"frame must be C-contiguous uint8 {header.frame_shape}, got {f.dtype} {f.shape}")
    return [header.to_json(), *frames]


def _req(d: dict, key: str, kinds: type | tuple, where: str = "header") -> Any:
    if key not in d:
        raise WireError(f"{where}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, kinds):
        raise WireError(f"{where}.{key}: expected {kinds}, got {type(v).__name__}")
    if isinstance(v, float) and not math.isfinite(v):
        raise WireError(f"{where}.{key}: not a finite number")
    return v


def _parse_header(raw: bytes) -> ChunkHeader:
    if len(raw) > MAX_HEADER_BYTES:
        raise WireError(f"header is {len(raw)} bytes, limit {MAX_HEADER_BYTES}")
    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"header is not valid UTF-8 JSON: {e}") from None
    if not isinstance(d, dict):
        raise WireError("header is not a JSON object")
    v = d.get("v")
    if v != PROTOCOL_VERSION:
        raise WireError(f"unsupported protocol version {v!r} (this daemon speaks {PROTOCOL_VERSION})")
    num = (int, float)
    shape = _req(d, "frame_shape", list)
    if len(shape) != 3 or shape[2] != 3 or not all(isinstance(s, int) and 0 < s <= MAX_FRAME_SIDE for s in shape):
        raise WireError(f"header.frame_shape: expected [H, W, 3] with sides in 1..{MAX_FRAME_SIDE}, got {shape}")
    frame_ts = _req(d, "frame_ts", list)
    if len(frame_ts) > MAX_FRAMES or not all(isinstance(t, num) and not isinstance(t, bool) for t in frame_ts):
        raise WireError("header.frame_ts: expected a list of numbers")
    orig = _req(d, "orig_size", list)
    if len(orig) != 2 or not all(isinstance(s, int) and s > 0 for s in orig):
        raise WireError(f"header.orig_size: expected [width, height], got {orig}")
    lb = _req(d, "letterbox", dict)
    letterbox = Letterbox(float(_req(lb, "scale", num, "letterbox")), float(_req(lb, "pad_x", num, "letterbox")),
                          float(_req(lb, "pad_y", num, "letterbox")))
    if letterbox.scale <= 0:
        raise WireError("header.letterbox.scale: must be > 0")
    tasks = []
    for i, t in enumerate(_req(d, "tasks", list)):
        where = f"header.tasks[{i}]"
        if not isinstance(t, dict):
            raise WireError(f"{where}: expected an object")
        frames = _req(t, "frames", list, where)
        if not frames or not all(isinstance(j, int) and 0 <= j < len(frame_ts) for j in frames):
            raise WireError(f"{where}.frames: expected indices into the {len(frame_ts)} frames sent, got {frames}")
        tasks.append(TaskRequest(_req(t, "name", str, where), _req(t, "adapter", str, where), tuple(frames),
                                 float(_req(t, "deadline_wall", num, where))))
    stream = _req(d, "stream", str)
    if not stream:
        raise WireError("header.stream: empty stream id")
    seq = _req(d, "seq", int)
    if seq < 0:
        raise WireError(f"header.seq: must be >= 0, got {seq}")
    return ChunkHeader(
        stream=stream, seq=seq, fps=float(_req(d, "fps", num)),
        frame_ts=tuple(float(t) for t in frame_ts), frame_shape=tuple(shape), orig_size=tuple(orig),
        letterbox=letterbox, tasks=tuple(tasks), ready_wall=float(_req(d, "ready_wall", num)),
        sent_wall=float(d.get("sent_wall", 0.0)), dropped_before=int(d.get("dropped_before", 0)),
    )


def decode_chunk(parts: Sequence[Any]) -> Chunk:
    """Parse and check a received multipart message (bytes, memoryviews or zmq.Frame objects)."""
    if not parts:
        raise WireError("empty message")
    buffers = [p.buffer if hasattr(p, "buffer") else memoryview(p) for p in parts]
    header = _parse_header(buffers[0])
    n = len(header.frame_ts)
    if len(buffers) - 1 != n:
        raise WireError(f"header announces {n} frames but the message carries {len(buffers) - 1} frame parts")
    h, w, c = header.frame_shape
    frames = []
    for i, buf in enumerate(buffers[1:]):
        if buf.nbytes != h * w * c:
            raise WireError(f"frame {i}: {buf.nbytes} bytes, expected {h}x{w}x{c} = {h * w * c} (truncated?)")
        frames.append(np.frombuffer(buf, dtype=np.uint8).reshape(h, w, c))
    return Chunk(header, frames)
