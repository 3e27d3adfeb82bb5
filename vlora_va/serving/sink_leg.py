"""The sink leg: the part of a row's way that comes after its compute, which the scheduler keeps out of its budget.

    compute ends ─► rows (analytics, ordering, counting) ─► handed to the sinks ─► a local sink's thread writes it
                    └────────── hand-off ────────────┘                     └─────── delivery lag ───────┘

A row's deadline is judged where it is handed to the sinks (`ResultRecord.handed`), and a reader of a file or of
standard output sees it after the local sink's delivery lag. The scheduler plans batches to end by the deadline
minus this leg (`Scheduler.reserve_s`), so a row read from a local sink is in time. Both parts are measured online:
the hand-off per served batch (from its compute end to the end of its rows' write), the lag by each local sink
per delivered batch; the reserve is their 99th percentiles over recent batches, added (the two are not
independent enough to combine otherwise). Network sinks are asynchronous and not part of it (docs/results.md).
"""

from __future__ import annotations

import collections

from vlora_va.common.percentile import percentile

KEPT = 256  # recent batches per measurement
MIN_SAMPLES = 8  # fewer than this: no reserve yet (the first batches of a run)
QUANTILE = 0.99
MAX_RESERVE_S = 0.25  # a sink leg beyond this is a stalled sink (its queue shows it), not a leg to budget for


class SinkLeg:
    def __init__(self):
        self._handoffs: collections.deque[float] = collections.deque(maxlen=KEPT)

    def handed_off(self, seconds: float) -> None:
        """One served batch: its compute end to the end of its rows' hand-off."""
        self._handoffs.append(max(0.0, seconds))

    def reserve_s(self, sinks: list) -> float:
        """The seconds to keep out of the deadline budget now: p99 hand-off + the largest local sink's p99 lag."""
        handoff = percentile(list(self._handoffs), QUANTILE) if len(self._handoffs) >= MIN_SAMPLES else 0.0
        lags = [percentile(lag, QUANTILE) for s in sinks if getattr(s, "local", False)
                and len(lag := s.delivery_lags()) >= MIN_SAMPLES]
        return min(MAX_RESERVE_S, handoff + max(lags, default=0.0))
