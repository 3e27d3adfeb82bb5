"""What the teachers' COCO classes mean for an adapter's classes.

From high above a road the teachers are unsure whether a car is a car, a truck or a bus: on traffic-a they split one
car between the three, each at a low score (../shared/footage/README.md). Scored per class, every such car was a miss
and a false box at once. So the vehicle classes are one group while labels are made and judged: a box of any of them
is a vehicle, and the adapter's class for it is the group member the teachers' votes favour (bus counts as truck).
"""

from __future__ import annotations

VEHICLES = ("car", "truck", "bus")  # the COCO classes one vehicle is split between
VEHICLE = "vehicle"  # the group's name where classes are judged as one
TO_ADAPTER = {"bus": "truck"}  # a COCO class the adapters do not have -> the nearest one they do


def group_of(cls: str) -> str:
    return VEHICLE if cls in VEHICLES else cls


def vehicle_agnostic(labels: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """{frame key: labels} with every vehicle class named VEHICLE (how a vehicle F1 is computed)."""
    return {k: [{**lab, "class": group_of(lab["class"])} for lab in v] for k, v in labels.items()}


def adapter_class(votes: dict[str, float], classes: list[str]) -> str | None:
    """The adapter class a group's box takes: the member with the most vote (summed score) among those the adapter
    has (bus as truck); None where it has none of them."""
    tally: dict[str, float] = {}
    for cls, v in votes.items():
        name = TO_ADAPTER.get(cls, cls)
        if name in classes:
            tally[name] = tally.get(name, 0.0) + v
    return max(sorted(tally), key=lambda c: tally[c]) if tally else None
