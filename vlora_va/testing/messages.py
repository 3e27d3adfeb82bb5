"""Seeded generator of hostile chunk messages for the daemon's transport (issue 14, item 1).

Used by tests/serving/test_fuzz.py (10^4 messages in CI) and bench/fuzz.py (10^6). Every message says what
the daemon must do with it, decided by how the message was BUILT, never by asking contracts.wire (the oracle
must not be the code under test):

    malformed    the wire format is broken: the daemon counts it as malformed, logs it, answers nothing
    error-rows   valid wire, but some task cannot be served (unknown adapter, frames not the daemon's image
                 size): each such task gets one "error" row, every other task one "ok" or "shed" row
    ok           valid wire: each task gets exactly one row, "ok" or "shed" (a legal but hopeless deadline or
                 clock, or overload, may shed it)
    disconnect   a part larger than ZeroMQ's maximum message size (ZMQ_MAXMSGSIZE): ZeroMQ drops the message
                 and cuts the sender off before the daemon sees anything; send it on a throwaway socket

The field table `FIELDS` restates the wire schema (types and ranges) independently of vlora_va/contracts/wire.py; the
fuzz test checks that it names exactly the fields of the wire dataclasses, so a new field is fuzzed too.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import string
import time
from dataclasses import dataclass, field
from typing import Callable

from vlora_va.contracts.results import JsonlFollower, is_result
from vlora_va.contracts.wire import (
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    MAX_SEQ,
    MAX_TASKS,
    PROTOCOL_VERSION,
    largest_part_bytes,
)

MALFORMED, ERROR_ROWS, OK, DISCONNECT = "malformed", "error-rows", "ok", "disconnect"
KINDS = (MALFORMED, ERROR_ROWS, OK, DISCONNECT)
SERVED = frozenset({"ok", "shed"})  # what a servable request may get back
ERROR = frozenset({"error"})

LIVE_STREAM = "live"  # the valid stream interleaved with the fuzz; no fuzz stream id starts with it
LIVE_PRIORITY = 1000  # the top tier: overload control sheds fuzz work (priority < 1000) first

# The wire schema, restated: dotted path ("[]" = any list item) -> (type, lo, hi) or (type, min_len, max_len).
MAX_WALL, MAX_MEDIA_S, MAX_SIDE, MAX_ORIG = 1e11, 1e9, 2048, 16384
from vlora_va.serving.transport import CLOCK_MAX_SKEW_S  # noqa: E402

FIELDS: dict[str, tuple] = {
    "v": ("const",),
    "stream": ("text",),
    "seq": ("int", 0, MAX_SEQ),
    "fps": ("num", 0.01, 1000.0),
    "frame_ts": ("list", 0, MAX_FRAMES),  # empty only when every task reuses a chunk (a relation, checked apart)
    "frame_ts[]": ("num", 0.0, MAX_MEDIA_S),
    "frame_shape": ("list", 3, 3),
    "frame_shape[]": ("int", 1, MAX_SIDE),
    "orig_size": ("list", 2, 2),
    "orig_size[]": ("int", 1, MAX_ORIG),
    "letterbox": ("obj",),
    "letterbox.scale": ("num", 1e-4, 1e4),
    "letterbox.pad_x": ("num", 0.0, MAX_SIDE),
    "letterbox.pad_y": ("num", 0.0, MAX_SIDE),
    "tasks": ("list", 1, MAX_TASKS),
    "tasks[]": ("obj",),
    "tasks[].name": ("text",),
    "tasks[].adapter": ("text",),
    "tasks[].frames": ("list", 0, MAX_FRAMES),  # empty only with reuse_chunk (a relation)
    "tasks[].frames[]": ("int", 0, MAX_FRAMES - 1),
    "tasks[].deadline_ms": ("num", 1.0, 3_600_000.0),
    "tasks[].priority": ("int", -1000, 1000),
    "tasks[].best_effort": ("bool",),
    "tasks[].reuse_chunk": ("int", -1, MAX_SEQ),  # frame filtering; absent in generated messages
    "tasks[].reuse_ts": ("list", 0, MAX_FRAMES),
    "tasks[].reuse_ts[]": ("num", 0.0, MAX_MEDIA_S),
    "ready_wall": ("num", 0.0, MAX_WALL),
    "sent_wall": ("num", 0.0, MAX_WALL),
    "dropped_before": ("int", 0, MAX_SEQ),
    "outage_s": ("num", 0.0, MAX_MEDIA_S),
    "reconnects": ("int", 0, MAX_SEQ),
    "decoded": ("int", 0, MAX_SEQ),
    "snapshots": ("list", 0, MAX_FRAMES),  # the JPEG parts that follow the frames: absent in generated messages
}
OPTIONAL = {"dropped_before", "outage_s", "reconnects", "decoded", "snapshots", "tasks[].priority",
            "tasks[].best_effort", "tasks[].reuse_chunk", "tasks[].reuse_ts"}
# legal values of the optional header fields that ingest leaves out when 0
OPTIONAL_VALUES = {"outage_s": (0.0, 1.5, MAX_MEDIA_S), "reconnects": (0, 3, MAX_SEQ), "decoded": (0, 30, MAX_SEQ)}
NAME_CHARS = string.ascii_letters + string.digits + "_.-"
HUGE = 10**400  # a legal JSON number that no float holds


@dataclass
class Message:
    parts: list[bytes]
    kind: str
    mutation: str  # which generator made it (reports, failure messages)
    # (stream, seq, task, statuses allowed): the rows it must get, one each (empty unless the wire is valid)
    rows: list[tuple[str, int, str, frozenset]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)


def spec_key(path: tuple) -> str:
    """("tasks", 0, "frames", 1) -> "tasks[].frames[]"."""
    out = ""
    for p in path:
        out += "[]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _get(d, path):
    for p in path:
        d = d[p]
    return d


def _set(d, path, value):
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


def _del(d, path):
    for p in path[:-1]:
        d = d[p]
    del d[path[-1]]


class MessageGen:
    """next(gen) -> a Message. Seeded: the same seed gives the same messages (except the wall-clock fields of
    valid ones, which follow `clock` so that their deadlines can be met)."""

    def __init__(self, seed: int, image_size: int, adapters: tuple[str, ...], *, clock: Callable[[], float] = time.time,
                 streams: int = 8, fresh_stream_rate: float = 0.1, max_message_images: int = 160,
                 ok_weight: float = 1.0):
        """ok_weight scales how often servable messages come (they cost engine time: a long run lowers it).
        fresh_stream_rate: the share of valid-wire messages on a stream id never seen before (per-stream state
        in the daemon); 0 keeps every message on the `streams` pool ids, legal oddities included."""
        self.rng = random.Random(seed)
        self.image_size, self.adapters, self.clock = image_size, tuple(adapters), clock
        self.maxmsgsize = largest_part_bytes(image_size)
        self.streams = [f"fz{i}" for i in range(streams - 1)] + ["fz" + "z" * 62]  # the longest legal id too
        self.fresh_stream_rate = fresh_stream_rate
        self.max_message_images = max_message_images
        self._seq = 0
        frame_bytes = image_size * image_size * 3
        self._frames = [self.rng.randbytes(frame_bytes) for _ in range(8)]
        self._last_valid: Message | None = None
        live_rng = random.Random(seed + 1)
        self._live_frames = [live_rng.randbytes(frame_bytes) for _ in range(2)]
        # (weight, name, method): malformed first, then error-rows, ok, disconnect
        self.table = [
            (6, "random-bytes", self._random_bytes), (2, "empty-parts", self._empty),
            (5, "truncated-header", self._truncated), (3, "extended-header", self._extended),
            (3, "non-utf8-header", self._non_utf8), (2, "header-not-an-object", self._not_object),
            (3, "wrong-version", self._version), (1, "v1-header", self._v1),
            (20, "wrong-value", self._wrong_value), (4, "missing-field", self._missing),
            (4, "unknown-field", self._unknown), (2, "deep-nesting", self._deep),
            (2, "huge-array", self._huge_array), (2, "huge-string", self._huge_string),
            (4, "huge-number", self._huge_number), (4, "non-finite", self._non_finite),
            (3, "below-range", self._below), (3, "duplicate-task", self._dup_task),
            (3, "bad-frame-index", self._bad_index), (2, "decreasing-ts", self._decreasing),
            (1, "channels", self._channels), (3, "extra-part", self._extra_part),
            (3, "missing-part", self._missing_part), (3, "wrong-part-size", self._part_size),
            (1, "too-many-parts", self._too_many_parts), (1, "huge-header", self._huge_header),
            (2, "duplicate-key", self._dup_key),
            (3, "unknown-adapter", self._unknown_adapter), (3, "wrong-image-size", self._wrong_size),
            (6, "valid", self._valid_msg), (6, "valid-edges", self._edges), (1, "replay", self._replay),
            (1, "duplicate-key-valid", self._dup_key_valid), (1, "whitespace-padded", self._padded),
            (1, "oversize-part", self._oversize),
        ]
        servable = {"valid", "valid-edges", "replay", "duplicate-key-valid", "whitespace-padded"}
        self._weights = [w * (ok_weight if name in servable else 1.0) for w, name, _ in self.table]

    # ------------------------------------------------------------------ public
    def __iter__(self):
        return self

    def __next__(self) -> Message:
        _, name, make = self.rng.choices(self.table, self._weights)[0]
        msg = make()
        msg.mutation = name
        if any(len(p) > self.maxmsgsize for p in msg.parts):  # ZeroMQ cuts it off before the daemon sees it
            msg.kind, msg.rows = DISCONNECT, []
        elif msg.kind != MALFORMED:
            self._last_valid = msg
        return msg

    def live(self, seq: int, tasks: tuple[tuple[str, str], ...]) -> Message:
        """A valid chunk of the live stream: always the same two frames, top priority, 30-s deadline."""
        now = self.clock()
        h = self._header(LIVE_STREAM, seq, 2, now)
        h["tasks"] = [self._task(name, adapter, [0, 1], priority=LIVE_PRIORITY) for name, adapter in tasks]
        return Message([self._dump(h), *self._live_frames], OK, "live",
                       [(LIVE_STREAM, seq, name, frozenset({"ok"})) for name, _ in tasks])

    # ------------------------------------------------------------------ building blocks
    def _stream(self) -> str:
        return self._fresh_id("x") if self.rng.random() < self.fresh_stream_rate else self.rng.choice(self.streams)

    def _fresh_id(self, first: str, length: int = 0) -> str:
        """A stream id (or task name) never seen before, `first` + random; a pool id when fresh ids are off."""
        if not self.fresh_stream_rate:
            return self.rng.choice(self.streams)
        return first + "".join(self.rng.choices(NAME_CHARS, k=(length or self.rng.randint(2, 64)) - 1))

    def _task(self, name, adapter, frames, deadline_ms=30_000.0, priority=0, best_effort=False) -> dict:
        return {"name": name, "adapter": adapter, "frames": list(frames), "deadline_ms": deadline_ms,
                "priority": priority, "best_effort": best_effort}

    def _header(self, stream, seq, n, now, side=None) -> dict:
        side = side or self.image_size
        return {"v": PROTOCOL_VERSION, "stream": stream, "seq": seq, "fps": 10.0,
                "frame_ts": [round(seq * 1.0 + 0.1 * i, 3) for i in range(n)], "frame_shape": [side, side, 3],
                "orig_size": [640, 480], "letterbox": {"scale": side / 640, "pad_x": 0.0, "pad_y": side / 8},
                "tasks": [], "ready_wall": now, "sent_wall": now, "dropped_before": 0}

    def _base(self, n=None, ntasks=None) -> tuple[dict, list[bytes]]:
        """A valid header (fuzz stream, fresh seq, known adapters) and its frames."""
        rng = self.rng
        n = n or rng.choice((1, 1, 2, 2, 3, 4))
        ntasks = ntasks or rng.choice((1, 1, 2, 3))
        self._seq += 1
        h = self._header(self._stream(), self._seq, n, self.clock())
        for i in range(ntasks):
            k = rng.randint(1, n)
            h["tasks"].append(self._task(f"t{i}", rng.choice(self.adapters), sorted(rng.sample(range(n), k)),
                                         priority=rng.randint(-1000, LIVE_PRIORITY - 1),
                                         best_effort=rng.random() < 0.1))
        for key, values in OPTIONAL_VALUES.items():
            if rng.random() < 0.2:
                h[key] = rng.choice(values)
        return h, [rng.choice(self._frames) for _ in range(n)]

    def _dump(self, h, **kw) -> bytes:
        return json.dumps(h, separators=(",", ":"), **kw).encode()

    def _valid(self, h, frames, mutation="valid", statuses=None) -> Message:
        """A message from a header that follows the schema: its rows, each task served or an error row. A
        sender clock more than CLOCK_MAX_SKEW_S off the daemon's is refused as malformed (transport.py)."""
        if abs(h["sent_wall"] - time.time()) > CLOCK_MAX_SKEW_S:
            return self._bad(h, frames)
        side = h["frame_shape"]
        wrong_size = side[0] != self.image_size or side[1] != self.image_size
        rows = []
        for t in h["tasks"]:
            bad = wrong_size or t["adapter"] not in self.adapters
            rows.append((h["stream"], h["seq"], t["name"], ERROR if bad else (statuses or SERVED)))
        kind = ERROR_ROWS if any(r[3] is ERROR for r in rows) else OK
        return Message([self._dump(h), *frames], kind, mutation, rows)

    def _bad(self, h, frames=None) -> Message:
        return Message([h if isinstance(h, bytes) else self._dump(h), *(frames or [])], MALFORMED, "")

    def _paths(self, h, leaves_only=False) -> list[tuple]:
        """Every field path of a header: objects, lists and their items."""
        out = []

        def walk(v, path):
            if isinstance(v, dict):
                if path and not leaves_only:
                    out.append(path)
                for k, x in v.items():
                    walk(x, path + (k,))
            elif isinstance(v, list):
                if not leaves_only:
                    out.append(path)
                for i, x in enumerate(v):
                    walk(x, path + (i,))
            else:
                out.append(path)
        walk(h, ())
        return out

    def _wrong(self, spec: tuple) -> object:
        """A value that breaks `spec` whatever the rest of the header holds."""
        rng, kind = self.rng, spec[0]
        wrong_type = {
            "int": [None, "7", [1], {"a": 1}, True, False, 1.5, 2.0, float("nan")],
            "num": [None, "7", [1], {"a": 1}, True, False, float("nan"), float("inf"), float("-inf")],
            "text": [None, 5, 1.5, True, [], {}, ["cam"], "", "a" * 65, "a b", "\u00e9", "a\n", "../x", "a/b",
                     "\x00", "cam\u200b"],
            "bool": [None, 0, 1, 1.0, "true", [], {}],
            "const": [None, 1, 3, 0, -2, "2", 2.0, True, [2], {"v": 2}, HUGE, float("nan")],
            "list": [None, 5, "x", {}, True, 1.5, {"0": 1}, []],
            "obj": [None, 5, "x", [], True, {}, [{}]],
        }[kind]
        if kind == "int":
            lo, hi = spec[1], spec[2]
            return rng.choice(wrong_type + [lo - 1, hi + 1, HUGE, -HUGE, float(lo), str(lo)])
        if kind == "num":
            lo, hi = spec[1], spec[2]
            return rng.choice(wrong_type + [HUGE, -HUGE, 1e308, -1e308, hi * 1.001 + 1, lo - abs(lo) / 2 - 1e-3,
                                            str(lo)])
        if kind == "list":
            lo, hi = spec[1], spec[2]
            return rng.choice(wrong_type + [[0] * (hi + 1), [0] * (lo - 1) if lo > 1 else None, [[0]]])
        return rng.choice(wrong_type)

    def _field(self, h, leaves_only=False) -> tuple[tuple, tuple]:
        path = self.rng.choice(self._paths(h, leaves_only))
        return path, FIELDS[spec_key(path)]

    # ------------------------------------------------------------------ malformed
    def _random_bytes(self):
        rng = self.rng
        parts = [rng.randbytes(rng.choice((0, 1, 2, 10, 100, 1000, 5000))) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.5 and parts[0]:  # looks like JSON at first
            parts[0] = b"{" + parts[0][1:]
        return self._bad(parts[0], parts[1:])

    def _empty(self):
        return Message([b""] * self.rng.randint(1, 3), MALFORMED, "")

    def _truncated(self):
        h, frames = self._base()
        raw = self._dump(h)
        return self._bad(raw[: self.rng.randrange(len(raw))], frames)

    def _extended(self):
        h, frames = self._base()
        tail = self.rng.choice((b"}", b"x", b"{}", b",", b"\x00", b"\xff\xfe", b"  ]", b"[1]",
                                b"!" + self.rng.randbytes(20)))
        return self._bad(self._dump(h) + tail, frames)

    def _non_utf8(self):
        h, frames = self._base()
        raw = self._dump(h)
        i = self.rng.randrange(len(raw) + 1)
        bad = self.rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80"))
        return self._bad(raw[:i] + bad + raw[i:], frames)

    def _not_object(self):
        h, frames = self._base()
        other = self.rng.choice(([h], "header", 2, 2.5, None, True, [], [[h]]))
        return self._bad(json.dumps(other).encode(), frames)

    def _version(self):
        h, frames = self._base()
        if self.rng.random() < 0.2:
            del h["v"]
        else:
            h["v"] = self._wrong(FIELDS["v"])
        return self._bad(h, frames)

    def _v1(self):
        """What the previous protocol sent: absolute deadlines, no sent_wall."""
        h, frames = self._base()
        h["v"] = 1
        del h["sent_wall"]
        for t in h["tasks"]:
            t["deadline_wall"] = h["ready_wall"] + t.pop("deadline_ms") / 1000
        return self._bad(h, frames)

    def _wrong_value(self):
        h, frames = self._base()
        path, spec = self._field(h)
        _set(h, path, self._wrong(spec))
        return self._bad(h, frames)

    def _missing(self):
        h, frames = self._base()
        required = [p for p in self._paths(h) if not isinstance(p[-1], int) and spec_key(p) not in OPTIONAL]
        path = self.rng.choice(required)
        _del(h, path)
        return self._bad(h, frames)

    def _unknown(self):
        h, frames = self._base()
        where = self.rng.choice([(), ("letterbox",)] + [("tasks", i) for i in range(len(h["tasks"]))])
        key = self.rng.choice(("deadline_wall", "extra", "V", "seq ", "", "\u00e9", "a" * 1000, "__proto__"))
        _get(h, where)[key] = self.rng.choice((0, None, "x", [], {}))
        return self._bad(h, frames)

    def _deep(self):
        h, frames = self._base()
        depth = self.rng.choice((2, 3, 50, 900, 1100, 5000, 20000))
        if self.rng.random() < 0.5:
            nested = "[" * depth + "0" + "]" * depth
        else:
            nested = '{"a":' * depth + "0" + "}" * depth
        path, _ = self._field(h)
        _set(h, path, "@@NESTED@@")
        raw = self._dump(h).replace(b'"@@NESTED@@"', nested.encode())
        return self._bad(raw, frames)

    def _huge_array(self):
        h, frames = self._base()
        path, _ = self._field(h)
        n = self.rng.choice((MAX_FRAMES + 1, 1000, 5000, 20000))
        item = self.rng.choice((0, 1.5, "x", None, {}, []))
        _set(h, path, [item] * n)
        return self._bad(h, frames)

    def _huge_string(self):
        h, frames = self._base()
        path, _ = self._field(h)
        n = self.rng.choice((65, 100, 1000, 30000, 60000))
        _set(h, path, self.rng.choice(string.ascii_letters) * n)
        return self._bad(h, frames)

    def _huge_number(self):
        h, frames = self._base()
        path, _ = self._field(h, leaves_only=True)
        digits = self.rng.choice((17, 20, 400, 4000, 4299, 5000))
        value = self.rng.choice((1, -1)) * 10**digits
        if digits > 4299:  # more digits than Python's int-from-text limit: written by hand
            _set(h, path, "@@BIG@@")
            return self._bad(self._dump(h).replace(b'"@@BIG@@"', b"9" * digits), frames)
        if self.rng.random() < 0.3:
            value = self.rng.choice((1e308, -1e308, 1.7976931348623157e308))
        _set(h, path, value)
        return self._bad(h, frames)

    def _non_finite(self):
        h, frames = self._base()
        path, _ = self._field(h, leaves_only=True)
        _set(h, path, self.rng.choice((float("nan"), float("inf"), float("-inf"))))
        raw = self._dump(h)
        if self.rng.random() < 0.2:  # 1e400 parses to inf too
            raw = raw.replace(b"Infinity", b"1e400").replace(b"NaN", b"-1e999")
        return self._bad(raw, frames)

    def _below(self):
        """Negative counters, and every number just below its range."""
        h, frames = self._base()
        paths = [p for p in self._paths(h, leaves_only=True) if FIELDS[spec_key(p)][0] in ("int", "num")]
        path = self.rng.choice(paths)
        kind, lo, _ = FIELDS[spec_key(path)]
        _set(h, path, lo - 1 if kind == "int" else self.rng.choice((lo - abs(lo) / 2 - 1e-9, -1.0, -5e-324)))
        return self._bad(h, frames)

    def _dup_task(self):
        h, frames = self._base(ntasks=self.rng.randint(1, 3))
        t = copy.deepcopy(self.rng.choice(h["tasks"]))
        if self.rng.random() < 0.5:
            t["adapter"] = self.rng.choice(self.adapters)
            t["priority"] = 5
        h["tasks"].insert(self.rng.randint(0, len(h["tasks"])), t)
        return self._bad(h, frames)

    def _bad_index(self):
        h, frames = self._base()
        t = self.rng.choice(h["tasks"])
        n = len(h["frame_ts"])
        if self.rng.random() < 0.5:
            t["frames"].append(self.rng.randint(n, MAX_FRAMES - 1))  # in the schema's range, past the frames sent
        else:
            t["frames"].append(t["frames"][0])  # the same frame twice
        return self._bad(h, frames)

    def _decreasing(self):
        h, frames = self._base(n=self.rng.randint(2, 4))
        i = self.rng.randint(1, len(h["frame_ts"]) - 1)
        h["frame_ts"][i] = h["frame_ts"][i - 1] - self.rng.choice((1e-6, 0.1, 1.0))
        if h["frame_ts"][i] < 0:
            h["frame_ts"] = [x + 10 for x in h["frame_ts"]]
        return self._bad(h, frames)

    def _channels(self):
        h, frames = self._base()
        c = self.rng.choice((1, 2, 4))
        s = self.image_size
        h["frame_shape"] = [s, s, c]
        return self._bad(h, [self.rng.randbytes(s * s * c) for _ in frames])

    def _extra_part(self):
        h, frames = self._base()
        extra = [self.rng.choice((frames[0], b"", b"x"))] * self.rng.randint(1, 3)
        return self._bad(h, frames + extra)

    def _missing_part(self):
        h, frames = self._base(n=self.rng.randint(1, 4))
        keep = self.rng.randint(0, len(frames) - 1)
        return self._bad(h, frames[:keep])

    def _part_size(self):
        h, frames = self._base()
        i = self.rng.randrange(len(frames))
        f = frames[i]
        frames[i] = self.rng.choice((f[:-1], f + b"\x00", b"", f[: len(f) // 2], f[:3], f + f[:3]))
        return self._bad(h, frames)

    def _too_many_parts(self):
        n = self.rng.choice((MAX_FRAMES + 1, MAX_FRAMES + 2, 300, 3000))
        h, frames = self._base(n=self.rng.choice((1, MAX_FRAMES)), ntasks=1)
        if n > MAX_FRAMES + 2:  # many tiny parts: the transport reads and drops all past MAX_FRAMES + 2
            return self._bad(h, [self.rng.choice((b"", b"x", frames[0]))] * n)
        return self._bad(h, (frames * n)[:n])

    def _huge_header(self):
        """More than MAX_HEADER_BYTES: malformed when ZeroMQ lets it through, else a disconnect."""
        h, frames = self._base()
        raw = self._dump(h)
        size = MAX_HEADER_BYTES + self.rng.choice((1, 100, 5000, 20000))
        if self.rng.random() < 0.5:  # valid JSON, only too long
            raw = raw[:-1] + b" " * (size - len(raw)) + b"}"
        else:
            h["pad"] = "p" * (size - len(raw))
            raw = self._dump(h)
        return self._bad(raw, frames)

    def _dup_key(self):
        """A key twice: the last one wins, and the last one is broken."""
        h, frames = self._base()
        key = self.rng.choice([k for k in h if k != "v"])
        bad = json.dumps(self._wrong(FIELDS[key]), separators=(",", ":")).encode()
        raw = self._dump(h)[:-1] + b',"' + key.encode() + b'":' + bad + b"}"
        return self._bad(raw, frames)

    # ------------------------------------------------------------------ error rows
    def _unknown_adapter(self):
        names = list(self.adapters) + ["nosuch", "detect2", "a" * 64, "ACTIONS", "_"]
        h, frames = self._base(ntasks=self.rng.randint(1, 3))
        for t in h["tasks"]:
            t["adapter"] = self.rng.choice(names)
        h["tasks"][0]["adapter"] = self.rng.choice(names[len(self.adapters):])
        return self._valid(h, frames)

    def _wrong_size(self):
        h, frames = self._base()
        s = self.image_size
        side = self.rng.choice(((s // 2, s // 2), (s + 1, s + 1), (s, s // 2), (s // 2, s), (1, 1), (14, 14)))
        h["frame_shape"] = [side[0], side[1], 3]
        return self._valid(h, [self.rng.randbytes(side[0] * side[1] * 3) for _ in frames])

    # ------------------------------------------------------------------ ok
    def _valid_msg(self):
        h, frames = self._base()
        return self._valid(h, frames)

    def _edges(self):
        """Legal extremes and legal oddities, a few at a time."""
        rng = self.rng
        big = rng.random() < 0.05
        n = rng.choice((MAX_FRAMES, 64)) if big else rng.randint(1, 6)
        ntasks = 1 if big else rng.choice((1, 2, 4, MAX_TASKS))
        h, frames = self._base(n=n, ntasks=ntasks)
        total = sum(len(t["frames"]) for t in h["tasks"])
        while total > self.max_message_images:  # keep the engine's work per message bounded
            t = max(h["tasks"], key=lambda t: len(t["frames"]))
            total -= len(t["frames"]) - 1
            t["frames"] = t["frames"][:1]
        edits = [
            lambda: h.update(seq=rng.choice((0, MAX_SEQ))),
            lambda: h.update(fps=rng.choice((0.01, 1000, 1000.0, 25))),
            lambda: h.update(frame_ts=[rng.choice((0, 0.0, 5, MAX_MEDIA_S))] * n),
            lambda: h.update(orig_size=[rng.choice((1, MAX_ORIG)), rng.choice((1, MAX_ORIG))]),
            lambda: h.update(letterbox={"scale": rng.choice((1e-4, 1e4, 1)), "pad_x": rng.choice((0, MAX_SIDE)),
                                        "pad_y": rng.choice((0.0, 2048.0))}),
            lambda: h.update(dropped_before=rng.choice((1, MAX_SEQ))),
            lambda: h.update({k: rng.choice(v) for k, v in OPTIONAL_VALUES.items()}),
            lambda: h.pop("dropped_before"),
            # odd clocks: on a stream of their own (a far-future sent_wall sets its clock offset for minutes)
            lambda: h.update(stream=self._fresh_id("c"), ready_wall=rng.choice((0, 0.0, MAX_WALL,
                                                                                h["ready_wall"] - 3600))),
            lambda: h.update(stream=self._fresh_id("c"), sent_wall=rng.choice((0, MAX_WALL, h["sent_wall"] + 3600))),
            lambda: h.update(stream=self._fresh_id("L", 64)),  # the longest legal id
            lambda: [t.pop(k) for t in h["tasks"] for k in ("priority", "best_effort")],
            lambda: [t.update(deadline_ms=rng.choice((1, 1.0, 3_600_000, 500))) for t in h["tasks"]],
            lambda: [t.update(priority=rng.choice((-1000, 999))) for t in h["tasks"]],
            lambda: [t.update(best_effort=True) for t in h["tasks"]],
            lambda: h["tasks"][0].update(name=self._fresh_id("n", 64) if self.fresh_stream_rate else "n" * 64),
        ]
        for edit in rng.sample(edits, rng.randint(1, 4)):
            edit()
        if h["stream"].startswith(LIVE_STREAM):
            h["stream"] = "x" + h["stream"][1:]
        msg = self._valid(h, frames, "valid-edges")
        style = rng.random()
        if style < 0.2:  # key order shuffled
            items = list(h.items())
            rng.shuffle(items)
            msg.parts[0] = self._dump(dict(items))
        elif style < 0.4:  # pretty-printed
            msg.parts[0] = json.dumps(h, indent=rng.choice((1, 4)), sort_keys=True).encode()
        elif style < 0.5:  # strings written as \u escapes
            raw = msg.parts[0].decode()
            q = f'"stream":"{h["stream"]}"'
            escaped = "".join(f"\\u{ord(c):04x}" for c in h["stream"])
            msg.parts[0] = raw.replace(q, f'"stream":"{escaped}"', 1).encode()
        return msg

    def _replay(self):
        """The last valid message again, byte for byte (a duplicated chunk gets its rows again)."""
        if self._last_valid is None:
            return self._valid_msg()
        last = self._last_valid
        return Message(list(last.parts), last.kind, "", list(last.rows))

    def _dup_key_valid(self):
        """A key twice: the first is broken, the last (which wins) is right."""
        h, frames = self._base()
        msg = self._valid(h, frames)
        key = self.rng.choice([k for k in h if k != "v"])
        bad = json.dumps(self._wrong(FIELDS[key]), separators=(",", ":")).encode()
        msg.parts[0] = b'{"' + key.encode() + b'":' + bad + b"," + msg.parts[0][1:]
        return msg

    def _padded(self):
        """Whitespace up to the header limit (still legal)."""
        h, frames = self._base()
        msg = self._valid(h, frames)
        room = min(MAX_HEADER_BYTES, self.maxmsgsize) - len(msg.parts[0])
        pad = self.rng.choice((1, room // 2, room))
        msg.parts[0] = msg.parts[0][:-1] + self.rng.choice((b" ", b"\n", b"\t", b"\r")) * pad + b"}"
        return msg

    # ------------------------------------------------------------------ disconnect
    def _oversize(self):
        h, frames = self._base()
        i = self.rng.randrange(len(frames) + 1)
        big = b"\x00" * (self.maxmsgsize + self.rng.choice((1, 1000, self.maxmsgsize)))
        parts = [self._dump(h), *frames]
        parts[i] = big
        return Message(parts, DISCONNECT, "")


# ---------------------------------------------------------------- the sending side's tools (test and bench)
class RowTail:
    """The daemon's JSONL sink read as it grows (it is flushed after every batch); rows of `watch` are indexed
    by chunk. keep=False keeps only those (a long run's file is read once at the end instead)."""

    def __init__(self, path, watch: str = LIVE_STREAM, keep: bool = True):
        self.path, self.watch, self.keep = path, watch, keep
        self.rows: list[dict] = []
        self.watched: dict[int, list[dict]] = {}
        self.count = 0
        self._follower = JsonlFollower(path)

    def poll(self) -> None:
        for line in self._follower.new_lines():
            self.count += 1
            if self.keep or f'"stream":"{self.watch}"' in line or f'"stream": "{self.watch}"' in line:
                row = json.loads(line)
                if not is_result(row):
                    continue  # event rows (a stream going offline) are not what this watches
                if self.keep:
                    self.rows.append(row)
                if row["stream"] == self.watch:
                    self.watched.setdefault(row["chunk"], []).append(row)

    def wait_for(self, chunk: int, n: int, timeout: float) -> list[dict]:
        """The watched stream's rows of `chunk` once there are n of them (fewer: timed out)."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            got = self.watched.get(chunk, [])
            if len(got) >= n or time.monotonic() > deadline:
                return got
            time.sleep(0.001)


class Sender:
    """Sends generated messages to a daemon and keeps the books: messages per kind, bytes, and for every request
    the rows it is owed (`expected`, a Counter) and the statuses they may have (`allowed`). A DISCONNECT message
    goes on a throwaway socket that ZeroMQ must cut off; the others on `push`, which raises zmq.Again when the
    daemon stopped reading (give it a SNDTIMEO)."""

    def __init__(self, ctx, push, endpoint: str, stall_s: float):
        import collections

        self.ctx, self.push, self.endpoint, self.stall_s = ctx, push, endpoint, stall_s
        self.sent: collections.Counter = collections.Counter()
        self.expected: collections.Counter = collections.Counter()
        self.allowed: dict[tuple, frozenset] = {}
        self.bytes = 0

    def send(self, msg: Message) -> None:
        self.sent[msg.kind] += 1
        self.bytes += msg.size
        if msg.kind == DISCONNECT:
            send_to_be_cut_off(self.ctx, self.endpoint, msg.parts, self.stall_s)
            return
        self.push.send_multipart(msg.parts)
        for stream, seq, task, statuses in msg.rows:
            self.expected[(stream, seq, task)] += 1
            self.allowed[(stream, seq, task)] = statuses


def send_to_be_cut_off(ctx, endpoint: str, parts: list[bytes], timeout_s: float) -> None:
    """A message with a part over ZMQ_MAXMSGSIZE, on a fresh PUSH socket: ZeroMQ must drop it and cut that
    peer off (the daemon never sees it). Raises AssertionError when the peer is not cut off in time."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    push = ctx.socket(zmq.PUSH)
    mon = push.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        push.connect(endpoint)
        push.send_multipart(parts)
        assert mon.poll(timeout_s * 1000), "ZeroMQ did not cut off a peer that sent a part over ZMQ_MAXMSGSIZE"
        assert recv_monitor_message(mon)["event"] == zmq.EVENT_DISCONNECTED
    finally:
        push.disable_monitor()
        mon.close(linger=0)
        push.close(linger=0)


def make_seeing_detector(path, seed: int = 3):
    """A detection adapter for the tiny test backbone (vlora_va/testing/tiny.py) whose untrained head fires:
    objectness prior ~27% instead of 1% and sharper logits, so its rows carry detections worth comparing."""
    import torch

    from vlora_va.engine.adapters import load_adapter_dir, save_adapter_dir
    from vlora_va.testing.tiny import make_adapter

    make_adapter(path, "detection", ["person", "car"], seed=seed)
    a = load_adapter_dir("seeing", path, 32)
    with torch.no_grad():
        a.head.cls_out.bias.fill_(-1.0)
        a.head.cls_out.weight.mul_(50.0)
        a.head.box_out.weight.mul_(50.0)
    save_adapter_dir(path, lora=a.lora, rank=a.rank, alpha=a.rank,
                     target_modules=sorted({m.rsplit(".", 1)[-1] for m in a.lora}), base_model="tiny", head=a.head,
                     head_config={k: v for k, v in a.head_config.items() if k not in ("format", "version")})
    return path


def reference_payloads(backbone_dir, adapter_dirs: dict, image_size: int, parts: list[bytes]) -> dict[str, dict]:
    """Each task of a chunk computed alone by a fresh engine, unmerged: what the daemon's rows must say."""
    from vlora_va.contracts.wire import decode_chunk
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.executor import Engine
    from vlora_va.engine.modes import UNMERGED, LoRAMode
    from vlora_va.serving.scheduling import make_plan

    backbone = load_backbone(str(backbone_dir))
    hidden = backbone.config.hidden_size
    engine = Engine(backbone, {n: load_adapter_dir(n, p, hidden) for n, p in adapter_dirs.items()}, image_size)
    reqs = decode_chunk(parts).requests(time.time())
    return {r.task: engine.execute(make_plan([r], LoRAMode(UNMERGED), engine.catalog()))[0].to_json()
            for r in reqs}


def payload_difference(got: dict, want: dict, score_tol: float = 2e-4, box_tol: float = 0.2) -> str | None:
    """None when a result row carries the reference payload (up to the rounding of batched float maths),
    else what differs. Activity rows: label and scores; detection rows: every frame's detections."""
    if "scores" in want:
        if got.get("label") != want["label"]:
            return f"label {got.get('label')!r} != {want['label']!r}"
        diff = {k: (got.get("scores", {}).get(k), v) for k, v in want["scores"].items()
                if got.get("scores", {}).get(k) is None or abs(got["scores"][k] - v) > score_tol}
        return f"scores differ: {diff}" if diff or set(got["scores"]) != set(want["scores"]) else None
    gf, wf = got.get("frames", []), want["frames"]
    if len(gf) != len(wf):
        return f"{len(gf)} frames != {len(wf)}"
    for i, (g, w) in enumerate(zip(gf, wf)):
        gd, wd = g["detections"], w["detections"]
        if [d["class"] for d in gd] != [d["class"] for d in wd]:
            return f"frame {i}: classes {[d['class'] for d in gd]} != {[d['class'] for d in wd]}"
        for a, b in zip(gd, wd):
            off = any(abs(x - y) > box_tol for x, y in zip(a["box"], b["box"]))
            if off or abs(a["score"] - b["score"]) > score_tol:
                return f"frame {i}: detection {a} != {b}"
    return None


def wire_fields() -> set[str]:
    """The field paths of the wire dataclasses, in FIELDS' notation (for the test that keeps FIELDS complete)."""
    from vlora_va.contracts.geometry import Letterbox
    from vlora_va.contracts.wire import ChunkHeader, TaskRequest

    lists = {"frame_ts", "frame_shape", "orig_size", "tasks", "tasks[].frames", "tasks[].reuse_ts"}
    out = set()
    for f in dataclasses.fields(ChunkHeader):
        out.add(f.name)
    out |= {f"letterbox.{f.name}" for f in dataclasses.fields(Letterbox)}
    out |= {f"tasks[].{f.name}" for f in dataclasses.fields(TaskRequest)}
    out |= {f"{p}[]" for p in lists}
    out.add("tasks[]")
    return out

