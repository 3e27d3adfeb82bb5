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
The parts: what placement works on (StreamLoad, DaemonLoad, Move, reading an assignment) in cluster/loads.py, the
packing state and the affinity greedy in cluster/packing.py, OverloadWatch in cluster/overload.py; all are
importable from here.
"""

from __future__ import annotations

from collections import defaultdict

from vlora_va.cluster.loads import (
    REASONS,
    TOL,
    DaemonLoad,
    Move,
    StreamLoad,
    apply,
    check_assignment,
    check_daemons,
    daemon_adapters,
    daemon_loads,
    index_streams,
)
from vlora_va.cluster.overload import OverloadWatch
from vlora_va.cluster.packing import Packing, placed

# What callers import from here: the placement functions and what they work on
__all__ = ["POLICIES", "REASONS", "DaemonLoad", "Move", "OverloadWatch", "StreamLoad", "apply", "daemon_adapters",
           "daemon_loads", "fill_joined", "place", "replace_lost"]

POLICIES = ("affinity", "round_robin", "least_loaded")
# A daemon that joined takes streams from the others, but none of them gives away more than would leave it under
# this fraction of its fair share: filling the newcomer must not simply empty another daemon. In the 1,000-stream
# simulation 0.8 keeps the newcomer at 1-3 adapters; 0.9 leaves too few whole groups to take (8 adapters), 0.5
# leaves a source at half its share.
SOURCE_FLOOR = 0.8


# ---------------------------------------------------------------- the first placement
def place(streams: list[StreamLoad], daemons: list[DaemonLoad], policy: str = "affinity") -> dict[str, str]:
    """stream id -> daemon name for every stream."""
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}: known are {', '.join(POLICIES)}")
    check_daemons(daemons)
    index_streams(streams)
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
    state = Packing(daemons, sum(s.load for s in streams))
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
    check_daemons(daemons, what=f"daemons left after losing {lost}")
    by_id = index_streams(streams)
    check_assignment(assignment, by_id)
    names = {d.name for d in daemons}
    moving = [by_id[sid] for sid, d in sorted(assignment.items()) if d == lost]
    staying = [(by_id[sid], d) for sid, d in sorted(assignment.items()) if d in names]
    state = Packing(daemons, sum(s.load for s in moving) + sum(s.load for s, _ in staying))
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
    check_daemons(daemons)
    state = placed(assignment, streams, daemons, joined, "the daemon that joined")
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


def _unit_key(state: Packing, joined: str, goal: float, unit: tuple[str, frozenset], group: list[StreamLoad]):
    src, adapters = unit
    load = sum(s.load for s in group)
    fits = state.load[joined] + load <= goal + TOL and _source_ok(state, joined, src, load)
    held = all(state.holds(joined, a) for a in adapters)
    return (not held, not fits, -load if fits else load, -(state.load[src] - state.share[src]), src,
            sorted(adapters))


def _source_ok(state: Packing, joined: str, src: str, load: float) -> bool:
    """Taking `load` off the source keeps it above SOURCE_FLOOR of its share, or leaves it at most half the load
    under its share (the newcomer's own rule: with few streams one stream is a large part of a share, and the floor
    alone would keep 4 equal streams on 2 daemons when a third joins)."""
    return (state.load[src] - load >= SOURCE_FLOOR * state.share[src] - TOL
            or state.load[src] - load >= state.share[src] - load / 2 - TOL)


def _take(state: Packing, joined: str, goal: float, src: str, group: list[StreamLoad]) -> list[Move]:
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
