"""What cluster placement works on (issue 30): a stream's load, a daemon's capacity and the adapters it holds, a
move of one stream; reading and applying an assignment (stream id -> daemon name), and the checks every placement
function runs on its input. Standard library only (bench/placement.py runs placement without Ray)."""

from __future__ import annotations

import math
from dataclasses import dataclass

REASONS = ("placed", "daemon lost", "daemon joined", "overload")
TOL = 1e-9  # float slack in load comparisons


@dataclass(frozen=True)
class StreamLoad:
    id: str
    adapters: frozenset[str]
    load: float  # seconds of compute per second of video this stream costs a daemon (need_s)
    priority: int = 0  # higher is more important; the lowest priority moves first

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"stream id must be a non-empty string, got {self.id!r}")
        if isinstance(self.adapters, str):  # frozenset("detect") would be its letters
            raise ValueError(f"stream {self.id}: adapters must be a set of adapter names, got the string "
                             f"{self.adapters!r}")
        object.__setattr__(self, "adapters", frozenset(self.adapters))
        if not isinstance(self.load, (int, float)) or not math.isfinite(self.load) or self.load < 0:
            raise ValueError(f"stream {self.id}: load must be a finite number >= 0 (seconds of compute per second "
                             f"of video), got {self.load!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError(f"stream {self.id}: priority must be an integer, got {self.priority!r}")


@dataclass(frozen=True)
class DaemonLoad:
    name: str
    capacity: float = 0.9  # load it may carry (same unit as StreamLoad.load)
    slots: int = 8  # adapters it can hold at once
    resident: frozenset[str] = frozenset()  # adapters it holds now (affinity counts these as already loaded)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"daemon name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.capacity, (int, float)) or not math.isfinite(self.capacity) or self.capacity <= 0:
            raise ValueError(f"daemon {self.name}: capacity must be a finite number > 0, got {self.capacity!r}")
        if not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"daemon {self.name}: slots must be an integer >= 1, got {self.slots!r}")
        if isinstance(self.resident, str):
            raise ValueError(f"daemon {self.name}: resident must be a set of adapter names, got the string "
                             f"{self.resident!r}")
        object.__setattr__(self, "resident", frozenset(self.resident))


@dataclass(frozen=True)
class Move:
    stream: str
    source: str | None  # None: first placement
    target: str
    reason: str  # one of REASONS

    def __post_init__(self):
        if self.reason not in REASONS:
            raise ValueError(f"move of {self.stream}: reason must be one of {REASONS}, got {self.reason!r}")


# ---------------------------------------------------------------- reading an assignment
def daemon_loads(assignment: dict[str, str], streams: list[StreamLoad]) -> dict[str, float]:
    """Load per daemon named in the assignment (streams not assigned count nowhere)."""
    by_id = index_streams(streams)
    check_assignment(assignment, by_id)
    out: dict[str, float] = {}
    for sid, d in assignment.items():
        out[d] = out.get(d, 0.0) + by_id[sid].load
    return out


def daemon_adapters(assignment: dict[str, str], streams: list[StreamLoad]) -> dict[str, set[str]]:
    """The distinct adapters each daemon named in the assignment serves: the slots it needs."""
    by_id = index_streams(streams)
    check_assignment(assignment, by_id)
    out: dict[str, set[str]] = {}
    for sid, d in assignment.items():
        out.setdefault(d, set()).update(by_id[sid].adapters)
    return out


def apply(assignment: dict[str, str], moves: list[Move]) -> dict[str, str]:
    """The assignment after the moves, as a new dict. A move whose source is not where its stream is now is stale
    (computed from another assignment): ValueError rather than a silent double move."""
    out = dict(assignment)
    for m in moves:
        if out.get(m.stream) != m.source:
            where = f"on {out[m.stream]}" if m.stream in out else "not placed"
            raise ValueError(f"stale move of stream {m.stream}: it is {where}, the move says from {m.source}")
        out[m.stream] = m.target
    return out



# ---------------------------------------------------------------- checks
def index_streams(streams: list[StreamLoad]) -> dict[str, StreamLoad]:
    by_id: dict[str, StreamLoad] = {}
    for s in streams:
        if not isinstance(s, StreamLoad):
            raise ValueError(f"streams must be StreamLoad, got {type(s).__name__}")
        if s.id in by_id:
            raise ValueError(f"duplicate stream id {s.id!r}")
        by_id[s.id] = s
    return by_id


def check_daemons(daemons: list[DaemonLoad], what: str = "daemons") -> None:
    if not daemons:
        raise ValueError(f"no daemons to place streams on ({what} is empty)")
    seen: set[str] = set()
    for d in daemons:
        if not isinstance(d, DaemonLoad):
            raise ValueError(f"daemons must be DaemonLoad, got {type(d).__name__}")
        if d.name in seen:
            raise ValueError(f"duplicate daemon name {d.name!r}")
        seen.add(d.name)


def check_assignment(assignment: dict[str, str], by_id: dict[str, StreamLoad]) -> None:
    unknown = sorted(set(assignment) - set(by_id))
    if unknown:
        raise ValueError(f"the assignment names stream(s) not among the streams given: {', '.join(unknown[:5])}")
