"""The ingest → daemon wire format: one ZeroMQ multipart message per chunk, and a one-part status now and then.

    part 0      UTF-8 JSON header (versioned, see `ChunkHeader`; every field declared in `HEADER_SCHEMA`)
    part 1..N   raw frame buffers, uint8 RGB, each `frame_shape` = [H, W, 3], C order
    part N+1..  JPEGs of the frames `snapshots` names (source resolution, for event snapshots), if any

    status      one part, UTF-8 JSON {"v", "kind": "status", "stream", "state", "frame_age_s", "sent_wall"}: ingest
                says every HEARTBEAT_S whether each stream's source delivers frames (`SourceStatus`), so the
                daemon tells a live stream that stopped from one that ended

Frames are already resized/letterboxed to the model input by the ingest worker; only the frames some task
needs are sent. Times are the SENDER's wall clock: `ready_wall` (the chunk's last frame captured) and
`sent_wall` (handed to ZeroMQ); deadlines travel as budgets relative to `ready_wall` (`deadline_ms`), so two
hosts' clocks are never compared directly (the daemon measures the offset, see vlora_va/serving/transport.py).

The daemon never trusts a message: `decode_chunk` checks every field against the schema below and raises
`WireError` naming the field and the problem.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request

PROTOCOL_VERSION = 2
MAX_HEADER_BYTES = 64 * 1024
MAX_FRAMES = 128  # frames in one chunk message (a 4-s chunk at 30 fps, every frame sent)
MAX_TASKS = 32  # tasks in one chunk message
MAX_FRAME_SIDE = 2048
MAX_SEQ = 2**53  # counters stay exact as JSON numbers
MAX_WALL = 1e11  # seconds since the epoch (year 5138): anything larger is garbage
MAX_MEDIA_S = 1e9
STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # used with fullmatch: nothing before or after
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_JPEG_BYTES = 1024 * 1024  # one snapshot JPEG (1280 x 720 at quality 85 is ~0.2 MB)
MAX_PARTS = 2 * MAX_FRAMES + 1  # header, frames, and a JPEG per frame at most
HEARTBEAT_S = 0.25  # how often ingest sends each stream's SourceStatus
SOURCE_STATES = ("live", "ended", "failed")  # delivering (or trying to) | ended by itself | given up


class WireError(ValueError):
    """A message that does not follow the wire format."""


@dataclass(frozen=True)
class TaskRequest:
    name: str  # task name, unique within the stream
    adapter: str
    frames: tuple[int, ...]  # indices into the message's frames
    deadline_ms: float  # latency budget from the chunk's ready_wall to its result
    priority: int = 0  # higher is served first under overload
    # Not live (a file read as fast as possible): never shed, served when live work leaves room; its
    # source waits instead (backpressure). The deadline is still reported.
    best_effort: bool = False
    # Frame filtering (contracts/filtering.py): >= 0, the task's frames showed nothing new since chunk reuse_chunk, so
    # none is sent (frames is empty) and its row is that chunk's result; reuse_ts are the media times of the frames it
    # would have had (the row's frame_ts). Left out of the JSON when unused.
    reuse_chunk: int = -1
    reuse_ts: tuple[float, ...] = ()


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
    ready_wall: float  # sender's wall time when the chunk's last frame was captured (the latency origin)
    sent_wall: float = 0.0  # sender's wall time when the message was handed to ZeroMQ
    dropped_before: int = 0  # chunks of this stream dropped by ingest since the last sent one
    # Media seconds this stream's source did not deliver since the last sent chunk (a camera outage: an RTSP
    # reconnect, or a stall longer than a second); 0 normally. Left out of the JSON when 0, so a v2 daemon
    # older than this field still reads every chunk that follows no outage.
    outage_s: float = 0.0
    reconnects: int = 0  # this stream's source reconnects so far (ingest's count; left out when 0)
    decoded: int = 0  # source frames this stream's ingest decoded so far (left out when 0)
    snapshots: tuple[int, ...] = ()  # indices into frame_ts of the frames whose JPEG follows the frames (or none)
    v: int = PROTOCOL_VERSION

    def to_json(self) -> bytes:
        d = asdict(self)
        for optional in ("outage_s", "reconnects", "decoded", "snapshots"):
            if not d[optional]:
                del d[optional]
        for t in d["tasks"]:
            if t["reuse_chunk"] < 0:
                del t["reuse_chunk"], t["reuse_ts"]
        return json.dumps(d, separators=(",", ":")).encode()


@dataclass(frozen=True)
class SourceStatus:
    """Ingest's word on one stream's source: `state` (SOURCE_STATES) and how long ago its last frame came."""

    stream: str
    state: str
    frame_age_s: float  # seconds since the source last delivered a frame (at sent_wall); large when never
    sent_wall: float
    kind: str = "status"
    v: int = PROTOCOL_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


@dataclass
class Chunk:
    header: ChunkHeader
    frames: list[np.ndarray] = field(default_factory=list)  # read-only views on the received buffers
    jpegs: dict[float, bytes] = field(default_factory=dict)  # media time -> JPEG of that frame (snapshots)

    def requests(self, received: float, clock_offset: float = 0.0) -> list[Request]:
        """One Request per task of the chunk. clock_offset: daemon clock minus the sender's clock (seconds), so
        that ready / deadline are in the daemon's clock. A chunk was complete at its source no later than the
        daemon received it: an offset estimated a few ms too high (it is robust, not exact) must not place ready
        after received, or a served row's total latency would come out shorter than its compute time."""
        h = self.header
        ready = min(h.ready_wall + clock_offset, received)
        return [
            Request(stream=h.stream, seq=h.seq, task=t.name, adapter=t.adapter,
                    frames=[self.frames[i] for i in t.frames],
                    frame_ts=list(t.reuse_ts) if t.reuse_chunk >= 0 else [h.frame_ts[i] for i in t.frames],
                    letterbox=h.letterbox, orig_size=h.orig_size, ready=ready, received=received,
                    deadline=ready + t.deadline_ms / 1000.0, priority=t.priority, dropped_before=h.dropped_before,
                    best_effort=t.best_effort, outage_before_s=h.outage_s, jpegs=self.jpegs,
                    reuse_chunk=t.reuse_chunk)
            for t in h.tasks
        ]


def encode_chunk(header: ChunkHeader, frames: Sequence[np.ndarray], jpegs: Sequence[bytes] = ()) -> list[Any]:
    """Multipart parts for send_multipart(copy=False). The frame arrays must not be mutated until sent. jpegs: one
    per index in header.snapshots."""
    if len(frames) != len(header.frame_ts):
        raise ValueError(f"{len(frames)} frames but {len(header.frame_ts)} timestamps")
    if len(jpegs) != len(header.snapshots):
        raise ValueError(f"{len(jpegs)} JPEGs but {len(header.snapshots)} snapshot indices")
    for f in frames:
        if f.shape != tuple(header.frame_shape) or f.dtype != np.uint8 or not f.flags.c_contiguous:
            raise ValueError(f"frame must be C-contiguous uint8 {header.frame_shape}, got {f.dtype} {f.shape}")
    return [header.to_json(), *frames, *jpegs]


# ---------------------------------------------------------------- the header schema
# Each checker takes (value, where) and returns the Python value, or raises WireError naming `where`.
Check = Callable[[Any, str], Any]


def _int(lo: int, hi: int) -> Check:
    def check(v, where):
        if isinstance(v, bool) or not isinstance(v, int):
            raise WireError(f"{where}: expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            shown = v if abs(v) < 10**18 else f"an integer of {len(str(abs(v)))} digits"
            raise WireError(f"{where}: must be in [{lo}, {hi}], got {shown}")
        return v
    return check


def _num(lo: float, hi: float) -> Check:
    def check(v, where):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise WireError(f"{where}: expected a number, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise WireError(f"{where}: not a finite number")
        if not lo <= v <= hi:  # compared before float(): a huge int must not overflow
            raise WireError(f"{where}: must be in [{lo:g}, {hi:g}], got {v:.6g}" if isinstance(v, float)
                            else f"{where}: must be in [{lo:g}, {hi:g}], got an integer of {len(str(v))} digits")
        return float(v)
    return check


def _text(pattern: re.Pattern, what: str) -> Check:
    def check(v, where):
        if not isinstance(v, str) or not pattern.fullmatch(v):
            shown = repr(v)[:40] if isinstance(v, str) else type(v).__name__
            raise WireError(f"{where}: expected {what}, got {shown}")
        return v
    return check


def _bool(v, where):
    if not isinstance(v, bool):
        raise WireError(f"{where}: expected true or false, got {type(v).__name__}")
    return v


def _const(value: Any) -> Check:
    def check(v, where):
        if type(v) is not type(value) or v != value:
            raise WireError(f"{where}: must be {value!r}, got {v!r}"[:200])
        return v
    return check


def _list(item: Check, min_len: int, max_len: int) -> Check:
    def check(v, where):
        if not isinstance(v, list):
            raise WireError(f"{where}: expected a list, got {type(v).__name__}")
        if not min_len <= len(v) <= max_len:
            raise WireError(f"{where}: expected {min_len} to {max_len} items, got {len(v)}")
        return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(v))
    return check


def _obj(fields: dict[str, Check], optional: dict[str, Any] | None = None) -> Check:
    """A JSON object with exactly these keys (those in `optional` may be absent: their default is used)."""
    optional = optional or {}

    def check(v, where):
        if not isinstance(v, dict):
            raise WireError(f"{where}: expected an object, got {type(v).__name__}")
        unknown = sorted(set(v) - set(fields))
        if unknown:
            raise WireError(f"{where}: unknown field {str(unknown[0])[:40]!r}")
        out = {}
        for key, checker in fields.items():
            if key in v:
                out[key] = checker(v[key], f"{where}.{key}")
            elif key in optional:
                out[key] = optional[key]
            else:
                raise WireError(f"{where}: missing field {key!r}")
        return out
    return check


TASK_SCHEMA = _obj({
    "name": _text(NAME, "a task name of 1-64 letters, digits, '_.-'"),
    "adapter": _text(NAME, "an adapter name of 1-64 letters, digits, '_.-'"),
    "frames": _list(_int(0, MAX_FRAMES - 1), 0, MAX_FRAMES),  # empty only for a reused chunk (_relations)
    "deadline_ms": _num(1.0, 3_600_000.0),
    "priority": _int(-1000, 1000),
    "best_effort": _bool,
    "reuse_chunk": _int(-1, MAX_SEQ),
    "reuse_ts": _list(_num(0.0, MAX_MEDIA_S), 0, MAX_FRAMES),
}, optional={"priority": 0, "best_effort": False, "reuse_chunk": -1, "reuse_ts": ()})

HEADER_SCHEMA = _obj({
    "v": _const(PROTOCOL_VERSION),
    "stream": _text(STREAM_ID, "a stream id of 1-64 letters, digits, '_.-'"),
    "seq": _int(0, MAX_SEQ),
    "fps": _num(0.01, 1000.0),
    "frame_ts": _list(_num(0.0, MAX_MEDIA_S), 0, MAX_FRAMES),  # none when every task reuses a chunk
    "frame_shape": _list(_int(1, MAX_FRAME_SIDE), 3, 3),
    "orig_size": _list(_int(1, 16384), 2, 2),
    "letterbox": _obj({"scale": _num(1e-4, 1e4), "pad_x": _num(0.0, MAX_FRAME_SIDE), "pad_y": _num(0.0, MAX_FRAME_SIDE)}),
    "tasks": _list(TASK_SCHEMA, 1, MAX_TASKS),
    "ready_wall": _num(0.0, MAX_WALL),
    "sent_wall": _num(0.0, MAX_WALL),
    "dropped_before": _int(0, MAX_SEQ),
    "outage_s": _num(0.0, MAX_MEDIA_S),
    "reconnects": _int(0, MAX_SEQ),
    "decoded": _int(0, MAX_SEQ),
    "snapshots": _list(_int(0, MAX_FRAMES - 1), 0, MAX_FRAMES),
}, optional={"dropped_before": 0, "outage_s": 0.0, "reconnects": 0, "decoded": 0, "snapshots": ()})

STATUS_SCHEMA = _obj({
    "v": _const(PROTOCOL_VERSION),
    "kind": _const("status"),
    "stream": _text(STREAM_ID, "a stream id of 1-64 letters, digits, '_.-'"),
    "state": _text(re.compile("|".join(SOURCE_STATES)), f"one of {', '.join(SOURCE_STATES)}"),
    "frame_age_s": _num(0.0, MAX_WALL),
    "sent_wall": _num(0.0, MAX_WALL),
})


def _relations(d: dict) -> None:
    """What no single field can say: sizes that must agree, indices that must point somewhere."""
    if d["frame_shape"][2] != 3:
        raise WireError(f"header.frame_shape: expected [H, W, 3], got {list(d['frame_shape'])}")
    ts = d["frame_ts"]
    if any(b < a for a, b in zip(ts, ts[1:])):
        raise WireError("header.frame_ts: timestamps must not decrease")
    names = set()
    for i, t in enumerate(d["tasks"]):
        where = f"header.tasks[{i}]"
        if t["name"] in names:
            raise WireError(f"{where}.name: duplicate task {t['name']!r} in one chunk")
        names.add(t["name"])
        bad = [j for j in t["frames"] if j >= len(ts)]
        if bad or len(set(t["frames"])) != len(t["frames"]):
            raise WireError(f"{where}.frames: expected distinct indices into the {len(ts)} frames sent, "
                            f"got {list(t['frames'])[:8]}")
        if t["reuse_chunk"] >= 0:
            if t["frames"] or not t["reuse_ts"] or t["reuse_chunk"] >= d["seq"]:
                raise WireError(f"{where}: a reused chunk has no frames, the media times of those it stands for "
                                f"(reuse_ts), and an earlier chunk (reuse_chunk < seq)")
        elif not t["frames"] or t["reuse_ts"]:
            raise WireError(f"{where}.frames: expected 1 to {MAX_FRAMES} frames (or reuse_chunk)")
    snaps = d["snapshots"]
    if any(j >= len(ts) for j in snaps) or len(set(snaps)) != len(snaps):
        raise WireError(f"header.snapshots: expected distinct indices into the {len(ts)} frames sent, "
                        f"got {list(snaps)[:8]}")


def parse_header(raw) -> ChunkHeader:
    d = _json_object(raw, "header")
    if d.get("v") != PROTOCOL_VERSION:
        raise WireError(f"unsupported protocol version {str(d.get('v'))[:20]} (this daemon speaks "
                        f"{PROTOCOL_VERSION}: run ingest and daemon from the same release)")
    d = HEADER_SCHEMA(d, "header")
    _relations(d)
    return ChunkHeader(
        stream=d["stream"], seq=d["seq"], fps=d["fps"], frame_ts=d["frame_ts"], frame_shape=d["frame_shape"],
        orig_size=d["orig_size"], letterbox=Letterbox(**d["letterbox"]),
        tasks=tuple(TaskRequest(**t) for t in d["tasks"]), ready_wall=d["ready_wall"], sent_wall=d["sent_wall"],
        dropped_before=d["dropped_before"], outage_s=d["outage_s"], reconnects=d["reconnects"], decoded=d["decoded"],
        snapshots=tuple(d["snapshots"]))


def _json_object(raw, what: str) -> dict:
    """The JSON object of a message part (a header, a status), its size bounded; WireError naming `what`."""
    if len(raw) > MAX_HEADER_BYTES:
        raise WireError(f"{what} is {len(raw)} bytes, limit {MAX_HEADER_BYTES}")
    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError(f"{what} is not valid UTF-8 JSON: {str(e)[:120]}") from None
    if not isinstance(d, dict):
        raise WireError(f"{what} is not a JSON object")
    return d


def decode_message(parts: Sequence[Any]) -> Chunk | SourceStatus:
    """A chunk, or a one-part status (its JSON says "kind": "status"); raises WireError like decode_chunk."""
    if len(parts) == 1:
        raw = parts[0].buffer if hasattr(parts[0], "buffer") else memoryview(parts[0])
        d = _json_object(raw, "message")
        if d.get("kind") == "status":
            if d.get("v") != PROTOCOL_VERSION:
                raise WireError(f"unsupported protocol version {str(d.get('v'))[:20]} (this daemon speaks "
                                f"{PROTOCOL_VERSION})")
            return SourceStatus(**STATUS_SCHEMA(d, "status"))
    return decode_chunk(parts)


def decode_chunk(parts: Sequence[Any]) -> Chunk:
    """Parse and check a received multipart message (bytes, memoryviews or zmq.Frame objects)."""
    if not parts:
        raise WireError("empty message")
    if len(parts) > MAX_PARTS:
        raise WireError(f"message has {len(parts)} parts, limit {MAX_PARTS}")
    buffers = [p.buffer if hasattr(p, "buffer") else memoryview(p) for p in parts]
    header = parse_header(buffers[0])
    n = len(header.frame_ts)
    if len(buffers) - 1 != n + len(header.snapshots):
        raise WireError(f"header announces {n} frames and {len(header.snapshots)} snapshots but the message carries "
                        f"{len(buffers) - 1} parts after the header")
    h, w, c = header.frame_shape
    frames = []
    for i, buf in enumerate(buffers[1:n + 1]):
        if buf.nbytes != h * w * c:
            raise WireError(f"frame {i}: {buf.nbytes} bytes, expected {h}x{w}x{c} = {h * w * c} (truncated?)")
        frames.append(np.frombuffer(buf, dtype=np.uint8).reshape(h, w, c))
    jpegs = {}
    for i, buf in zip(header.snapshots, buffers[n + 1:]):
        if not 0 < buf.nbytes <= MAX_JPEG_BYTES or bytes(buf[:2]) != b"\xff\xd8":
            raise WireError(f"snapshot of frame {i}: expected a JPEG of at most {MAX_JPEG_BYTES} bytes, got "
                            f"{buf.nbytes} bytes")
        jpegs[header.frame_ts[i]] = bytes(buf)
    return Chunk(header, frames, jpegs)


def largest_part_bytes(image_size: int, snapshots: bool = False) -> int:
    """The largest legal message part for frames of image_size (and snapshot JPEGs, where some stream sends
    them): ZeroMQ's per-part size limit."""
    return max(MAX_HEADER_BYTES, image_size * image_size * 3, MAX_JPEG_BYTES if snapshots else 0)
