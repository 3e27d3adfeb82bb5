"""TrackEval's figures for the seeded scenarios of track_scenarios.py: the reference that
tests/training/test_track_metrics.py holds vlora_va.training.track_metrics to.

TrackEval is not a project dependency; run this in a throwaway environment (TrackEval 1.3.0 works with numpy 2):

    python3 -m venv /tmp/trackeval && /tmp/trackeval/bin/pip install trackeval==1.3.0 numpy scipy
    /tmp/trackeval/bin/python tests/training/trackeval_reference.py

It prints TrackEval's figures per seed as the test's TRACKEVAL table, and whether ours agree. The scenarios go
through TrackEval's own MOTChallenge preprocessing, with the ignore regions as "distractor" boxes (a prediction
matched to one is removed), then its CLEAR and Identity metrics at IoU 0.5.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MOT_CLASSES = {"pedestrian": 1, "person_on_vehicle": 2, "car": 3, "bicycle": 4, "motorbike": 5, "non_mot_vehicle": 6,
               "static_person": 7, "distractor": 8, "occluder": 9, "occluder_on_ground": 10, "occluder_full": 11,
               "reflection": 12, "crowd": 13}
SEEDS = range(8)


def _xywh(box):
    return [box[0], box[1], box[2] - box[0], box[3] - box[1]]


def trackeval_scores(gt, pred, ignore) -> dict:
    """TrackEval 1.3.0's CLEAR and Identity figures for one scenario (our input format)."""
    from trackeval.datasets.mot_challenge_2d_box import MotChallenge2DBox
    from trackeval.metrics import CLEAR, Identity

    times = sorted(gt)
    gt_ids, track_ids = {}, {}
    raw = {k: [] for k in ("gt_ids", "gt_dets", "gt_classes", "gt_extras", "tracker_ids", "tracker_dets",
                           "tracker_classes", "tracker_confidences", "similarity_scores")}
    for n, t in enumerate(times):
        g = [(gt_ids.setdefault(i, len(gt_ids) + 1), _xywh(b), MOT_CLASSES["pedestrian"]) for i, b in gt[t]]
        g += [(100_000 + 1000 * n + j, _xywh(b), MOT_CLASSES["distractor"]) for j, b in enumerate(ignore.get(t, []))]
        p = [(track_ids.setdefault(i, len(track_ids) + 1), _xywh(b)) for i, b in pred.get(t, [])]
        g_boxes = np.array([x[1] for x in g], float).reshape(-1, 4)
        p_boxes = np.array([x[1] for x in p], float).reshape(-1, 4)
        raw["gt_ids"].append(np.array([x[0] for x in g], int))
        raw["gt_dets"].append(g_boxes)
        raw["gt_classes"].append(np.array([x[2] for x in g], int))
        raw["gt_extras"].append({"zero_marked": np.ones(len(g), int)})  # 1 = a box to evaluate
        raw["tracker_ids"].append(np.array([x[0] for x in p], int))
        raw["tracker_dets"].append(p_boxes)
        raw["tracker_classes"].append(np.full(len(p), MOT_CLASSES["pedestrian"]))
        raw["tracker_confidences"].append(np.ones(len(p)))
        raw["similarity_scores"].append(MotChallenge2DBox._calculate_box_ious(g_boxes, p_boxes, box_format="xywh"))
    raw["num_timesteps"], raw["seq"] = len(times), "synthetic"
    # Only the preprocessing step is needed, not a dataset on disk: an instance with the attributes it reads.
    dataset = object.__new__(MotChallenge2DBox)
    dataset.benchmark, dataset.do_preproc = "MOT17", True
    dataset.class_name_to_class_id, dataset.valid_class_numbers = MOT_CLASSES, list(MOT_CLASSES.values())
    data = dataset.get_preprocessed_seq_data(raw, "pedestrian")
    clear = CLEAR({"THRESHOLD": 0.5, "PRINT_CONFIG": False}).eval_sequence(data)
    ident = Identity({"THRESHOLD": 0.5, "PRINT_CONFIG": False}).eval_sequence(data)
    return {"matches": int(clear["CLR_TP"]), "fp": int(clear["CLR_FP"]), "fn": int(clear["CLR_FN"]),
            "id_switches": int(clear["IDSW"]), "idtp": int(ident["IDTP"]), "idfp": int(ident["IDFP"]),
            "idfn": int(ident["IDFN"]), "mota": float(clear["MOTA"]), "motp": float(clear["MOTP"]),
            "idf1": float(ident["IDF1"])}


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from tests.training.track_scenarios import scenario
    from vlora_va.training.track_metrics import score_tracks

    disagree = 0
    print("TRACKEVAL = {  # seed: (matches, fp, fn, id_switches, idtp, idfp, idfn, motp)")
    for seed in SEEDS:
        gt, pred, ignore = scenario(seed)
        ref = trackeval_scores(gt, pred, ignore)
        ours = score_tracks(gt, pred, ignore, ignore_inside=2.0).to_dict()
        diff = {k: (v, ours[k]) for k, v in ref.items() if abs(v - ours[k]) > 1e-9}
        disagree += bool(diff)
        print(f"    {seed}: ({ref['matches']}, {ref['fp']}, {ref['fn']}, {ref['id_switches']}, {ref['idtp']}, "
              f"{ref['idfp']}, {ref['idfn']}, {ref['motp']!r}),{'  # ours differ: ' + str(diff) if diff else ''}")
    print("}")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
