"""The packing state behind cluster placement: loads, adapters and streams per daemon while a placement is built
or changed, the affinity greedy that places streams onto it, and the levelling that follows (vlora_va.cluster.placement
says why affinity and why the fair share)."""

from __future__ import annotations

from collections import Counter, defaultdict

from vlora_va.cluster.loads import TOL, DaemonLoad, StreamLoad, check_assignment, index_streams

# After the affinity greedy, a daemon above its fair share x (1 + this) gives a stream away, and one below
# share x (1 - this) takes one (Packing.level).
BALANCE_EPS = 0.05


class Packing:
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


def placed(assignment: dict[str, str], streams: list[StreamLoad], daemons: list[DaemonLoad], name: str,
            what: str) -> Packing:
    """The packing state of `assignment` over `daemons` (streams on daemons not listed are left out), which must
    include `name` (`what` says which daemon that is, for the error)."""
    by_id = index_streams(streams)
    check_assignment(assignment, by_id)
    state = Packing(daemons, 0.0)
    if name not in state.daemons:
        raise ValueError(f"{what}, {name!r}, is not among the daemons given")
    for sid, d in sorted(assignment.items()):
        if d in state.daemons:
            state.add(d, by_id[sid])
    return state
