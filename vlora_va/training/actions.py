"""The action-label source: the activity of every person in a clip, derived from teacher boxes over time.

No pretrained action model and no labelled action data exist offline, so labels are made by a documented
rule from the detection teacher's output on *every* frame of the clip's time window:

1. Tracking: person boxes with score >= `min_score` are linked frame to frame greedily by IoU (>= 0.3,
   highest IoU first); a track that misses up to 2 frames may continue.
2. People: the tracks present in >= 60% of the window's frames. Each is one labelled person, at its mean
   box over the window.
3. Each person's activity:
   - "cycling" if a teacher bicycle box overlaps the person (IoU >= 0.1 or bicycle centre inside the
     person box's lower half) in >= 50% of the frames — checked first;
   - otherwise the motion rule of `vlora_va/engine/motion.py` on the track (feet displacement in box heights per
     second, scale rate; standing below `still_speed`, a don't-care band up to walking speed, left / right by
     the feet, toward / away by the scale). The old rule (dy alone) called people on a path that climbs the
     image "away" while they grew.
   A person that is not sure is still a person (the persons branch learns where it is) but its activity is
   not a training target and not scored (`sure: false`).
4. The clip's label is its *main subject's*: the person with the largest mean box height (the most
   visible one); no person -> "no_person".
The rule is exact and deterministic, so labels can be regenerated; their quality is that of the teacher
and tracker (e.g. an identity switch mid-clip can flip a label), and evaluation is against these labels.
"""

from __future__ import annotations

import numpy as np

from vlora_va.contracts.boxes import iou_matrix, pair_iou
from vlora_va.engine import motion

ACTION_LABELS = ["no_person", "standing", "walking_left", "walking_right", "walking_toward", "walking_away", "cycling"]
PERSON_ACTIVITIES = ACTION_LABELS[1:]  # what one person can be doing
MIRRORED = {"walking_left": "walking_right", "walking_right": "walking_left"}  # the label of a mirrored clip
# the label of a clip played backwards: every motion reverses; standing and cycling stay (a reversed ride is a ride)
REVERSED = {**MIRRORED, "walking_toward": "walking_away", "walking_away": "walking_toward"}
STILL_SPEED = motion.STILL_SPEED  # the standing speed person_activities uses unless told another


def track(frames: list[list[dict]], min_iou: float = 0.3, max_gap: int = 2) -> list[dict[int, list[float]]]:
    """Greedy IoU tracker over per-frame person boxes: a list of tracks, each {frame index: box}. Best pair first
    over a whole labelled clip, across gaps of up to `max_gap` frames: teacher labels have no ranking worth keeping
    and may miss a frame. The engine links best box first (engine.heads.action.link_index_pairs: a person below its
    threshold must not take a box from one above) and the daemon's tracker follows motion and appearance
    (analytics/): three rules for three jobs, so the labels these tracks make stay what they were."""
    tracks: list[dict[int, list[float]]] = []
    for i, boxes in enumerate(frames):
        live = [t for t in tracks if i - max(t) <= max_gap + 1]
        overlap = iou_matrix([t[max(t)] for t in live], [b["box"] for b in boxes])
        pairs = sorted(((float(overlap[ti, bi]), ti, bi) for ti in range(len(live)) for bi in range(len(boxes))),
                       reverse=True)
        used_t, used_b = set(), set()
        for iou, ti, bi in pairs:
            if iou < min_iou or ti in used_t or bi in used_b:
                continue
            live[ti][i] = boxes[bi]["box"]
            used_t.add(ti)
            used_b.add(bi)
        tracks += [{i: b["box"]} for bi, b in enumerate(boxes) if bi not in used_b]
    return tracks


def _rides(person: list[float], bikes: list[list[float]]) -> bool:
    for b in bikes:
        bx, by = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
        in_lower = person[0] <= bx <= person[2] and (person[1] + person[3]) / 2 <= by <= person[3] + 0.3 * (person[3] - person[1])
        if pair_iou(person, b) >= 0.1 or in_lower:
            return True
    return False


def _activity(boxes: dict[int, list[float]], bikes: list[list[list[float]]], fps: float, still_speed: float) -> dict:
    """One person's activity from its track {frame index: box} (rule 3 of the module doc)."""
    idx = sorted(boxes)
    m = motion.track_motion([boxes[k] for k in idx], [k / fps for k in idx])
    if sum(_rides(boxes[k], bikes[k]) for k in idx) >= 0.5 * len(idx):
        label, sure = "cycling", True
    else:
        label, sure = motion.motion_label(m, still_speed)
    mean_box = [round(float(v), 1) for v in np.mean([boxes[k] for k in idx], 0)]
    return {"label": label, "sure": sure, "box": mean_box, "speed": round(m.speed, 3), "dx": round(m.dx, 3),
            "dy": round(m.dy, 3), "scale_rate": round(m.rate, 3), "height": round(m.height, 1)}


def person_activities(labels: list[list[dict]], fps: float, min_score: float = 0.4,
                      still_speed: float = STILL_SPEED) -> list[dict]:
    """Every person tracked through >= 60% of the window, with its activity and mean box; largest first."""
    persons = [[b for b in f if b["class"] == "person" and b["score"] >= min_score] for f in labels]
    bikes = [[b["box"] for b in f if b["class"] in ("bicycle", "motorcycle") and b["score"] >= 0.3] for f in labels]
    tracks = [t for t in track(persons) if len(t) >= motion.TRACK_SHARE * len(labels)]
    return sorted((_activity(t, bikes, fps, still_speed) for t in tracks), key=lambda p: -p["height"])


def clip_label(labels: list[list[dict]], fps: float, min_score: float = 0.4, still_speed: float = STILL_SPEED) -> dict:
    """The activity of one clip (its main subject's) from the teacher labels of every frame in its window."""
    return main_subject(person_activities(labels, fps, min_score, still_speed))


def main_subject(people: list[dict]) -> dict:
    """The clip label from `person_activities` (largest first): the main subject's activity, or no_person."""
    if not people:
        return {"label": "no_person", "speed": 0.0, "tracks": 0}
    main = people[0]
    return {"label": main["label"], "speed": main["speed"], "dx": main["dx"], "dy": main["dy"], "tracks": len(people),
            "height": main["height"]}
