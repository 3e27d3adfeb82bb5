"""Accuracy-aware knowledge fusion (V-LoRA §4.1): pack knowledge sources into as few adapters as possible
while every task stays at or above its required accuracy.

Greedy, in the given source order:
  1. train the *current* adapter further on the next source (its previous sources stay in the training
     data, so it does not forget them);
  2. evaluate every task of that adapter on validation data;
  3. if all meet their requirement, keep the new state; otherwise roll back to the state before step 1
     and open a new adapter, trained on that source alone.
A new adapter that misses its requirement by itself is kept (there is nothing better to do) and flagged.
Training and evaluation are passed in as functions, so the algorithm is tested exactly on synthetic cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

TrainFn = Callable[[Any, list[str]], Any]  # (state or None for a new adapter, member sources) -> new state
EvalFn = Callable[[Any, list[str]], dict[str, float]]  # (state, member sources) -> {task: accuracy}


@dataclass
class FusedAdapter:
    sources: list[str]
    state: Any
    accuracy: dict[str, float]

    def meets(self, required: dict[str, float]) -> bool:
        return all(self.accuracy[t] >= required.get(t, 0.0) for t in self.accuracy)


@dataclass
class FusionResult:
    adapters: list[FusedAdapter]
    log: list[dict] = field(default_factory=list)  # one entry per decision, in order

    def placement(self) -> dict[str, int]:
        return {s: i for i, a in enumerate(self.adapters) for s in a.sources}


def fuse(sources: list[str], required: dict[str, float], train: TrainFn, evaluate: EvalFn,
         tasks_of: Callable[[str], list[str]] = lambda s: [s]) -> FusionResult:
    """sources: knowledge-source names in fusion order; required: {task: minimum accuracy}."""
    result = FusionResult([])
    for src in sources:
        if result.adapters:
            cur = result.adapters[-1]
            members = cur.sources + [src]
            state = train(cur.state, members)
            acc = {t: a for t, a in evaluate(state, members).items() if t in _tasks(members, tasks_of)}
            failing = sorted(t for t, a in acc.items() if a < required.get(t, 0.0))
            result.log.append({"source": src, "adapter": len(result.adapters) - 1, "accuracy": acc,
                               "decision": "rollback" if failing else "fused", "failing": failing})
            if not failing:
                cur.sources, cur.state, cur.accuracy = members, state, acc
                continue
        state = train(None, [src])
        acc = {t: a for t, a in evaluate(state, [src]).items() if t in tasks_of(src)}
        result.adapters.append(FusedAdapter([src], state, acc))
        result.log.append({"source": src, "adapter": len(result.adapters) - 1, "accuracy": acc, "decision": "new",
                           "failing": sorted(t for t, a in acc.items() if a < required.get(t, 0.0))})
    return result


def _tasks(members: list[str], tasks_of) -> set[str]:
    return {t for s in members for t in tasks_of(s)}
