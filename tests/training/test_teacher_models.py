"""The fetched teachers on real frames: the converted CenterNet against the ONNX one, NanoDet's decoding against
a plain loop, and the fused teacher against fuse_boxes of its members.

tests/fixtures/centernet-onnx-detections.json holds the development ONNX CenterNet's raw rows (score >= 0.2) on
five frames of pedestrians.mp4, written with onnxruntime from ../shared/assets/teachers/centernet.onnx (the
network the npm package's TF.js model was converted from; tests/fixtures/centernet_onnx_detections.py writes it),
so this check runs where that file is absent."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlora_va.contracts.boxes import pair_iou
from vlora_va.training.frames import read_frames
from vlora_va.training.teacher_models import (
    NANODET_BINS,
    NANODET_SIZE,
    NANODET_STRIDES,
    ModelRunner,
    TeacherMissing,
    decode_nanodet,
    find_model,
    nanodet_input,
)

ROOT = Path(__file__).resolve().parents[2]
VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"
ONNX_ROWS = ROOT / "tests" / "fixtures" / "centernet-onnx-detections.json"


def test_converted_centernet_matches_the_onnx_teacher(teachers):
    import cv2

    ref = json.loads(ONNX_ROWS.read_text())["frames"]
    model = ModelRunner(find_model("centernet", teachers))
    frames = {f"{f.t:.3f}": f for f in read_frames(VIDEO, 12, 72, 12.0)}
    assert set(frames) == set(ref)
    matched = 0
    for t, rows in ref.items():
        x = cv2.resize(frames[t].rgb, (512, 512), interpolation=cv2.INTER_LINEAR).astype(np.float32)[None]
        got = model.run(x)[0][0]
        got = got[got[:, 4] >= 0.15]
        for r in rows:  # every ONNX box: the same class, IoU >= 0.998, score within 0.001
            same = [g for g in got if int(g[5]) == int(r[5])]
            best = max(same, key=lambda g: pair_iou(list(g[:4]), r[:4]))
            assert pair_iou(list(best[:4]), r[:4]) >= 0.998 and abs(best[4] - r[4]) <= 1e-3, (t, r, best)
            matched += 1
        assert len(got[got[:, 4] >= 0.25]) <= len(rows)  # and nothing confident the ONNX teacher lacks
    assert matched >= 100


def nanodet_plain_loop(outputs, min_score):
    """The decoding written out cell by cell, class by class, side by side."""
    found = []
    for s in NANODET_STRIDES:
        n = NANODET_SIZE // s
        scores = next(o for o in outputs if o.shape == (1, n * n, 80))[0]
        dist = next(o for o in outputs if o.shape == (1, n * n, 44))[0]
        for cell in range(n * n):
            for c in range(80):
                if scores[cell, c] < min_score:
                    continue
                row, col = divmod(cell, n)
                cx, cy = (col + 0.5) * s, (row + 0.5) * s
                side = []
                for k in range(4):
                    logits = dist[cell, k * NANODET_BINS:(k + 1) * NANODET_BINS].astype(np.float64)
                    p = np.exp(logits - logits.max())
                    p /= p.sum()
                    side.append(sum(i * p[i] for i in range(NANODET_BINS)) * s)
                found.append(([cx - side[0], cy - side[1], cx + side[2], cy + side[3]], c, float(scores[cell, c])))
    return found


def test_nanodet_decoding_matches_a_plain_loop(teachers):
    frame = read_frames(VIDEO, 30, 30.2)[0]
    outputs = ModelRunner(find_model("nanodet", teachers)).run(nanodet_input(frame.rgb))
    got = sorted(decode_nanodet(outputs, 0.3), key=lambda d: (d[1], d[2]))
    ref = sorted(nanodet_plain_loop(outputs, 0.3), key=lambda d: (d[1], d[2]))
    assert len(got) == len(ref) > 5
    for (gb, gc, gs), (rb, rc, rs) in zip(got, ref):
        assert gc == rc and gs == pytest.approx(rs) and np.allclose(gb, rb, atol=1e-3)


def test_nanodet_finds_the_people_centernet_finds(teachers):
    """Two networks, one scene: most of CenterNet's confident people are NanoDet's too (IoU >= 0.5)."""
    from vlora_va.training.teachers import CenterNetTeacher, NanoDetTeacher

    frames = read_frames(VIDEO, 20, 26, 2.0)
    cn = CenterNetTeacher(classes=["person"], score_threshold=0.5, folder=teachers)
    nd = NanoDetTeacher(classes=["person"], score_threshold=0.3, folder=teachers)
    a = {f.key: cn._raw(f.rgb) for f in frames}
    b = {f.key: nd._raw(f.rgb) for f in frames}
    pairs = [(lab, b[k]) for k, labs in a.items() for lab in labs if lab["class"] == "person" and lab["score"] >= 0.5]
    found = sum(any(pair_iou(lab["box"], o["box"]) >= 0.5 for o in others if o["class"] == "person")
                for lab, others in pairs)
    assert len(pairs) >= 10 and found / len(pairs) >= 0.7, (found, len(pairs))


def test_fused_teacher_is_fuse_boxes_of_its_members(teachers, tmp_path):
    from vlora_va.training.label_fusion import fuse_boxes
    from vlora_va.training.teachers import detector_teacher

    frames = read_frames(VIDEO, 40, 41, 0.5)
    weights = {"nanodet": {"person": 0.5}}
    fused = detector_teacher("fused", teachers, ["person", "car"], 0.3, weights=weights)
    got = fused.label(frames, tmp_path, progress=False)
    members = {m.name: m.label(frames, tmp_path, progress=False) for m in fused.members}
    for f in frames:
        want = [lab for lab in fuse_boxes({n: labs[f.key] for n, labs in members.items()}, weights)
                if lab["score"] >= 0.3 and lab["class"] in ("person", "car")]
        assert got[f.key] == want and want
    assert {t for labs in got.values() for lab in labs for t in lab["teachers"]} == {"centernet", "nanodet"}


def test_a_missing_teacher_says_how_to_get_it(tmp_path):
    with pytest.raises(TeacherMissing, match="teacher 'nanodet' not found in .*vlora-va teachers fetch"):
        find_model("nanodet", tmp_path)
    from vlora_va.training.teachers import detector_teacher

    with pytest.raises(ValueError, match="teacher 'yolo': expected one of centernet, nanodet, fused"):
        detector_teacher("yolo", tmp_path)
