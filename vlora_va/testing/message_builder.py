"""The building blocks of the fuzz generator's messages (vlora_va/testing/messages.py): what a message is and what
the daemon owes it, a valid header and its frames, the field paths of a header and a value that breaks a field's
spec. MessageGen's mutations start from these."""

from __future__ import annotations

import json
import random
import string
import time
from dataclasses import dataclass, field
from typing import Callable

from vlora_va.contracts.wire import PROTOCOL_VERSION, largest_part_bytes
from vlora_va.serving.transport import CLOCK_MAX_SKEW_S
from vlora_va.testing.wire_schema import FIELDS, OPTIONAL_VALUES, spec_key

MALFORMED, ERROR_ROWS, OK, DISCONNECT = "malformed", "error-rows", "ok", "disconnect"
KINDS = (MALFORMED, ERROR_ROWS, OK, DISCONNECT)
SERVED = frozenset({"ok", "shed"})  # what a servable request may get back
ERROR = frozenset({"error"})

LIVE_STREAM = "live"  # the valid stream interleaved with the fuzz; no fuzz stream id starts with it
LIVE_PRIORITY = 1000  # the top tier: overload control sheds fuzz work (priority < 1000) first
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


class MessageBuilder:
    """The generator's state (its seeded random source, stream pool, frames) and how it builds messages."""

    def __init__(self, seed: int, image_size: int, adapters: tuple[str, ...], clock: Callable[[], float],
                 streams: int, fresh_stream_rate: float, max_message_images: int):
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
