"""vlora_va.contracts.wire: the v2 chunk message. Round trips, and a table of every way a header can break the schema:
each must be a WireError whose message names the field (never an OverflowError, KeyError or TypeError)."""

import json
import re

import numpy as np
import pytest

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.wire import (
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    MAX_PARTS,
    MAX_TASKS,
    PROTOCOL_VERSION,
    ChunkHeader,
    TaskRequest,
    WireError,
    decode_chunk,
    encode_chunk,
    largest_part_bytes,
    parse_header,
)

SIDE = 28


def make_header(n_frames=3, side=SIDE, **kw):
    fields = dict(stream="cam", seq=7, fps=10.0, frame_ts=tuple(0.1 * i for i in range(n_frames)),
                  frame_shape=(side, side, 3), orig_size=(640, 480), letterbox=Letterbox(side / 640, 0.0, 3.5),
                  tasks=(TaskRequest("detect", "detect", (0, 2), 123.5, priority=2),
                         TaskRequest("act", "actions", (0, 1, 2), 124.0)),
                  ready_wall=100.0, sent_wall=100.1, dropped_before=2)
    fields.update(kw)
    return ChunkHeader(**fields)


def frames(n=3, side=SIDE):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 255, (side, side, 3), dtype=np.uint8) for _ in range(n)]


def header_dict() -> dict:
    return json.loads(make_header().to_json())


def parts_of(d: dict, n_frames: int = 3) -> list[bytes]:
    return [json.dumps(d).encode(), *(f.tobytes() for f in frames(n_frames))]


# ---------------------------------------------------------------- what must work


def test_round_trip_keeps_every_field_and_pixel():
    h, fs = make_header(), frames()
    chunk = decode_chunk([bytes(memoryview(p)) for p in encode_chunk(h, fs)])
    assert chunk.header == h
    assert chunk.header.v == PROTOCOL_VERSION == 2
    assert chunk.header.tasks[0] == TaskRequest("detect", "detect", (0, 2), 123.5, 2)
    assert all(np.array_equal(a, b) for a, b in zip(chunk.frames, fs))
    assert all(f.shape == (SIDE, SIDE, 3) and f.dtype == np.uint8 for f in chunk.frames)


def test_header_json_carries_relative_deadlines_and_priorities():
    d = header_dict()
    assert d["v"] == 2 and d["sent_wall"] == 100.1
    assert d["tasks"][0] == {"name": "detect", "adapter": "detect", "frames": [0, 2], "deadline_ms": 123.5,
                             "priority": 2, "best_effort": False}
    assert "deadline_wall" not in json.dumps(d)


def test_optional_fields_take_their_defaults():
    d = header_dict()
    for t in d["tasks"]:
        del t["priority"]
        del t["best_effort"]
    del d["dropped_before"]
    h = parse_header(json.dumps(d).encode())
    assert [t.priority for t in h.tasks] == [0, 0]
    assert [t.best_effort for t in h.tasks] == [False, False]
    assert h.dropped_before == 0


@pytest.mark.parametrize("outage_s, in_json", [(0.0, False), (12.345, True), (1e9, True)])
def test_outage_s_round_trips_and_is_left_out_of_the_json_when_zero(outage_s, in_json):
    """Media seconds the source missed before the chunk: sent only after an outage (so a daemon from before
    this optional field still reads every other chunk); absent means 0, a JSON integer becomes a float."""
    h = make_header(outage_s=outage_s)
    assert ("outage_s" in json.loads(h.to_json())) is in_json
    assert decode_chunk(encode_chunk(h, frames())).header == h
    d = header_dict()
    d["outage_s"] = 3
    assert parse_header(json.dumps(d).encode()).outage_s == 3.0
    assert type(parse_header(json.dumps(d).encode()).outage_s) is float


def test_integers_in_number_fields_become_floats():
    d = header_dict()
    d.update(fps=25, ready_wall=100, sent_wall=101, frame_ts=[0, 1, 2])
    d["tasks"][0]["deadline_ms"] = 500
    d["letterbox"] = {"scale": 1, "pad_x": 0, "pad_y": 2}
    h = parse_header(json.dumps(d).encode())
    assert (h.fps, h.ready_wall, h.sent_wall, h.tasks[0].deadline_ms) == (25.0, 100.0, 101.0, 500.0)
    assert all(type(v) is float for v in (h.fps, h.ready_wall, h.sent_wall, h.tasks[0].deadline_ms, *h.frame_ts,
                                          h.letterbox.scale, h.letterbox.pad_x, h.letterbox.pad_y))


def test_equal_timestamps_and_the_largest_legal_message_are_accepted():
    n = MAX_FRAMES
    h = make_header(n_frames=n, side=2, frame_ts=(0.5,) * n,
                    tasks=tuple(TaskRequest(f"t{i}", "a", (i,), 1.0) for i in range(MAX_TASKS - 1))
                    + (TaskRequest("all", "a", tuple(range(n)), 3_600_000.0, priority=-1000),))
    chunk = decode_chunk(encode_chunk(h, frames(n, side=2)))
    assert len(chunk.frames) == n and chunk.header == h


def test_decode_accepts_zmq_frames_and_memoryviews():
    class FakeZmqFrame:  # what recv_multipart(copy=False) returns: an object with .buffer
        def __init__(self, b):
            self.buffer = memoryview(b)

    h, fs = make_header(), frames()
    parts = [bytes(memoryview(p)) for p in encode_chunk(h, fs)]
    for wrapped in ([FakeZmqFrame(p) for p in parts], [memoryview(p) for p in parts]):
        chunk = decode_chunk(wrapped)
        assert chunk.header == h and np.array_equal(chunk.frames[2], fs[2])


def test_encode_rejects_frames_that_do_not_match_the_header():
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        encode_chunk(make_header(), [f.astype(np.float32) for f in frames()])
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        encode_chunk(make_header(), [np.asfortranarray(f) for f in frames()])
    with pytest.raises(ValueError, match="2 frames but 3 timestamps"):
        encode_chunk(make_header(), frames(2))


def test_largest_part_bytes_covers_header_and_frames():
    assert largest_part_bytes(224) == max(MAX_HEADER_BYTES, 224 * 224 * 3) == 150528
    assert largest_part_bytes(14) == MAX_HEADER_BYTES


# ---------------------------------------------------------------- the schema table
DROP = object()  # remove the key


def _set(d, path: str, value):
    """Set (or DROP) d[path] where path is 'a.0.b' (list indices as numbers)."""
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in parents:
        d = d[k]
    if value is DROP:
        del d[last]
    else:
        d[last] = value


HUGE = 10**400  # a legal JSON number no float can hold

# (field path to change, new value, literal text the WireError must contain)
SCHEMA_CASES = [
    # wrong types, every header field
    ("stream", 5, "header.stream: expected a stream id"),
    ("stream", None, "header.stream: expected a stream id"),
    ("seq", "7", "header.seq: expected an integer, got str"),
    ("fps", "10", "header.fps: expected a number, got str"),
    ("fps", [10], "header.fps: expected a number, got list"),
    ("frame_ts", "0.1", "header.frame_ts: expected a list, got str"),
    ("frame_ts", [0.0, "0.1", 0.2], "header.frame_ts[1]: expected a number, got str"),
    ("frame_shape", {"h": 28}, "header.frame_shape: expected a list, got dict"),
    ("frame_shape", [28, "28", 3], "header.frame_shape[1]: expected an integer, got str"),
    ("orig_size", "640x480", "header.orig_size: expected a list, got str"),
    ("orig_size", [640.0, 480], "header.orig_size[0]: expected an integer, got float"),
    ("letterbox", [0.04, 0, 3.5], "header.letterbox: expected an object, got list"),
    ("letterbox.scale", "0.04", "header.letterbox.scale: expected a number, got str"),
    ("letterbox.pad_x", None, "header.letterbox.pad_x: expected a number, got NoneType"),
    ("tasks", {"name": "detect"}, "header.tasks: expected a list, got dict"),
    ("tasks.0", "detect", "header.tasks[0]: expected an object, got str"),
    ("ready_wall", "soon", "header.ready_wall: expected a number, got str"),
    ("sent_wall", None, "header.sent_wall: expected a number, got NoneType"),
    ("dropped_before", "2", "header.dropped_before: expected an integer, got str"),
    ("outage_s", "3.5", "header.outage_s: expected a number, got str"),
    ("outage_s", None, "header.outage_s: expected a number, got NoneType"),
    ("tasks.0.name", 3, "header.tasks[0].name: expected a task name"),
    ("tasks.1.adapter", None, "header.tasks[1].adapter: expected an adapter name"),
    ("tasks.0.frames", 0, "header.tasks[0].frames: expected a list, got int"),
    ("tasks.0.deadline_ms", "100", "header.tasks[0].deadline_ms: expected a number, got str"),
    ("tasks.0.priority", "high", "header.tasks[0].priority: expected an integer, got str"),
    ("v", 2.0, "header.v: must be 2, got 2.0"),
    # huge integers in number fields: a WireError, never an OverflowError from float()
    ("fps", HUGE, "header.fps: must be in [0.01, 1000], got an integer of 401 digits"),
    ("ready_wall", HUGE, "header.ready_wall: must be in"),
    ("sent_wall", -HUGE, "header.sent_wall: must be in"),
    ("frame_ts.0", HUGE, "header.frame_ts[0]: must be in"),
    ("letterbox.scale", HUGE, "header.letterbox.scale: must be in"),
    ("tasks.0.deadline_ms", HUGE, "header.tasks[0].deadline_ms: must be in"),
    ("seq", HUGE, "header.seq: must be in [0, 9007199254740992]"),
    ("tasks.0.priority", -HUGE, "header.tasks[0].priority: must be in [-1000, 1000]"),
    ("outage_s", HUGE, "header.outage_s: must be in [0, 1e+09], got an integer of 401 digits"),
    # not finite
    ("fps", float("nan"), "header.fps: not a finite number"),
    ("ready_wall", float("inf"), "header.ready_wall: not a finite number"),
    ("sent_wall", float("-inf"), "header.sent_wall: not a finite number"),
    ("frame_ts.1", float("nan"), "header.frame_ts[1]: not a finite number"),
    ("letterbox.pad_y", float("inf"), "header.letterbox.pad_y: not a finite number"),
    ("tasks.1.deadline_ms", float("nan"), "header.tasks[1].deadline_ms: not a finite number"),
    ("outage_s", float("nan"), "header.outage_s: not a finite number"),
    ("outage_s", float("inf"), "header.outage_s: not a finite number"),
    # out of range
    ("fps", 0, "header.fps: must be in"),
    ("ready_wall", -1.0, "header.ready_wall: must be in"),
    ("ready_wall", 1e12, "header.ready_wall: must be in"),
    ("frame_ts.0", -0.5, "header.frame_ts[0]: must be in"),
    ("letterbox.scale", 0.0, "header.letterbox.scale: must be in"),
    ("frame_shape", [28, 4096, 3], "header.frame_shape[1]: must be in [1, 2048], got 4096"),
    ("frame_shape", [0, 28, 3], "header.frame_shape[0]: must be in [1, 2048], got 0"),
    ("orig_size", [0, 480], "header.orig_size[0]: must be in"),
    ("tasks.0.deadline_ms", 0.5, "header.tasks[0].deadline_ms: must be in"),
    ("tasks.0.deadline_ms", 3_600_001, "header.tasks[0].deadline_ms: must be in"),
    ("tasks.0.priority", 1001, "header.tasks[0].priority: must be in [-1000, 1000], got 1001"),
    ("outage_s", -0.5, "header.outage_s: must be in [0, 1e+09], got -0.5"),
    ("outage_s", 2e9, "header.outage_s: must be in [0, 1e+09], got 2e+09"),
    # counters: negative, not integers
    ("seq", -1, "header.seq: must be in [0, "),
    ("dropped_before", -3, "header.dropped_before: must be in [0, "),
    ("seq", 7.5, "header.seq: expected an integer, got float"),
    ("seq", 7.0, "header.seq: expected an integer, got float"),
    ("dropped_before", 2.0, "header.dropped_before: expected an integer, got float"),
    ("tasks.0.frames", [0, 1.0], "header.tasks[0].frames[1]: expected an integer, got float"),
    # bools where numbers are expected (bool is an int in Python, not on the wire)
    ("seq", True, "header.seq: expected an integer, got bool"),
    ("dropped_before", False, "header.dropped_before: expected an integer, got bool"),
    ("fps", True, "header.fps: expected a number, got bool"),
    ("ready_wall", True, "header.ready_wall: expected a number, got bool"),
    ("frame_shape", [28, 28, True], "header.frame_shape[2]: expected an integer, got bool"),
    ("tasks.0.frames", [False], "header.tasks[0].frames[0]: expected an integer, got bool"),
    ("tasks.0.deadline_ms", True, "header.tasks[0].deadline_ms: expected a number, got bool"),
    ("outage_s", True, "header.outage_s: expected a number, got bool"),
    ("tasks.0.priority", True, "header.tasks[0].priority: expected an integer, got bool"),
    ("letterbox.scale", True, "header.letterbox.scale: expected a number, got bool"),
    # strings: too long, empty, outside the pattern
    ("stream", "x" * 65, "header.stream: expected a stream id"),
    ("stream", "", "header.stream: expected a stream id"),
    ("stream", "cam 1", "header.stream: expected a stream id"),
    ("stream", "cam/../1", "header.stream: expected a stream id"),
    ("stream", "caméra", "header.stream: expected a stream id"),
    ("tasks.0.name", "n" * 65, "header.tasks[0].name: expected a task name"),
    ("tasks.0.name", "", "header.tasks[0].name: expected a task name"),
    ("tasks.1.adapter", "../../etc/passwd", "header.tasks[1].adapter: expected an adapter name"),
    ("tasks.1.adapter", "a" * 65, "header.tasks[1].adapter: expected an adapter name"),
    # lists: lengths, indices, order
    ("frame_shape", [28, 28], "header.frame_shape: expected 3 to 3 items, got 2"),
    ("frame_shape", [28, 28, 4], "header.frame_shape: expected [H, W, 3], got [28, 28, 4]"),
    ("orig_size", [640, 480, 1], "header.orig_size: expected 2 to 2 items, got 3"),
    # no frames at all only when every task reuses an earlier chunk (frame filtering)
    ("frame_ts", [], "header.tasks[0].frames: expected distinct indices into the 0 frames sent"),
    ("frame_ts", [0.0] * (MAX_FRAMES + 1), "header.frame_ts: expected 0 to 128 items, got 129"),
    ("frame_ts", [0.0, 0.2, 0.1], "header.frame_ts: timestamps must not decrease"),
    ("tasks", [], "header.tasks: expected 1 to 32 items, got 0"),
    ("tasks", [{"name": f"t{i}", "adapter": "a", "frames": [0], "deadline_ms": 100.0} for i in range(MAX_TASKS + 1)],
     "header.tasks: expected 1 to 32 items, got 33"),
    ("tasks.1.name", "detect", "header.tasks[1].name: duplicate task 'detect' in one chunk"),
    ("tasks.0.frames", [0, 3], "header.tasks[0].frames: expected distinct indices into the 3 frames sent, got [0, 3]"),
    ("tasks.0.frames", [2, 2], "header.tasks[0].frames: expected distinct indices into the 3 frames sent, got [2, 2]"),
    ("tasks.0.frames", [-1], "header.tasks[0].frames[0]: must be in [0, 127], got -1"),
    ("tasks.0.frames", [MAX_FRAMES], "header.tasks[0].frames[0]: must be in [0, 127], got 128"),
    ("tasks.0.frames", [], "header.tasks[0].frames: expected 1 to 128 frames (or reuse_chunk)"),
    # a reused chunk (frame filtering): no frames, the times it stands for, an earlier chunk
    ("tasks.0.reuse_chunk", -2, "header.tasks[0].reuse_chunk: must be in [-1, 9007199254740992], got -2"),
    ("tasks.0.reuse_chunk", 0, "header.tasks[0]: a reused chunk has no frames"),
    ("tasks.0.reuse_ts", [1.0], "header.tasks[0].frames: expected 1 to 128 frames (or reuse_chunk)"),
    # unknown fields (among them v1's deadline_wall), missing required fields
    ("deadline_wall", 101.0, "header: unknown field 'deadline_wall'"),
    ("tasks.0.deadline_wall", 101.0, "header.tasks[0]: unknown field 'deadline_wall'"),
    ("letterbox.rotate", 0, "header.letterbox: unknown field 'rotate'"),
    *[(key, DROP, f"header: missing field '{key}'")
      for key in ("stream", "seq", "fps", "frame_ts", "frame_shape", "orig_size", "letterbox", "tasks",
                  "ready_wall", "sent_wall")],
    *[(f"tasks.1.{key}", DROP, f"header.tasks[1]: missing field '{key}'")
      for key in ("name", "adapter", "frames", "deadline_ms")],
    ("letterbox.pad_y", DROP, "header.letterbox: missing field 'pad_y'"),
    # other protocol versions
    ("v", 1, "unsupported protocol version 1"),
    ("v", 3, "unsupported protocol version 3"),
    ("v", "2", "unsupported protocol version 2"),
    ("v", DROP, "unsupported protocol version None"),
]


@pytest.mark.parametrize("path, value, message", SCHEMA_CASES,
                         ids=[f"{p}={str(v)[:20] if v is not DROP else 'DROP'}" for p, v, _ in SCHEMA_CASES])
def test_schema_violations_are_wire_errors_naming_the_field(path, value, message):
    d = header_dict()
    _set(d, path, value)
    with pytest.raises(WireError, match=re.escape(message)):
        decode_chunk(parts_of(d))


def test_a_v1_message_is_refused_by_version():
    """A v1 sender (absolute deadline_wall, no sent_wall): the version check comes first and says what to do."""
    v1 = {"v": 1, "stream": "cam", "seq": 0, "fps": 10.0, "frame_ts": [0.0], "frame_shape": [SIDE, SIDE, 3],
          "orig_size": [640, 480], "letterbox": {"scale": 0.04, "pad_x": 0.0, "pad_y": 3.5},
          "tasks": [{"name": "detect", "adapter": "detect", "frames": [0], "deadline_wall": 101.0}],
          "ready_wall": 100.0, "dropped_before": 0}
    with pytest.raises(WireError, match=r"unsupported protocol version 1 \(this daemon speaks 2: run ingest and "
                                        r"daemon from the same release\)"):
        decode_chunk(parts_of(v1, 1))


@pytest.mark.parametrize("parts, message", [
    ([], "empty message"),
    ([b"\xff\xfe not json"], "not valid UTF-8 JSON"),
    ([b"{\"v\": 2,"], "not valid UTF-8 JSON"),
    ([b"[" * 60000], "not valid UTF-8 JSON"),  # nesting deep enough to exhaust the recursion limit
    ([b"1" * 5000], "not valid UTF-8 JSON"),  # an integer longer than Python's int-string limit
    ([b"[1, 2]"], "not a JSON object"),
    ([b"null"], "not a JSON object"),
    ([b" " * MAX_HEADER_BYTES + b"{}"], f"header is {MAX_HEADER_BYTES + 2} bytes, limit {MAX_HEADER_BYTES}"),
    (parts_of(header_dict(), 2), "header announces 3 frames and 0 snapshots but the message carries 2 parts after the header"),
    (parts_of(header_dict(), 4), "header announces 3 frames and 0 snapshots but the message carries 4 parts after the header"),
    ([json.dumps(header_dict()).encode(), *(f.tobytes()[:-10] for f in frames())],
     "frame 0: 2342 bytes, expected 28x28x3 = 2352 (truncated?)"),
    ([b"{}"] + [b""] * MAX_PARTS, f"message has {MAX_PARTS + 1} parts, limit {MAX_PARTS}"),
])
def test_malformed_messages_are_rejected_with_a_clear_reason(parts, message):
    with pytest.raises(WireError, match=re.escape(message)):
        decode_chunk(parts)


def test_too_many_parts_is_refused_before_the_header_is_read():
    """A flood of parts costs nothing to refuse: the count is checked before any parsing."""
    parts = [json.dumps(header_dict()).encode()] + [f.tobytes() for f in frames(MAX_PARTS)]
    with pytest.raises(WireError, match=re.escape(f"message has {MAX_PARTS + 1} parts")):
        decode_chunk(parts)


@pytest.mark.parametrize("path, value", [
    ("stream", "cam\n"),
    ("tasks.0.name", "detect\n"),
    ("tasks.1.adapter", "actions\n"),
    ("stream", "x" * 64 + "\n"),  # 65 characters
], ids=["stream", "task-name", "adapter", "stream-65-chars"])
def test_names_with_a_trailing_newline_are_refused(path, value):
    """'1-64 letters, digits, _.-' means exactly that: `$` alone also matches before a final newline."""
    d = header_dict()
    _set(d, path, value)
    with pytest.raises(WireError, match=re.escape(f"header.{path.replace('.0.', '[0].').replace('.1.', '[1].')}")):
        decode_chunk(parts_of(d))


LONG_INPUTS = [
    ("seq", 10**4000),
    ("dropped_before", -(10**4000)),
    ("outage_s", 10**4000),
    ("tasks.0.priority", 10**4000),
    ("tasks.0.frames", [10**4000]),
    ("frame_shape", [10**4000, 28, 3]),
    ("fps", 10**4000),
    ("stream", "x" * 60000),
    ("v", "2" * 60000),
]


@pytest.mark.parametrize("path, value", LONG_INPUTS, ids=[f"{p}-{len(str(v))}-chars" for p, v in LONG_INPUTS])
def test_error_messages_stay_short_whatever_the_input(path, value):
    """The daemon logs every refused message: a sender must not be able to make that line kilobytes long."""
    d = header_dict()
    _set(d, path, value)
    with pytest.raises(WireError) as err:
        decode_chunk(parts_of(d))
    assert len(str(err.value)) <= 300, f"{len(str(err.value))} characters: {str(err.value)[:120]}..."


# ---------------------------------------------------------------- snapshots and heartbeats (issue 29)
JPEG = b"\xff\xd8" + b"jpeg bytes" + b"\xff\xd9"


def test_snapshot_jpegs_follow_the_frames_and_arrive_keyed_by_their_media_time():
    h = make_header(snapshots=(0, 2))
    chunk = decode_chunk([bytes(memoryview(p)) for p in encode_chunk(h, frames(), [JPEG, JPEG + b"2"])])
    assert chunk.header.snapshots == (0, 2) and len(chunk.frames) == 3
    assert chunk.jpegs == {0.0: JPEG, 0.2: JPEG + b"2"}
    assert chunk.requests(100.2)[0].jpegs is chunk.jpegs
    assert "snapshots" not in json.loads(make_header().to_json())  # left out when none: older daemons read it


@pytest.mark.parametrize("snapshots, jpegs, message", [
    ((0,), [b"not a jpeg"], "snapshot of frame 0: expected a JPEG"),
    ((0,), [b""], "snapshot of frame 0: expected a JPEG"),
    ((0,), [], "header announces 3 frames and 1 snapshots but the message carries 3 parts after the header"),
    ((5,), [JPEG], "header.snapshots: expected distinct indices into the 3 frames sent"),
    ((1, 1), [JPEG, JPEG], "header.snapshots: expected distinct indices into the 3 frames sent"),
])
def test_bad_snapshots_are_wire_errors(snapshots, jpegs, message):
    d = header_dict()
    d["snapshots"] = list(snapshots)
    with pytest.raises(WireError, match=re.escape(message)):
        decode_chunk([json.dumps(d).encode(), *(f.tobytes() for f in frames()), *jpegs])


def test_a_heartbeat_round_trips_and_a_bad_one_names_its_field():
    from vlora_va.contracts.wire import SourceStatus, decode_message
    status = SourceStatus(stream="cam", state="ended", frame_age_s=1.5, sent_wall=100.0)
    assert decode_message([status.to_json()]) == status
    h, fs = make_header(), frames()
    assert decode_message(encode_chunk(h, fs)).header == h  # a chunk is still a chunk
    bad = json.loads(status.to_json())
    bad["state"] = "sleeping"
    with pytest.raises(WireError, match=r"status.state: expected one of live, ended, failed"):
        decode_message([json.dumps(bad).encode()])
    bad = json.loads(status.to_json())
    bad["frame_age_s"] = -1
    with pytest.raises(WireError, match=r"status.frame_age_s"):
        decode_message([json.dumps(bad).encode()])
    with pytest.raises(WireError, match="unknown field 'extra'"):
        decode_message([json.dumps({**json.loads(status.to_json()), "extra": 1}).encode()])


def test_snapshots_raise_the_largest_legal_part_only_where_a_stream_sends_them():
    from vlora_va.contracts.wire import MAX_JPEG_BYTES
    assert largest_part_bytes(224) == 224 * 224 * 3
    assert largest_part_bytes(224, snapshots=True) == MAX_JPEG_BYTES
