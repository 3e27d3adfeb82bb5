"""Which daemon runs each stream in cluster mode, and when a stream moves (issue 30). Pure functions over loads
(standard library only: no Ray, no I/O), so the controller calls them and bench/placement.py simulates them at
1,000 streams.

A stream (all its tasks) runs on one daemon. Its `load` is the cost model's seconds of compute per second of video
(serving/capacity.py estimate().need_s); a daemon's `capacity` is the load it may carry, in the same unit.

Why adapter affinity: a daemon serving k distinct adapters holds k of its slots and switches its merged weights
between them (or runs the slower unmerged modes), while streams of one adapter on one daemon batch together. So
`place(..., "affinity")` groups streams by adapter set and keeps each group on as few daemons as it can. Why the
fair share and not the capacity: a daemon takes streams while they bring it closer to its fair share of the load
(total load x its capacity / total capacity), not up to its capacity; filling to capacity at 80% offered load
leaves the last daemons idle and max/mean load near 1.25, and the most loaded daemon is the one whose deadlines
slip first. Even a 5% slack over the share left some daemons idle in the 1,000-stream simulation.

    place          the first placement: "affinity" (the product); "round_robin" and "least_loaded" are the
                   baselines (streams in the order given; least_loaded ignores adapters)
    replace_lost   a daemon died: its streams go to daemons holding their adapters, then to the least loaded
    fill_joined    a daemon joined: the lowest-priority streams move onto it until it carries its fair share,
                   whole adapter groups first (the newcomer holds few adapters, the sources drop some)
    OverloadWatch  a daemon stayed above `high` for `after_s`: its lowest-priority streams move to daemons that
                   stay at or below `low`; hysteresis and a per-stream cooldown so nothing flaps
Everything is deterministic (ties broken by name) and returns moves or a new dict; no input is changed.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

POLICIES = ("affinity", "round_robin", "least_loaded")
REASONS = ("placed", "daemon lost", "daemon joined", "overload")
# After the affinity greedy, a daemon above its fair share x (1 + this) gives a stream away, and one below
# share x (1 - this) takes one (_State.level).
BALANCE_EPS = 0.05
# A daemon that joined takes streams from the others, but none of them gives away more than would leave it under
# this fraction of its fair share: filling the newcomer must not simply empty another daemon. In the 1,000-stream
# simulation 0.8 keeps the newcomer at 1-3 adapters; 0.9 leaves too few whole groups to take (8 adapters), 0.5
# leaves a source at half its share.
SOURCE_FLOOR = 0.8
TOL = 1e-9  # float slack in load comparisons


# ---------------------------------------------------------------- what placement works on
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
    by_id = _index(streams)
    _check_assignment(assignment, by_id)
    out: dict[str, float] = {}
    for sid, d in assignment.items():
        out[d] = out.get(d, 0.0) + by_id[sid].load
    return out


def daemon_adapters(assignment: dict[str, str], streams: list[StreamLoad]) -> dict[str, set[str]]:
    """The distinct adapters each daemon named in the assignment serves: the slots it needs."""
    by_id = _index(streams)
    _check_assignment(assignment, by_id)
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


# ---------------------------------------------------------------- the first placement
def place(streams: list[StreamLoad], daemons: list[DaemonLoad], policy: str = "affinity") -> dict[str, str]:
    """stream id -> daemon name for every stream."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}: known are {', '.join(POLICIES)}")
    _check_daemons(daemons)
    _index(streams)
    if policy == "round_robin":
        return {s.id: daemons[i % len(daemons)].name for i, s in enumerate(streams)}
    if policy == "least_loaded":
        load = {d.name: 0.0 for d in daemons}
        cap = {d.name: d.capacity for d in daemons}
        out = {}
        for s in streams:
            out[s.id] = min(load, key=lambda n: (load[n] / cap[n], n))
            load[out[s.id]] += s.load
        return out
    state = _State(daemons, sum(s.load for s in streams))
    state.place_all(streams)
    state.level()
    where = state.where()
    return {s.id: where[s.id] for s in streams}


# ---------------------------------------------------------------- a daemon lost, a daemon joined
def replace_lost(assignment: dict[str, str], streams: list[StreamLoad], daemons: list[DaemonLoad],
                 lost: str) -> list[Move]:
    """Moves for the streams the lost daemon ran, onto `daemons` (the lost one is left out should it be listed):
    to a daemon holding their adapters with room below its fair share first, else the least loaded. Streams on
    other daemons do not move; streams on daemons not listed are left alone and not counted."""
    daemons = [d for d in daemons if d.name != lost]
    _check_daemons(daemons, what=f"daemons left after losing {lost}")
    by_id = _index(streams)
    _check_assignment(assignment, by_id)
    names = {d.name for d in daemons}
    moving = [by_id[sid] for sid, d in sorted(assignment.items()) if d == lost]
    staying = [(by_id[sid], d) for sid, d in sorted(assignment.items()) if d in names]
    state = _State(daemons, sum(s.load for s in moving) + sum(s.load for s, _ in staying))
    for s, d in staying:
        state.add(d, s)
    return [Move(s.id, lost, d, "daemon lost") for s, d in state.place_all(moving)]


def fill_joined(assignment: dict[str, str], streams: list[StreamLoad], daemons: list[DaemonLoad],
                joined: str) -> list[Move]:
    """Moves onto the daemon that joined (listed in `daemons`) until it carries about its fair share (within one
    stream's load). Lowest priority first; within a priority, whole groups of one adapter set on one source
    (the source then drops that adapter), those of adapters the newcomer already holds first, the largest that
    fits first. No source is left under SOURCE_FLOOR of its fair share, unless it ends at most half the moved
    load under it (`_source_ok`)."""
    _check_daemons(daemons)
    state = _placed(assignment, streams, daemons, joined, "the daemon that joined")
    state.set_shares(sum(state.load.values()))
    goal = state.share[joined]
    moves: list[Move] = []
    others = [(s, d) for d, on in sorted(state.on.items()) if d != joined for s in on.values()]
    for priority in sorted({s.priority for s, _ in others}):
        units: dict[tuple[str, frozenset], list[StreamLoad]] = defaultdict(list)
        for s, d in others:
            if s.priority == priority:
                units[(d, s.adapters)].append(s)
        while units and state.load[joined] < goal - TOL:
            (src, adapters), group = min(units.items(), key=lambda u: _unit_key(state, joined, goal, *u))
            del units[(src, adapters)]
            moves += _take(state, joined, goal, src, group)
        if state.load[joined] >= goal - TOL:
            break
    return moves


def _unit_key(state: "_State", joined: str, goal: float, unit: tuple[str, frozenset], group: list[StreamLoad]):
    src, adapters = unit
    load = sum(s.load for s in group)
    fits = state.load[joined] + load <= goal + TOL and _source_ok(state, joined, src, load)
    held = all(state.holds(joined, a) for a in adapters)
    return (not held, not fits, -load if fits else load, -(state.load[src] - state.share[src]), src,
            sorted(adapters))


def _source_ok(state: "_State", joined: str, src: str, load: float) -> bool:
    """Taking `load` off the source keeps it above SOURCE_FLOOR of its share, or leaves it at most half the load
    under its share (the newcomer's own rule: with few streams one stream is a large part of a share, and the floor
    alone would keep 4 equal streams on 2 daemons when a third joins)."""
    return (state.load[src] - load >= SOURCE_FLOOR * state.share[src] - TOL
            or state.load[src] - load >= state.share[src] - load / 2 - TOL)


def _take(state: "_State", joined: str, goal: float, src: str, group: list[StreamLoad]) -> list[Move]:
    """Streams of one unit onto the newcomer: all of them when they fit, else each that brings the newcomer
    closer to its share, keeping the source above its floor and the newcomer within its slots."""
    moves = []
    whole = state.load[joined] + sum(s.load for s in group) <= goal + TOL
    for s in sorted(group, key=lambda s: (-s.load, s.id)):
        closer = state.load[joined] + s.load <= goal + (TOL if whole else s.load / 2)
        # (moving what costs nothing helps none)
        if s.load > 0 and closer and _source_ok(state, joined, src, s.load) and state.slots_ok(joined, s):
            state.remove(src, s)
            state.add(joined, s)
            moves.append(Move(s.id, src, joined, "daemon joined"))
    return moves


# ---------------------------------------------------------------- overload
class OverloadWatch:
    """Which daemons stay overloaded, and which streams leave them.

    `update` reports a daemon once when its utilisation (measured load / capacity) has been above `high` for at
    least `after_s` without a break; it is reported again only after it has fallen below `low`. A value that
    oscillates around `high` dips below it, which restarts the clock, so it is never reported: nothing flaps.
    `relieve` moves streams off a reported daemon; a stream moved in the last `cooldown_s` (by relieve, or by
    any move passed to `remember`) never moves again, so no stream ping-pongs between two daemons.
    """

    def __init__(self, high: float = 0.95, low: float = 0.75, after_s: float = 10.0, cooldown_s: float = 60.0):
        for name, v in (("high", high), ("low", low), ("after_s", after_s), ("cooldown_s", cooldown_s)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"OverloadWatch {name} must be a finite number >= 0, got {v!r}")
        if not 0 < low < high:
            raise ValueError(f"OverloadWatch needs 0 < low < high (the gap is the hysteresis), got low={low}, "
                             f"high={high}")
        self.high, self.low, self.after_s, self.cooldown_s = high, low, after_s, cooldown_s
        self._since: dict[str, float] = {}  # daemon -> when it went above high (continuously since)
        self._reported: set[str] = set()  # reported, not yet below low
        self._last: dict[str, float] = {}  # daemon -> latest utilisation
        self._moved: dict[str, float] = {}  # stream -> when it last moved

    def update(self, now: float, utilisation: dict[str, float]) -> list[str]:
        """The daemons to relieve now (sorted). A daemon missing from `utilisation` is forgotten (gone)."""
        if not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ValueError(f"OverloadWatch.update: now must be a finite time, got {now!r}")
        for d, u in utilisation.items():
            if not isinstance(u, (int, float)) or not math.isfinite(u) or u < 0:
                raise ValueError(f"OverloadWatch.update: utilisation of {d} must be a finite number >= 0, got {u!r}")
        for d in set(self._last) - set(utilisation):
            self._since.pop(d, None)
            self._reported.discard(d)
            self._last.pop(d, None)
        out = []
        for d, u in sorted(utilisation.items()):
            self._last[d] = u
            if u > self.high:
                since = self._since.setdefault(d, now)
                if d not in self._reported and now - since >= self.after_s:
                    self._reported.add(d)
                    out.append(d)
            else:
                self._since.pop(d, None)
                if u < self.low:
                    self._reported.discard(d)
        return out

    def remember(self, moves: list[Move], now: float) -> None:
        """Moves made elsewhere (a daemon lost or joined): their streams get the same cooldown."""
        self._forget_moves(now)
        for m in moves:
            self._moved[m.stream] = now

    def _forget_moves(self, now: float) -> None:
        self._moved = {sid: t for sid, t in self._moved.items() if now - t < self.cooldown_s}

    def relieve(self, assignment: dict[str, str], streams: list[StreamLoad], daemons: list[DaemonLoad],
                overloaded: str, now: float) -> list[Move]:
        """Moves of the overloaded daemon's streams, lowest priority first (then the largest), until its
        utilisation is estimated at or below `low`. A target takes a stream only if its load stays at or below
        `low` x capacity after it (its load: the larger of the model's and its last measured utilisation's) and
        it has a free slot for the stream's adapters; holders of the adapters first, then the least utilised.
        A stream moved within `cooldown_s` stays. A stream no target has room for stays (it is skipped, and the
        next may fit); with no room anywhere, no move: the daemon stays overloaded and its admission control
        sheds its lowest priorities. The moves are remembered for the cooldown: apply them."""
        self._forget_moves(now)
        state = _placed(assignment, streams, daemons, overloaded, "the overloaded daemon")
        cap = {n: d.capacity for n, d in state.daemons.items()}
        measured = {n: self._last[n] * cap[n] for n in state.daemons if n in self._last}
        model = state.load[overloaded]
        current = measured.get(overloaded, model)
        # measured seconds per modelled second on the overloaded daemon: a slow machine sheds more per stream
        scale = current / model if model > 0 else 1.0
        added: dict[str, float] = defaultdict(float)

        def carried(n: str) -> float:
            return max(state.load[n], measured.get(n, 0.0) + added[n])

        moves = []
        candidates = sorted(state.on[overloaded].values(), key=lambda s: (s.priority, -s.load, s.id))
        for s in candidates:
            if current <= self.low * cap[overloaded] + TOL:
                break
            if now - self._moved.get(s.id, -math.inf) < self.cooldown_s:
                continue
            targets = [n for n in state.names if n != overloaded and state.slots_ok(n, s)
                       and carried(n) + s.load <= self.low * cap[n] + TOL]
            if not targets:
                continue
            t = min(targets, key=lambda n: (state.missing(n, s), carried(n) / cap[n], n))
            state.remove(overloaded, s)
            state.add(t, s)
            added[t] += s.load
            current -= s.load * scale
            self._moved[s.id] = now
            moves.append(Move(s.id, overloaded, t, "overload"))
        return moves


# ---------------------------------------------------------------- the packing state
class _State:
    """Loads, adapters and streams per daemon while a placement is built or changed."""

    def __init__(self, daemons: list[DaemonLoad], total_load: float):
        self.daemons = {d.name: d for d in daemons}
        self.names = sorted(self.daemons)
        self.load = dict.fromkeys(self.names, 0.0)
        self.uses: dict[str, Counter] = {n: Counter() for n in self.names}  # adapter -> streams using it
        self.on: dict[str, dict[str, StreamLoad]] = {n: {} for n in self.names}
        self.holders: dict[str, set[str]] = defaultdict(set)  # adapter -> daemons holding it (resident or used)
        for d in daemons:
            for a in d.resident:
                self.holders[a].add(d.name)
        self.set_shares(total_load)

    def set_shares(self, total_load: float) -> None:
        capacity = sum(d.capacity for d in self.daemons.values())
        self.share = {n: total_load * d.capacity / capacity for n, d in self.daemons.items()}

    # what a daemon holds
    def holds(self, d: str, adapter: str) -> bool:
        return adapter in self.uses[d] or adapter in self.daemons[d].resident

    def missing(self, d: str, s: StreamLoad) -> int:
        """The stream's adapters the daemon does not hold (resident ones count as held)."""
        return sum(not self.holds(d, a) for a in s.adapters)

    def slots_ok(self, d: str, s: StreamLoad) -> bool:
        """The daemon can serve the stream's adapters within its slots (resident adapters no stream uses can be
        evicted, so they take no slot)."""
        return len(self.uses[d]) + sum(a not in self.uses[d] for a in s.adapters) <= self.daemons[d].slots

    def room(self, d: str) -> float:
        """How far the daemon is below its fair share."""
        return self.share[d] - self.load[d]

    def fits(self, d: str, s: StreamLoad) -> bool:
        """The stream brings the daemon closer to its fair share (it may end above it by half the stream's load):
        a daemon takes streams up to its share, not its capacity, and the loads add up to the shares exactly,
        so none is left idle. A stream that costs nothing fits anywhere (it goes where its adapter is)."""
        return s.load == 0 or s.load / 2 <= self.room(d) + TOL

    def add(self, d: str, s: StreamLoad) -> None:
        self.load[d] += s.load
        self.on[d][s.id] = s
        for a in s.adapters:
            self.uses[d][a] += 1
            self.holders[a].add(d)

    def remove(self, d: str, s: StreamLoad) -> None:
        self.load[d] -= s.load
        del self.on[d][s.id]
        for a in s.adapters:
            self.uses[d][a] -= 1
            if not self.uses[d][a]:
                del self.uses[d][a]
                if a not in self.daemons[d].resident:
                    self.holders[a].discard(d)

    def where(self) -> dict[str, str]:
        return {sid: d for d, on in self.on.items() for sid in on}

    # affinity
    def place_all(self, streams: list[StreamLoad]) -> list[tuple[StreamLoad, str]]:
        """Each stream onto a daemon (added to the state), adapter groups by load descending, each group's
        streams largest first (small ones then fill what the large ones left)."""
        groups: dict[frozenset, list[StreamLoad]] = defaultdict(list)
        for s in streams:
            groups[s.adapters].append(s)
        order = sorted(groups.items(), key=lambda g: (-sum(s.load for s in g[1]), sorted(g[0])))
        out = []
        for _, group in order:
            group = sorted(group, key=lambda s: (-s.load, s.id))
            rest = sum(s.load for s in group)
            for s in group:
                d = self.choose(s, rest)
                self.add(d, s)
                out.append((s, d))
                rest -= s.load
        return out

    def choose(self, s: StreamLoad, rest: float) -> str:
        """The daemon for one stream; `rest`: its group's load not yet placed, this stream's included.
        1. a daemon holding all its adapters with room for it: the fullest (so a group stays on few daemons)
        2. a daemon with room and free slots, fewest missing adapters; among those, the one whose room best fits
           the whole rest of the group (so it is not split), else the one with the most room
        3. no room anywhere: the least loaded for its capacity, within slots where any daemon can be"""
        if s.adapters:
            holders = set.intersection(*(self.holders.get(a, set()) for a in s.adapters))
            fit = [d for d in holders if self.fits(d, s)]
            if fit:
                return min(fit, key=lambda d: (self.room(d), d))
        open_ = [d for d in self.names if self.fits(d, s) and self.slots_ok(d, s)]
        if open_:
            def key(d: str):
                room = self.room(d)
                return (self.missing(d, s), 0, room, d) if room >= rest - TOL else (self.missing(d, s), 1, -room, d)
            return min(open_, key=key)
        within = [d for d in self.names if self.slots_ok(d, s)] or self.names
        return min(within, key=lambda d: ((self.load[d] + s.load) / self.daemons[d].capacity, self.missing(d, s), d))

    def level(self) -> None:
        """Local improvement after the greedy, one stream at a time: the most loaded daemon above its share x
        (1 + BALANCE_EPS) gives a stream to a daemon it fits; else the least loaded below share x (1 - BALANCE_EPS)
        takes one from a daemon left at least as loaded as it. Moves that add no adapter load (the receiver holds
        the adapter, or the source drops it) first. Every move narrows the gap between its two daemons (the sum
        of squared loads falls), so this ends; it stops when no move helps."""
        for _ in range(sum(len(on) for on in self.on.values())):
            move = self._from_top() or self._to_bottom()
            if move is None:
                return
            s, source, target = move
            self.remove(source, s)
            self.add(target, s)

    def _ratio(self, d: str) -> float:
        return self.load[d] / self.share[d] if self.share[d] > 0 else 0.0

    def _from_top(self) -> tuple[StreamLoad, str, str] | None:
        top = max(self.names, key=lambda d: (self._ratio(d), d))
        if self.load[top] <= self.share[top] * (1 + BALANCE_EPS) + TOL:
            return None
        moves = [(s, top, d) for s in self.on[top].values() if s.load > 0 for d in self.names
                 if d != top and self.fits(d, s) and self.slots_ok(d, s) and self.load[d] + s.load < self.load[top]]
        return min(moves, key=self._move_key, default=None)

    def _to_bottom(self) -> tuple[StreamLoad, str, str] | None:
        low = min(self.names, key=lambda d: (self._ratio(d), d))
        if self.load[low] >= self.share[low] * (1 - BALANCE_EPS) - TOL:
            return None
        # the source keeps at least what the target then carries: the least loaded only ever rises
        moves = [(s, d, low) for d in self.names if d != low for s in self.on[d].values()
                 if s.load > 0 and self.load[low] + s.load <= self.load[d] - s.load + TOL and self.fits(low, s)
                 and self.slots_ok(low, s)]
        return min(moves, key=self._move_key, default=None)

    def _move_key(self, move: tuple[StreamLoad, str, str]):
        """Adapter loads the move adds (the target's new adapters less those the source drops), then the
        largest stream (fewest moves)."""
        s, source, target = move
        added = self.missing(target, s) - sum(self.uses[source][a] == 1 for a in s.adapters)
        return (added, -s.load, target, source, s.id)


# ---------------------------------------------------------------- checks
def _placed(assignment: dict[str, str], streams: list[StreamLoad], daemons: list[DaemonLoad], name: str,
            what: str) -> "_State":
    """The packing state of `assignment` over `daemons` (streams on daemons not listed are left out), which must
    include `name` (`what` says which daemon that is, for the error)."""
    by_id = _index(streams)
    _check_assignment(assignment, by_id)
    state = _State(daemons, 0.0)
    if name not in state.daemons:
        raise ValueError(f"{what}, {name!r}, is not among the daemons given")
    for sid, d in sorted(assignment.items()):
        if d in state.daemons:
            state.add(d, by_id[sid])
    return state


def _index(streams: list[StreamLoad]) -> dict[str, StreamLoad]:
    by_id: dict[str, StreamLoad] = {}
    for s in streams:
        if not isinstance(s, StreamLoad):
            raise ValueError(f"streams must be StreamLoad, got {type(s).__name__}")
        if s.id in by_id:
            raise ValueError(f"duplicate stream id {s.id!r}")
        by_id[s.id] = s
    return by_id


def _check_daemons(daemons: list[DaemonLoad], what: str = "daemons") -> None:
    if not daemons:
        raise ValueError(f"no daemons to place streams on ({what} is empty)")
    seen: set[str] = set()
    for d in daemons:
        if not isinstance(d, DaemonLoad):
            raise ValueError(f"daemons must be DaemonLoad, got {type(d).__name__}")
        if d.name in seen:
            raise ValueError(f"duplicate daemon name {d.name!r}")
        seen.add(d.name)


def _check_assignment(assignment: dict[str, str], by_id: dict[str, StreamLoad]) -> None:
    unknown = sorted(set(assignment) - set(by_id))
    if unknown:
        raise ValueError(f"the assignment names stream(s) not among the streams given: {', '.join(unknown[:5])}")
