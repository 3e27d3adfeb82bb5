"""Knowledge sources: teachers that label frames, and labelled data in common formats.

A label is the same dict the detection head decodes to: {"box": [x1, y1, x2, y2] original pixels,
"class": name, "score": p}. Every detector teacher caches its raw output per frame on disk
(`LabelCache`), so a run that is stopped, or a second run with another class filter, never re-labels.

- `CenterNetTeacher`, `NanoDetTeacher`: COCO-80 detectors from `vlora-va teachers fetch` (OpenVINO IR; ONNX
  also reads). Their raw output (all classes, score >= 0.1) is cached once; `classes=[...]` and
  `score_threshold` are applied on read, so one detector acts as several single-class "small models" at the
  cost of one run.
- `FusedTeacher`: several detector teachers' boxes fused into one label set (fusion_boxes.py).
- `HogPeopleTeacher`: OpenCV's HOG + linear SVM people detector.
- `HaarTeacher`: any OpenCV Haar cascade (frontal face, full body, ...), one class.
- `load_coco_json` / `load_clip_manifest`: labelled boxes and clip labels from files.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

import cv2
import numpy as np

from vlora_va.contracts.boxes import pair_iou
from vlora_va.training.frames import TrainingFrame
from vlora_va.training.label_fusion import fuse_boxes
from vlora_va.training.teacher_models import (
    NANODET_SIZE,
    ModelRunner,
    TeacherMissing,
    decode_nanodet,
    find_model,
    model_digest,
    nanodet_input,
)

log = logging.getLogger(__name__)

COCO80 = [
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard",
    "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase",
    "scissors", "teddy bear", "hair drier", "toothbrush",
]


def default_cache_dir() -> Path:
    return Path(os.environ.get("VLORA_VA_CACHE", Path.home() / ".cache" / "vlora-va")) / "labels"


def nms(labels: list[dict], iou: float) -> list[dict]:
    """Class-wise greedy NMS over label dicts, best first."""
    import torch

    from vlora_va.engine.heads import batched_nms

    if not labels:
        return []
    boxes = torch.tensor([lab["box"] for lab in labels], dtype=torch.float32)
    scores = torch.tensor([lab["score"] for lab in labels], dtype=torch.float32)
    names = sorted({lab["class"] for lab in labels})
    cls = torch.tensor([names.index(lab["class"]) for lab in labels])
    return [labels[i] for i in batched_nms(boxes, scores, cls, iou).tolist()]


def tile_grid(width: int, height: int, n: int) -> list[tuple[int, int, int, int]]:
    """n x n tiles (x0, y0, x1, y1), each 2/(n+1) of the frame's sides, overlapping by half a tile."""
    tw, th = 2 * width / (n + 1), 2 * height / (n + 1)
    return [(round(i * tw / 2), round(j * th / 2), round(i * tw / 2 + tw), round(j * th / 2 + th))
            for j in range(n) for i in range(n)]


def merge_tiled(whole: list[dict], tiled: list[tuple[tuple[int, int, int, int], list[dict]]], size: tuple[int, int],
                iou: float = 0.5, margin: float = 2.0) -> list[dict]:
    """One frame's labels from the teacher on the whole frame and on tiles (boxes already in frame pixels):
    - a tile's box touching one of the tile's inner edges (not the frame's) is cut: dropped (with half-tile
      overlap the object is whole in a neighbouring tile);
    - the tiles' boxes, class-wise NMS at `iou` (one object seen by two tiles);
    - a whole-frame box is kept only where the tiles saw nothing of its class: no kept tile box overlaps it
      with IoU >= 0.3 or has its centre inside it. A whole-frame box over two people that the tiles split
      is dropped for the two."""
    w, h = size
    kept = []
    for (x0, y0, x1, y1), labels in tiled:
        for lab in labels:
            bx1, by1, bx2, by2 = lab["box"]
            cut = ((x0 > 0 and bx1 <= x0 + margin) or (y0 > 0 and by1 <= y0 + margin)
                   or (x1 < w and bx2 >= x1 - margin) or (y1 < h and by2 >= y1 - margin))
            if not cut:
                kept.append(lab)
    kept = nms(kept, iou)
    out = list(kept)
    for lab in whole:
        same = [k["box"] for k in kept if k["class"] == lab["class"]]
        if not any(pair_iou(lab["box"], b) >= 0.3 or _centre_inside(b, lab["box"]) for b in same):
            out.append(lab)
    return nms(out, iou)


def _centre_inside(box: list[float], outer: list[float]) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return outer[0] <= cx <= outer[2] and outer[1] <= cy <= outer[3]


class LabelCache:
    """Raw teacher output per frame key, one JSON file per (teacher, video).

    Several training processes may label into one cache at once (seeds trained side by side): a save holds a lock
    on the video's file, merges what other processes saved meanwhile, and replaces the file atomically."""

    def __init__(self, root: Path, teacher: str):
        self.dir = Path(root) / teacher
        self._data: dict[str, dict[str, list]] = {}

    def _file(self, video: str) -> Path:
        return self.dir / f"{video}.json"

    def _read(self, video: str) -> dict[str, list]:
        f = self._file(video)
        try:
            return json.loads(f.read_text()) if f.is_file() else {}
        except (OSError, ValueError) as e:  # a cache is recomputable: an unreadable one is relabelled, not fatal
            log.warning("label cache %s unreadable (%s): labelling its frames again", f, e)
            return {}

    def _load(self, video: str) -> dict[str, list]:
        if video not in self._data:
            self._data[video] = self._read(video)
        return self._data[video]

    def get(self, frame: TrainingFrame) -> list | None:
        return self._load(frame.video).get(frame.key)

    def put(self, frame: TrainingFrame, raw: list) -> None:
        self._load(frame.video)[frame.key] = raw

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for video, data in self._data.items():
            with open(self.dir / f".{video}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                merged = {**self._read(video), **data}  # frames another process labelled since we read the file
                tmp = self._file(video).with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(merged))
                tmp.replace(self._file(video))  # atomic: a stopped run leaves a valid cache
            self._data[video] = merged


class Teacher:
    """Base: label frames through the cache. Subclasses implement `_raw` and `cache_name`."""

    cache_name = "teacher"
    classes: list[str] | None = None  # class filter applied on read; None keeps all
    score_threshold = 0.3

    def _raw(self, rgb: np.ndarray) -> list[dict]:
        raise NotImplementedError

    def label(self, frames: list[TrainingFrame], cache_dir: Path | None = None, progress: bool = True) -> dict[str, list[dict]]:
        """{frame key: labels}, computing only frames missing from the cache (saved every 25 frames)."""
        from tqdm import tqdm

        cache = LabelCache(cache_dir or default_cache_dir(), self.cache_name)
        out = {}
        todo = [f for f in frames if cache.get(f) is None]
        for i, f in enumerate(tqdm(todo, desc=f"labelling {self.cache_name}", disable=not progress or not todo)):
            cache.put(f, self._raw(f.rgb))
            if i % 25 == 24:
                cache.save()
        if todo:
            cache.save()
        for f in frames:
            out[f.key] = self.filter(cache.get(f))
        return out

    def filter(self, raw: list[dict]) -> list[dict]:
        return [dict(lab) for lab in raw if lab["score"] >= self.score_threshold
                and (self.classes is None or lab["class"] in self.classes)]


class DetectorTeacher(Teacher):
    """A COCO detector network as a teacher: its raw output (all classes, score >= 0.1) is cached once per frame;
    the class filter and threshold apply on read. Subclasses implement `_detect` (boxes in the pixels of the
    image they get) and set `name`.

    tiles = n > 1: also run on n x n overlapping tiles of the frame (each 2/(n+1) of its sides, so every object up
    to a third of the frame wide lies wholly inside one) and merge (`merge_tiled`): the network's input is a fixed
    square whatever the frame, so on a tile people are (n+1)/2 times larger, and two people walking together, one
    box on the whole frame, are two in the tile."""

    name = "detector"
    cache_tag = ""  # names a post-processing that changes the cached raw output (its cache is another one)

    def __init__(self, path: str | Path | None = None, classes: list[str] | None = None,
                 score_threshold: float = 0.3, nms_iou: float = 0.5, threads: int = 1, tiles: int = 1,
                 folder: str | Path | None = None):
        self.path = Path(path) if path else find_model(self.name, folder)
        if not self.path.is_file():
            raise TeacherMissing(f"{self.name} teacher not found at {self.path} (run `vlora-va teachers fetch`, "
                                 "or set teachers_dir in the spec)")
        unknown = set(classes or []) - set(COCO80)
        if unknown:
            raise ValueError(f"unknown COCO classes {sorted(unknown)}")
        if not isinstance(tiles, int) or tiles < 1:
            raise ValueError(f"tiles: expected an integer >= 1, got {tiles!r}")
        self.classes, self.score_threshold, self.nms_iou, self.tiles = classes, score_threshold, nms_iou, tiles
        self.cache_name = (f"{self.name}{self.cache_tag}-{model_digest(self.path)}"
                           + (f"-tiles{tiles}" if tiles > 1 else ""))
        self.model = ModelRunner(self.path, threads)

    def _detect(self, rgb: np.ndarray) -> list[dict]:
        raise NotImplementedError

    def _raw(self, rgb: np.ndarray) -> list[dict]:
        whole = self._detect(rgb)
        if self.tiles == 1:
            return nms(whole, self.nms_iou)
        h, w = rgb.shape[:2]
        tiled = []
        for x0, y0, x1, y1 in tile_grid(w, h, self.tiles):
            found = self._detect(np.ascontiguousarray(rgb[y0:y1, x0:x1]))
            tiled.append(((x0, y0, x1, y1), [{**lab, "box": [round(v + (x0, y0)[i % 2], 1) for i, v in enumerate(lab["box"])]}
                                             for lab in found]))
        return merge_tiled(whole, tiled, (w, h), self.nms_iou)


def _label(box: list[float], scale: tuple[float, float], size: tuple[int, int], cls: int, score: float) -> dict:
    """A network box (its input's pixels) as a label in the frame's pixels, clipped to the frame."""
    (sx, sy), (w, h) = scale, size
    box = [box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy]
    box = [round(min(max(v, 0.0), lim), 1) for v, lim in zip(box, (w, h, w, h))]
    return {"box": box, "class": COCO80[cls], "score": round(score, 4)}


class CenterNetTeacher(DetectorTeacher):
    """COCO-80 CenterNet (MobileNetV3), 512 x 512 RGB 0-255 in, [100, 6] out: x1, y1, x2, y2, score, class."""

    name = "centernet"

    def _detect(self, rgb: np.ndarray) -> list[dict]:
        h, w = rgb.shape[:2]
        x = cv2.resize(rgb, (512, 512), interpolation=cv2.INTER_LINEAR).astype(np.float32)[None]
        labels = []
        for x1, y1, x2, y2, score, c in self.model.run(x)[0][0].tolist():
            if score >= 0.1 and 0 <= int(c) < len(COCO80):
                labels.append(_label([x1, y1, x2, y2], (w / 512, h / 512), (w, h), int(c), float(score)))
        return labels


class NanoDetTeacher(DetectorTeacher):
    """COCO-80 NanoDet (ShuffleNetV2, GFL head), 416 x 416; decoded by teacher_models.decode_nanodet, its best
    `KEEP` boxes, then class-wise NMS (its dense outputs hold several boxes per object). KEEP: CenterNet gives its
    best 100; NanoDet's 300-400 boxes over 0.1 on a street frame made NMS cost 6x the network (145 ms)."""

    name = "nanodet"
    KEEP = 200
    cache_tag = f"-top{KEEP}"

    def _detect(self, rgb: np.ndarray) -> list[dict]:
        h, w = rgb.shape[:2]
        found = sorted(decode_nanodet(self.model.run(nanodet_input(rgb)), 0.1), key=lambda d: -d[2])[:self.KEEP]
        s = NANODET_SIZE
        return nms([_label(b, (w / s, h / s), (w, h), c, p) for b, c, p in found], self.nms_iou)


class FusedTeacher(Teacher):
    """Detector teachers' boxes fused per frame (label_fusion.fuse_boxes). Each member labels through its own
    cache at score >= 0.1; the fusion is recomputed on read (milliseconds), so new weights never relabel."""

    def __init__(self, members: list[DetectorTeacher], classes: list[str] | None = None, score_threshold: float = 0.3,
                 weights: dict[str, dict[str, float]] | None = None, iou: float = 0.55):
        if len(members) < 2:
            raise ValueError(f"a fused teacher needs at least two members, got {len(members)}")
        self.members, self.classes, self.score_threshold = members, classes, score_threshold
        self.weights, self.iou = weights or {}, iou
        for m in members:
            m.classes, m.score_threshold = classes, 0.1
        self.cache_name = "fused-" + "+".join(m.cache_name for m in members)

    def label(self, frames: list[TrainingFrame], cache_dir: Path | None = None, progress: bool = True) -> dict[str, list[dict]]:
        per = {m.name: m.label(frames, cache_dir, progress) for m in self.members}
        return {f.key: self.filter(fuse_boxes({name: labs[f.key] for name, labs in per.items()}, self.weights,
                                              self.iou)) for f in frames}


DETECTORS = {"centernet": CenterNetTeacher, "nanodet": NanoDetTeacher}
FUSED_DEFAULT = ("centernet", "nanodet")


def detector_teacher(name: str, folder: str | Path | None = None, classes: list[str] | None = None,
                     score_threshold: float = 0.3, tiles: int = 1, weights: dict | None = None,
                     path: str | Path | None = None) -> Teacher:
    """A detector teacher by name: "centernet", "nanodet", or "fused" (both, box-fused with `weights`).
    `path` names a user's own file for a single detector (IR or ONNX of the same network)."""
    if name == "fused":
        members = [DETECTORS[m](None, classes, 0.1, tiles=tiles, folder=folder) for m in FUSED_DEFAULT]
        return FusedTeacher(members, classes, score_threshold, weights)
    if name not in DETECTORS:
        raise ValueError(f"teacher {name!r}: expected one of {', '.join([*DETECTORS, 'fused'])}")
    return DETECTORS[name](path, classes, score_threshold, tiles=tiles, folder=folder)


class HogPeopleTeacher(Teacher):
    """OpenCV HOG people detector; `upscale` enlarges the frame first (its window is 64x128 px)."""

    def __init__(self, upscale: float = 1.5, score_threshold: float = 0.5, nms_iou: float = 0.4):
        self.upscale, self.score_threshold, self.nms_iou = upscale, score_threshold, nms_iou
        self.classes = ["person"]
        self.cache_name = f"hog-x{upscale}"
        self._hog = cv2.HOGDescriptor()
        self._hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())

    def _raw(self, rgb: np.ndarray) -> list[dict]:
        img = cv2.resize(rgb, None, fx=self.upscale, fy=self.upscale) if self.upscale != 1 else rgb
        rects, weights = self._hog.detectMultiScale(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), winStride=(8, 8),
                                                    padding=(8, 8), scale=1.05)
        labels = []
        for (x, y, w, h), wt in zip(np.asarray(rects).reshape(-1, 4).tolist(), np.asarray(weights).ravel().tolist()):
            s = self.upscale
            # SVM margin → (0, 1) so thresholds read like the other teachers' scores.
            labels.append({"box": [round(x / s, 1), round(y / s, 1), round((x + w) / s, 1), round((y + h) / s, 1)],
                           "class": "person", "score": round(float(1 / (1 + np.exp(-wt))), 4)})
        return nms(labels, self.nms_iou)


class HaarTeacher(Teacher):
    """One OpenCV Haar cascade as a one-class detector (boxes get score 1: cascades give none)."""

    def __init__(self, cascade: str = "haarcascade_fullbody.xml", class_name: str = "person",
                 scale_factor: float = 1.1, min_neighbors: int = 3):
        self.file = Path(cascade) if Path(cascade).is_file() else Path(cv2.data.haarcascades) / cascade
        self._cascade = cv2.CascadeClassifier(str(self.file))
        if self._cascade.empty():
            raise FileNotFoundError(f"cannot load Haar cascade {cascade!r}")
        self.class_name, self.scale_factor, self.min_neighbors = class_name, scale_factor, min_neighbors
        self.classes, self.score_threshold = [class_name], 0.0
        self.cache_name = f"haar-{self.file.stem}-{scale_factor}-{min_neighbors}-{class_name.replace(' ', '_')}"

    def _raw(self, rgb: np.ndarray) -> list[dict]:
        gray = cv2.equalizeHist(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
        rects = self._cascade.detectMultiScale(gray, scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors)
        return [{"box": [float(x), float(y), float(x + w), float(y + h)], "class": self.class_name, "score": 1.0}
                for x, y, w, h in np.asarray(rects).reshape(-1, 4).tolist()]


def frame_key(video: str, t: float) -> str:
    return f"{video}@{t:.3f}"


def load_coco_json(path: str | Path, classes: list[str] | None = None) -> dict[str, list[dict]]:
    """COCO-style boxes → {frame key: labels}. Each image names its frame either with our fields
    `"video"` and `"t"` (seconds) or a file_name "VIDEO@T" (e.g. "pedestrians@12.300"); bbox is [x, y, w, h]."""
    data = json.loads(Path(path).read_text())
    cats = {c["id"]: c["name"] for c in data.get("categories", [])}
    keys = {}
    for img in data["images"]:
        if "video" in img and "t" in img:
            keys[img["id"]] = frame_key(img["video"], float(img["t"]))
        else:
            video, _, t = str(img["file_name"]).rpartition("@")
            keys[img["id"]] = frame_key(Path(video).stem, float(t))
    out: dict[str, list[dict]] = {k: [] for k in keys.values()}
    for ann in data.get("annotations", []):
        name = cats.get(ann["category_id"], str(ann["category_id"]))
        if classes is not None and name not in classes:
            continue
        x, y, w, h = ann["bbox"]
        out[keys[ann["image_id"]]].append({"box": [x, y, x + w, y + h], "class": name, "score": float(ann.get("score", 1.0))})
    return out


def save_coco_json(path: str | Path, labels: dict[str, list[dict]]) -> Path:
    """The inverse of `load_coco_json` (file_name = frame key): export teacher labels for inspection or reuse."""
    names = sorted({lab["class"] for labs in labels.values() for lab in labs})
    images, anns = [], []
    for i, (key, labs) in enumerate(sorted(labels.items())):
        images.append({"id": i, "file_name": key})
        for lab in labs:
            x1, y1, x2, y2 = lab["box"]
            anns.append({"id": len(anns), "image_id": i, "category_id": names.index(lab["class"]),
                         "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0,
                         "score": lab["score"]})
    data = {"images": images, "annotations": anns, "categories": [{"id": i, "name": n} for i, n in enumerate(names)]}
    Path(path).write_text(json.dumps(data))
    return Path(path)


def load_clip_manifest(path: str | Path) -> list[dict]:
    """Clip labels, JSON Lines: {"video": "pedestrians", "start": 12.0, "end": 12.8, "label": "walking_left"}."""
    clips = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        clip = json.loads(line)
        missing = {"video", "start", "end", "label"} - set(clip)
        if missing:
            raise ValueError(f"{path}:{n}: clip is missing {sorted(missing)}")
        clips.append({"video": Path(str(clip["video"])).stem, "start": float(clip["start"]),
                      "end": float(clip["end"]), "label": str(clip["label"])})
    return clips
