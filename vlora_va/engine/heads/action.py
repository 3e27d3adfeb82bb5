"""The action head: a clip classifier over the patch grids of a clip's frames (a temporal or 3-D convolution,
mean+max over the clip, a linear layer gives label logits), optionally with a per-person branch: where each person
is over the clip and what that person is doing, optionally with the persons found per frame by a person
`DetectionHead` on the clip's two middle frames (`boxes`), and their activity named by where their boxes go over all
the clip's frames (`activity_from="track"`, the rule of vlora_va/engine/motion.py). The person linking it decodes
with (`person_tracks` and its parts) is here too.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from vlora_va.contracts.boxes import iou_matrix
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.results import ActivityResult, PersonActivity
from vlora_va.engine.heads.base import Clip, Head
from vlora_va.engine.heads.detection import DetectionHead, _first_per_group, local_peaks
from vlora_va.engine.heads.features import Features
from vlora_va.engine.motion import TRACK_SHARE, motion_label, track_motion

PERSON_FIELDS = 5  # per cell: person-centre logit, centre offset x/y in the cell, log box width/height in cells


class ActionHead(Head):
    """Clip classifier over the patch-token grids of clip_len frames, optionally with per-person activities.

    spatial="pooled": each frame's grid is averaged to pool x pool cells, then a temporal convolution.
    spatial="local": a 3-D convolution over (time, rows, cols) of the full grid, then max and mean over
    the clip: a person one patch wide moving a patch or two per second shows up as features shifting to
    a neighbouring patch, which pooled cells average away; the max finds the strongest mover.
    motion=True also feeds frame-to-frame feature differences (direction of travel lives in them).
    persons=True (spatial="local" only) adds a per-person branch on the same features pooled over time at
    every cell: a person-centre score, the centre's offset in its cell, the box size, and that person's
    activity. Decoding keeps 3x3 local maxima above `score_threshold`, like the detection head, and gives
    each person its box (where it was on average over the clip) and activity.
    boxes=2 or 4 (persons only) finds the persons instead with a person `DetectionHead` (grid upsampled that
    much) on each clip's two middle frames: one cell per person at the patch stride places a person's box too
    coarsely to overlap a hand-drawn one by half (found 0.49 of the human-checked persons, against 0.79 for
    boxes from a detection head, adapters/STUDIES.md). See `decode_persons_from_boxes`. detail (boxes=4 only)
    gives that person head the detection head's detail branch on the middle frames' images (`Features.pixels`).
    activity_from="track" (boxes only) runs the person head on every frame of the clip, follows each person's box
    through them, and names the activity by the motion rule (engine/motion.py, the rule the training labels
    come from) wherever the track covers >= TRACK_SHARE of the frames; the activity maps name it otherwise, and
    always name cycling (a rider moves like a walker). The maps, learnt from the teacher's tracks, tell a
    standing person from a walker less well than the person's own boxes over the clip do (adapters/STUDIES.md).
    Decoding then needs each clip's frame times.
    """

    task = "action"
    clips = True

    def __init__(self, hidden: int, labels: list[str], width: int = 64, pool: int = 4, motion: bool = False,
                 spatial: str = "pooled", persons: bool = False, image_size: int = 224, score_threshold: float = 0.3,
                 max_persons: int = 50, boxes: int = 0, box_width: int = 128, detail: int = 0,
                 activity_from: str = "maps", **_: object):
        super().__init__()
        if spatial not in ("pooled", "local"):
            raise ValueError(f"action head: spatial must be 'pooled' or 'local', got {spatial!r}")
        if persons and spatial != "local":
            raise ValueError("action head: persons=true needs spatial 'local' (per-person outputs need the full grid)")
        if boxes and not persons:
            raise ValueError("action head: boxes needs persons=true (they are the persons' boxes)")
        if detail and not boxes:
            raise ValueError("action head: detail needs boxes (it is the person box head's detail branch)")
        if activity_from not in ACTIVITY_FROM:
            raise ValueError(f"action head: activity_from must be one of {', '.join(ACTIVITY_FROM)}, "
                             f"got {activity_from!r}")
        if activity_from == "track" and not boxes:
            raise ValueError("action head: activity_from 'track' needs boxes (the persons' boxes are the track)")
        self.activity_from = activity_from
        self.labels, self.pool, self.motion, self.spatial = list(labels), pool, motion, spatial
        self.image_size, self.score_threshold, self.max_persons = image_size, score_threshold, max_persons
        self.project = nn.Sequential(nn.Conv2d(hidden, width, 1), nn.GELU())
        channels = width * (2 if motion else 1)
        if spatial == "local":
            self.temporal = nn.Conv3d(channels, 2 * width, kernel_size=3, padding=1)
            self.classify = nn.Linear(4 * width, len(labels))
        else:
            self.temporal = nn.Conv1d(channels * pool * pool, 256, kernel_size=3, padding=1)
            self.classify = nn.Linear(512, len(labels))
        self.person_labels = [lab for lab in self.labels if lab != "no_person"] if persons else []
        if persons:
            self.person_mix = nn.Sequential(nn.Conv2d(4 * width, 2 * width, 3, padding=1), nn.GELU())
            self.person_out = nn.Conv2d(2 * width, PERSON_FIELDS + len(self.person_labels), 1)
            # Every cell starts at ~1% person-centre score (focal-loss prior): an untrained branch sees nobody.
            nn.init.constant_(self.person_out.bias[:1], -math.log(99.0))
        # Its boxes are decoded from BOX_FLOOR up and linked before the persons are kept at score_threshold.
        self.box_head = (DetectionHead(hidden, ["person"], box_width, image_size, BOX_FLOOR, upsample=boxes,
                                       detail=detail) if boxes else None)

    @property
    def persons(self) -> bool:
        return bool(self.person_labels)

    @property
    def detail(self) -> int:
        """The person box head's detail channels (0: none): callers keep each frame's model input for it."""
        return self.box_head.detail if self.box_head is not None else 0

    def forward(self, feats: Features, clip_len: int,
                every_frame: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None, tuple | None]:
        """feats holds B*clip_len frames, clip-major. Returns (label logits [B, L], person maps
        [B, PERSON_FIELDS + activities, h, w] or None without the persons branch, the person DetectionHead's
        output (clip-major) on each clip's two middle frames [2B, ...], or on every frame [B*clip_len, ...] with
        activity_from "track" or every_frame=True, or None without `boxes`). every_frame=False: the middle frames
        only, whatever decoding wants (training: the box loss is on those)."""
        grid = feats.grid if self.spatial == "local" else F.adaptive_avg_pool2d(feats.grid, self.pool)
        x = self.project(grid)                                          # [B*T, C, h, w]
        x = x.reshape(-1, clip_len, *x.shape[1:]).transpose(1, 2)       # [B, C, T, h, w]
        if self.motion:
            x = torch.cat([x, F.pad(x[:, :, 1:] - x[:, :, :-1], (0, 0, 0, 0, 1, 0))], dim=1)
        if self.spatial == "pooled":
            x = F.gelu(self.temporal(x.transpose(1, 2).flatten(2).transpose(1, 2)))  # [B, 256, T]
            return self.classify(torch.cat([x.mean(-1), x.amax(-1)], dim=1)), None, None
        x = F.gelu(self.temporal(x))                                     # [B, 2w, T, h, w]
        flat = x.flatten(2)
        logits = self.classify(torch.cat([flat.mean(-1), flat.amax(-1)], dim=1))
        if not self.persons:
            return logits, None, None
        maps = self.person_out(self.person_mix(torch.cat([x.mean(2), x.amax(2)], dim=1)))
        boxes = None
        if self.box_head is not None:
            every = self.activity_from == "track" if every_frame is None else every_frame
            boxes = self.box_head(feats if every else
                                  feats.select(middle_frames(logits.shape[0], clip_len, feats.grid.device)))
        return logits, maps, boxes

    @torch.no_grad()
    def decode(self, raw: tuple, letterboxes: list[Letterbox] | None = None,
               orig_sizes: list[tuple[int, int]] | None = None,
               frame_times: list[list[float]] | None = None) -> list[ActivityResult]:
        """Per clip: the label, its probability and every label's, and, with the persons branch, every person
        found (box in original pixels, best first). Persons need each clip's letterbox and original size, and
        person boxes on every frame (forward with activity_from "track") each clip's frame times in seconds."""
        logits, maps, boxes = raw
        probs = logits.softmax(-1).tolist()
        persons: list = [None] * len(probs)
        if maps is not None:
            if letterboxes is None or orig_sizes is None:
                raise ValueError("action head: decoding persons needs each clip's letterbox and original size")
            found = (self.decode_persons(maps, letterboxes, orig_sizes) if boxes is None else
                     self.decode_persons_from_boxes(maps, boxes, letterboxes, orig_sizes, frame_times))
            persons = [tuple(p) for p in found]
        out = []
        for p, ps in zip(probs, persons):
            k = max(range(len(p)), key=p.__getitem__)
            out.append(ActivityResult(self.labels[k], p[k], dict(zip(self.labels, p)), ps))
        return out

    def decode_persons(self, maps: torch.Tensor, letterboxes: list[Letterbox],
                       orig_sizes: list[tuple[int, int]]) -> list[list[PersonActivity]]:
        """Per clip: its persons, best first (all clips at once on the maps' device, one transfer at the end)."""
        score = maps[:, 0].sigmoid()
        clip, yy, xx = local_peaks(score[:, None], self.score_threshold)[:, 0].nonzero().unbind(1)
        s = score[clip, yy, xx]
        by_score = s.argsort(descending=True)
        by_clip = by_score[torch.argsort(clip[by_score], stable=True)]  # clip by clip, best first within each
        best_first = by_clip[_first_per_group(clip[by_clip], self.max_persons)]
        clip, yy, xx, s = clip[best_first], yy[best_first], xx[best_first], s[best_first]
        stride = self.image_size / maps.shape[-1]
        cx = (xx + 0.5 + maps[clip, 1, yy, xx]) * stride
        cy = (yy + 0.5 + maps[clip, 2, yy, xx]) * stride
        w, h = maps[clip, 3, yy, xx].exp() * stride, maps[clip, 4, yy, xx].exp() * stride
        boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
        activity = maps[clip, PERSON_FIELDS:, yy, xx].softmax(1)  # [K, activities]
        best = activity.argmax(1)
        out: list[list[PersonActivity]] = [[] for _ in range(maps.shape[0])]
        for i, b, p, k, a in zip(clip.tolist(), boxes.tolist(), s.tolist(), best.tolist(), activity.tolist()):
            out[i].append(PersonActivity(tuple(letterboxes[i].box_to_original(b, orig_sizes[i])), p,
                                         self.person_labels[k], a[k]))
        return out

    def decode_persons_from_boxes(self, maps: torch.Tensor, boxes: tuple, letterboxes: list[Letterbox],
                                  orig_sizes: list[tuple[int, int]],
                                  frame_times: list[list[float]] | None = None) -> list[list[PersonActivity]]:
        """Per clip: its persons from the person DetectionHead on its two middle frames, best first. As a loop:
        decode each frame's person boxes (score >= BOX_FLOOR, NMS); link the middle frames' boxes into persons,
        each with the mean box and mean score of its boxes there (the clip's mid-time position, where a labelled
        person's mean box over the clip lies for steady motion), and keep those scoring >= score_threshold
        (`person_tracks`); a person's activity is the argmax of the activity maps at the cell holding its box's
        centre. With boxes on every frame (activity_from "track"), each person's track through the clip names
        the activity instead where it is long enough (`track_activity`; activity_from "track"), and activity_score
        stays the maps' probability of the activity named."""
        side, clips = self.image_size, maps.shape[0]
        n = len(boxes[0])
        per_clip = n // clips
        if per_clip > 2 and (frame_times is None or any(len(t) != per_clip for t in frame_times)):
            raise ValueError(f"action head: activity_from 'track' needs each clip's {per_clip} frame times")
        model = Letterbox(1.0, 0.0, 0.0)  # decode in model pixels: the activity maps live there
        frames = self.box_head.decode(boxes, [model] * n, [(side, side)] * n)
        activity = maps[:, PERSON_FIELDS:].softmax(1).cpu()  # one transfer: persons are read one by one below
        stride = side / maps.shape[-1]
        out: list[list[PersonActivity]] = []
        for i in range(clips):
            clip = [[(d.box, d.score) for d in frames[i * per_clip + f]] for f in range(per_clip)]
            found = []
            for score, box, track in person_tracks(clip, self.score_threshold):
                cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
                row, col = (min(max(int(v / stride), 0), maps.shape[-1] - 1) for v in (cy, cx))
                probs = activity[i, :, row, col]
                name, named_by = self.person_labels[int(probs.argmax())], "maps"
                by_track = (track_activity(track, frame_times[i], per_clip, name, self.person_labels)
                            if per_clip > 2 else None)
                if by_track is not None:
                    name, named_by = by_track, "track"
                found.append(PersonActivity(tuple(letterboxes[i].box_to_original(box, orig_sizes[i])), score,
                                            name, float(probs[self.person_labels.index(name)]), named_by))
            out.append(found[:self.max_persons])
        return out


# A walker moves about half its width between a clip's middle frames (0.3 s apart): its two boxes overlap by ~0.33,

    @classmethod
    def from_config(cls, config: dict, hidden: int) -> "ActionHead":
        # The person branch places boxes on the grid of the image size the adapter was trained at.
        return cls(hidden, config["labels"], **{"image_size": config.get("image_size", 224), **config.get("params", {})})

    def min_frames(self, config: dict) -> int:
        return int(config.get("min_clip_len", config.get("clip_len", 1)))

    def serve(self, feats: Features, clips: list[Clip], forward=None) -> list[ActivityResult]:
        """Clips of equal length through the head together; each clip's label (and persons)."""
        starts = list(itertools.accumulate((c.frames for c in clips[:-1]), initial=0))  # each clip's first row
        by_len: dict[int, list[int]] = {}
        for i, c in enumerate(clips):
            by_len.setdefault(c.frames, []).append(i)
        out: list = [None] * len(clips)
        for clip_len, group in by_len.items():
            rows = torch.tensor([r for i in group for r in range(starts[i], starts[i] + clip_len)],
                                device=feats.grid.device)
            # A clip's frames share one letterbox: persons are placed through it, as detections are.
            results = self.decode((forward or self)(feats.select(rows), clip_len), [clips[i].letterbox for i in group],
                                  [clips[i].orig_size for i in group], [list(clips[i].frame_ts) for i in group])
            for i, res in zip(group, results):
                out[i] = res
        return out


LINK_IOU = 0.1
BOX_FLOOR = 0.05  # per-frame person boxes are linked from this score up; persons are kept at score_threshold
ACTIVITY_FROM = ("maps", "track")  # what names a person's activity (ActionHead)
DECODE_ONLY = ("activity_from",)  # head params that change how outputs are read, never what is learnt


def middle_frames(clips: int, clip_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Indices of each clip's two middle frames in a clip-major batch of clips * clip_len frames (frames 1 and 2
    of 4: their mean time is the clip's mean frame time)."""
    a, b = (clip_len - 1) // 2, clip_len // 2
    if a == b:
        b = min(a + 1, clip_len - 1)
    base = torch.arange(clips, device=device) * clip_len
    return torch.stack([base + a, base + b], 1).flatten()


def link_index_pairs(first: list, second: list, min_iou: float) -> list[tuple[int | None, int | None]]:
    """Boxes of one frame (best first) and of the next -> one (index in first, index in second) per person: each
    first box in turn takes the free second box it overlaps most (IoU >= min_iou), or none (None); then the
    second boxes no first box took, each alone. Best first, not best pair first (training.actions.track): a box goes
    to the likelier person, so a person below the threshold never takes one from a person above it."""
    overlap = iou_matrix(first, second)
    free = set(range(len(second)))
    people: list[tuple[int | None, int | None]] = []
    for i in range(len(first)):
        best, j = min_iou, None
        for k in sorted(free):
            if overlap[i, k] >= best:
                best, j = overlap[i, k], k
        free.discard(j)
        people.append((i, j))
    return people + [(None, k) for k in sorted(free)]


def person_tracks(frames: list[list[tuple]],
                  threshold: float) -> list[tuple[float, list[float], dict[int, list[float]]]]:
    """One clip's persons from its frames' person boxes (per frame, (box, score)s; the two middle frames alone, or
    every frame): (score, box, track) per person scoring >= threshold, best first. The middle frames' boxes are
    linked (`link_index_pairs`, the first frame's best first); a person's score and box are the mean of its
    middle boxes; its track {frame: box} starts there and, best person first, goes on to the other frames
    (`extend_track`): so an outer frame's box goes to the likelier person, and a person below the threshold never
    takes one from a person above it (decoding at a threshold = decoding low and filtering)."""
    frames = [sorted(f, key=lambda d: -d[1]) for f in frames]
    a, b = middle_frames(1, len(frames)).tolist()
    people = []
    for j, k in link_index_pairs([d[0] for d in frames[a]], [d[0] for d in frames[b]], LINK_IOU):
        members = [(f, x) for f, x in ((a, j), (b, k)) if x is not None]
        boxes = [frames[f][x] for f, x in members]
        people.append((members, sum(d[1] for d in boxes) / len(boxes),
                       [sum(v) / len(boxes) for v in zip(*(d[0] for d in boxes))]))
    taken: list[set[int]] = [set() for _ in frames]
    for members, _, _ in people:
        for f, x in members:
            taken[f].add(x)
    out = []
    for members, score, box in sorted(people, key=lambda p: -p[1]):
        if score < threshold:
            break
        out.append((score, box, extend_track({f: frames[f][x][0] for f, x in members}, frames, taken)))
    return out


def extend_track(track: dict[int, list[float]], frames: list[list[tuple]],
                 taken: list[set[int]]) -> dict[int, list[float]]:
    """A person's boxes {frame: box} on adjacent middle frames, carried to the frames before and after: frame by
    frame outward, the free box (not in `taken`, which this updates) overlapping the track's nearest box most,
    IoU >= LINK_IOU; the track stops at a frame where none does. frames: per frame, its (box, score)s."""
    track = dict(track)
    for step in (-1, 1):
        f = min(track) if step < 0 else max(track)
        while 0 <= f + step < len(frames):
            best, pick = LINK_IOU, None
            overlap = iou_matrix([track[f]], [box for box, _ in frames[f + step]])[0]
            for x, o in enumerate(overlap):
                if x not in taken[f + step] and o >= best:
                    best, pick = o, x
            if pick is None:
                break
            f += step
            taken[f].add(pick)
            track[f] = frames[f][pick][0]
    return track


def track_activity(track: dict[int, list[float]], times: list[float], clip_len: int, learnt: str,
                   labels: list[str]) -> str | None:
    """The activity a person's track names (motion.motion_label on its boxes at their frame times) when it covers
    >= TRACK_SHARE of the clip's frames over some time (a sender may stamp frames alike), the maps' activity
    (`learnt`) is not cycling, and it is one of the head's `labels`; otherwise None (the maps name it)."""
    idx = sorted(track)
    if learnt == "cycling" or len(track) < TRACK_SHARE * clip_len or times[idx[-1]] <= times[idx[0]]:
        return None
    named = motion_label(track_motion([track[f] for f in idx], [times[f] for f in idx]))[0]
    return named if named in labels else None

