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

The parts: the schema (wire_schema.py), the building blocks of a message (message_builder.py), the sending
side's books (fuzz_sending.py) and the reference answers (reference_rows.py); all are importable from here.
"""

from __future__ import annotations

import copy
import json
import string
import time
from typing import Callable

from vlora_va.contracts.wire import MAX_FRAMES, MAX_HEADER_BYTES, MAX_SEQ, MAX_TASKS
from vlora_va.testing.fuzz_sending import RowTail, Sender, send_to_be_cut_off
from vlora_va.testing.message_builder import (
    DISCONNECT,
    ERROR,
    ERROR_ROWS,
    KINDS,
    LIVE_PRIORITY,
    LIVE_STREAM,
    MALFORMED,
    OK,
    SERVED,
    Message,
    MessageBuilder,
)
from vlora_va.testing.reference_rows import make_seeing_detector, payload_difference, reference_payloads
from vlora_va.testing.wire_schema import (
    FIELDS,
    MAX_MEDIA_S,
    MAX_ORIG,
    MAX_SIDE,
    MAX_WALL,
    OPTIONAL,
    OPTIONAL_VALUES,
    spec_key,
    wire_fields,
)

# What the fuzz test and bench/fuzz.py import from here: the generator, and the parts it is built from
__all__ = ["DISCONNECT", "ERROR", "ERROR_ROWS", "FIELDS", "KINDS", "LIVE_PRIORITY", "LIVE_STREAM", "MALFORMED", "OK",
           "SERVED", "Message", "MessageGen", "RowTail", "Sender", "make_seeing_detector", "payload_difference",
           "reference_payloads", "send_to_be_cut_off", "wire_fields"]


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


class MessageGen(MessageBuilder):
    """next(gen) -> a Message. Seeded: the same seed gives the same messages (except the wall-clock fields of
    valid ones, which follow `clock` so that their deadlines can be met)."""

    def __init__(self, seed: int, image_size: int, adapters: tuple[str, ...], *, clock: Callable[[], float] = time.time,
                 streams: int = 8, fresh_stream_rate: float = 0.1, max_message_images: int = 160,
                 ok_weight: float = 1.0):
        """ok_weight scales how often servable messages come (they cost engine time: a long run lowers it).
        fresh_stream_rate: the share of valid-wire messages on a stream id never seen before (per-stream state
        in the daemon); 0 keeps every message on the `streams` pool ids, legal oddities included."""
        super().__init__(seed, image_size, adapters, clock, streams, fresh_stream_rate, max_message_images)
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
