"""Overload in cluster mode (issue 30): which daemons stay overloaded, and which of their streams move where, with
hysteresis and a per-stream cooldown so nothing flaps. Standard library only."""

from __future__ import annotations

import math
from collections import defaultdict

from vlora_va.cluster.loads import TOL, DaemonLoad, Move, StreamLoad
from vlora_va.cluster.packing import placed


class OverloadWatch:
    """Which daemons stay overloaded, and which streams leave them.

    `update` reports a daemon once when its utilisation (measured load / capacity) has been above `high` for at
    least `after_s` without a break; it is reported again only after it has fallen below `low`. A value that
    oscillates around `high` dips below it, which restarts the clock, so it is never reported: nothing flaps.
    `relieve` moves streams off a reported daemon; a stream moved in the last `cooldown_s` (by relieve, or by
    any move passed to `remember`) never moves again, so no stream ping-pongs between two daemons. What it relieves
    is the least utilisation seen while the daemon stayed above `high` (its floor), not the last reading: a daemon's
    load is measured over a few seconds of arrivals, and a reading taken at a burst moved more streams than the
    overload needed (seen on a 2-core EPYC capped at AVX2, 2026-12-08: 1.65 at the last ping, 0.99 most of the time).
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
        self._floor: dict[str, float] = {}  # daemon -> least utilisation since it went above high
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
            self._floor.pop(d, None)
        out = []
        for d, u in sorted(utilisation.items()):
            self._last[d] = u
            if u > self.high:
                since = self._since.setdefault(d, now)
                self._floor[d] = min(self._floor.get(d, u), u)
                if d not in self._reported and now - since >= self.after_s:
                    self._reported.add(d)
                    out.append(d)
            else:
                self._since.pop(d, None)
                self._floor.pop(d, None)
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
        state = placed(assignment, streams, daemons, overloaded, "the overloaded daemon")
        cap = {n: d.capacity for n, d in state.daemons.items()}
        measured = {n: self._last[n] * cap[n] for n in state.daemons if n in self._last}
        model = state.load[overloaded]
        floor = self._floor.get(overloaded)
        current = floor * cap[overloaded] if floor is not None else measured.get(overloaded, model)
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
