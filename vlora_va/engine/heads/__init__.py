"""Vision task heads: what turns backbone features into each request's result.

    base.py       the plug-in point: `Head` (task, from_config, serve), `Clip`, `build_head` (contracts.plugins.HEADS)
    features.py   `Features`: what a backbone forward gives the heads
    detection.py  `DetectionHead` and the box operations it decodes with
    action.py     `ActionHead` (clip labels, per-person activities) and the person linking it decodes with

A head is saved beside its adapter as `head_config.json` + `head.safetensors` (vlora_va/engine/adapters.py).
"""

from vlora_va.engine.heads.action import (
                                          ACTIVITY_FROM,
                                          BOX_FLOOR,
                                          DECODE_ONLY,
                                          LINK_IOU,
                                          PERSON_FIELDS,
                                          ActionHead,
                                          extend_track,
                                          link_index_pairs,
                                          middle_frames,
                                          person_tracks,
                                          track_activity,
)
from vlora_va.engine.heads.base import HEAD_FORMAT, HEAD_FORMAT_VERSION, Clip, Head, build_head
from vlora_va.engine.heads.detection import DetectionHead, batched_nms, local_peaks
from vlora_va.engine.heads.features import Features

__all__ = ["ACTIVITY_FROM", "BOX_FLOOR", "DECODE_ONLY", "LINK_IOU", "PERSON_FIELDS", "ActionHead", "extend_track",
           "link_index_pairs", "middle_frames", "person_tracks", "track_activity", "HEAD_FORMAT",
           "HEAD_FORMAT_VERSION", "Clip", "Head", "build_head", "DetectionHead", "batched_nms",
           "local_peaks", "Features"]
