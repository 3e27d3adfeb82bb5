"""Other cameras made from our footage: a `View` is one camera, described by a geometric part (what it frames and
how) and a photometric part (what its sensor, lens and encoder do to the picture).

Two uses:
- training augmentation for a general detection adapter: `random_view(rng)` draws a plausible camera, and
  `View.apply` renders a frame through it and carries the frame's boxes with it;
- evaluation on cameras nothing was trained on: `EVAL_VIEWS` are fixed held-out cameras, `write_view_video`
  re-renders a whole video through one, and `carry_human_set` passes the human-checked boxes through exactly
  the same geometry, so the new video gets its own human-checked set. `fit_views()` are other fixed cameras,
  for fitting a per-camera adapter on a "new camera" without touching the held-out ones.

Coordinates: boxes are [x1, y1, x2, y2] in continuous pixel coordinates (pixel i covers [i, i + 1)), as in the
human-checked set. The geometry runs crop -> scale -> perspective -> mirror and is, as a whole, one 3x3
homography (`View.matrix`): boxes are mapped by that matrix and the pixels are rendered by the same steps, so
the two cannot disagree. The photometry runs after it and never changes the picture's size, so it never
moves a box: blur (lens) -> sensor downscale -> gain and gamma (exposure, tone) -> noise (at the sensor's
resolution) -> upscale back -> JPEG.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from vlora_va.ingest.exposure import tone_table

MIN_VISIBLE = 0.3  # a mapped box keeps a label only if at least this share of its area stays inside the new frame
MIN_SIDE = 1.0  # px: a clipped box thinner than this is degenerate (nothing of the object is left to see)
VIDEO_CRF = 20  # H.264 quality of write_view_video: the view's photometry is the degradation, not the container


@dataclass(frozen=True)
class View:
    """One camera. Geometric part: `crop` (x0, y0, w, h as fractions of the source frame), `scale` (output pixels
    per cropped pixel), `perspective` (eight inward corner offsets, fractions of the scaled crop: TL x, TL y,
    TR x, TR y, BR x, BR y, BL x, BL y; the quadrilateral they mark is stretched onto the whole output, like a
    camera tilted or turned a little; inward only, so no pixel comes from outside the picture) and `mirror`
    (horizontal). Photometric part: `gain` (brightness multiplier), `gamma` (> 1 darkens the mid-tones),
    `noise_sigma` (Gaussian sensor noise, 8-bit levels), `blur_sigma` (Gaussian, output px), `jpeg_quality`
    (1-100, or None for no JPEG) and `sensor_scale` (< 1: a smaller sensor, the picture made at this fraction of
    the size and scaled back up)."""

    crop: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)
    scale: float = 1.0
    perspective: tuple[float, ...] = (0.0,) * 8
    mirror: bool = False
    gain: float = 1.0
    gamma: float = 1.0
    noise_sigma: float = 0.0
    blur_sigma: float = 0.0
    jpeg_quality: int | None = None
    sensor_scale: float = 1.0

    def __post_init__(self):
        # Checked here, once: a bad camera should fail where it is described, naming the field, not deep in cv2.
        crop = _floats("crop", self.crop, 4)
        x0, y0, w, h = crop
        if not (0 <= x0 and 0 <= y0 and w > 0 and h > 0 and x0 + w <= 1 + 1e-9 and y0 + h <= 1 + 1e-9):
            raise ValueError(f"View.crop: expected x0, y0 >= 0, w, h > 0 and x0 + w, y0 + h <= 1 (fractions), got {self.crop!r}")
        persp = _floats("perspective", self.perspective, 8)
        if not all(0 <= v <= 0.25 for v in persp):
            raise ValueError(f"View.perspective: expected 8 inward offsets in [0, 0.25], got {self.perspective!r}")
        for name, lo, hi in (("scale", 0.05, 4.0), ("gain", 0.05, 4.0), ("gamma", 0.2, 5.0), ("noise_sigma", 0.0, 50.0),
                             ("blur_sigma", 0.0, 10.0), ("sensor_scale", 0.05, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"View.{name}: expected a number in [{lo:g}, {hi:g}], got {v!r}")
        q = self.jpeg_quality
        if q is not None and (isinstance(q, bool) or not isinstance(q, (int, np.integer)) or not 1 <= q <= 100):
            raise ValueError(f"View.jpeg_quality: expected None or an integer in [1, 100], got {q!r}")
        if not isinstance(self.mirror, (bool, np.bool_)):
            raise ValueError(f"View.mirror: expected a bool, got {self.mirror!r}")
        # Stored as plain tuples of floats: the view stays hashable, comparable and JSON-able (describe()).
        object.__setattr__(self, "crop", crop)
        object.__setattr__(self, "perspective", persp)
        object.__setattr__(self, "mirror", bool(self.mirror))
        object.__setattr__(self, "jpeg_quality", None if q is None else int(q))

    # --- geometry -------------------------------------------------------------------------------------------------

    def crop_pixels(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(x0, y0, w, h) of the crop in whole pixels of a width x height frame (edges rounded, so a crop reaching
        the frame's edge ends exactly there)."""
        x0, y0, w, h = self.crop
        px0, py0 = round(x0 * width), round(y0 * height)
        px1, py1 = round((x0 + w) * width), round((y0 + h) * height)
        return px0, py0, max(1, min(width, px1) - px0), max(1, min(height, py1) - py0)

    def out_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of a width x height frame seen through this view."""
        _, _, cw, ch = self.crop_pixels(width, height)
        return max(1, round(cw * self.scale)), max(1, round(ch * self.scale))

    def matrix(self, width: int, height: int) -> np.ndarray:
        """3x3 homography from source to output continuous pixel coordinates: mirror @ perspective @ scale @ crop."""
        cx, cy, cw, ch = self.crop_pixels(width, height)
        ow, oh = self.out_size(width, height)
        crop = np.array([[1, 0, -cx], [0, 1, -cy], [0, 0, 1]], float)
        # The scale per axis is the rounded output size over the crop, exactly what cv2.resize does.
        scale = np.diag([ow / cw, oh / ch, 1.0])
        mirror = np.array([[-1, 0, ow], [0, 1, 0], [0, 0, 1]], float) if self.mirror else np.eye(3)
        return mirror @ _perspective_matrix(self.perspective, ow, oh) @ scale @ crop

    def map_boxes(self, boxes, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Every box of a frame of `size` (width, height) mapped into this view: (boxes [n, 4] clipped to the
        output frame, visible [n]: the share of each mapped box's area inside the output frame, 0 for a box that
        is degenerate there). A rectangle's image under a homography is the quadrilateral of its four mapped
        corners (lines stay lines), so the bounding box of those corners is exact."""
        b = _as_boxes(boxes)
        if not len(b):
            return b, np.zeros(0)
        ow, oh = self.out_size(*size)
        m = self.matrix(*size)
        corners = np.stack([b[:, [0, 1]], b[:, [2, 1]], b[:, [2, 3]], b[:, [0, 3]]], axis=1)  # [n, 4, 2]
        pts = np.concatenate([corners, np.ones((*corners.shape[:2], 1))], axis=2) @ m.T
        xy = pts[..., :2] / pts[..., 2:3]
        mapped = np.concatenate([xy.min(axis=1), xy.max(axis=1)], axis=1)
        clipped = np.clip(mapped, 0, [ow, oh, ow, oh])
        cw, ch = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
        area = (mapped[:, 2] - mapped[:, 0]) * (mapped[:, 3] - mapped[:, 1])
        ok = (cw >= MIN_SIDE) & (ch >= MIN_SIDE) & (area > 0)
        visible = np.where(ok, cw * ch / np.where(area > 0, area, 1), 0.0)
        return clipped, visible

    def render_geometry(self, rgb: np.ndarray) -> np.ndarray:
        """The frame's pixels through crop -> scale -> perspective -> mirror (the steps `matrix` composes)."""
        h, w = rgb.shape[:2]
        cx, cy, cw, ch = self.crop_pixels(w, h)
        ow, oh = self.out_size(w, h)
        img = rgb[cy:cy + ch, cx:cx + cw]
        if (ow, oh) != (cw, ch):
            # Area averaging when shrinking (no aliasing, like a sensor binning), bilinear when enlarging.
            img = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_AREA if ow * oh < cw * ch else cv2.INTER_LINEAR)
        if any(self.perspective):
            hm = _pixel_centres(_perspective_matrix(self.perspective, ow, oh))
            img = cv2.warpPerspective(img, hm, (ow, oh), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        if self.mirror:
            img = img[:, ::-1]
        return np.ascontiguousarray(img)

    # --- photometry -----------------------------------------------------------------------------------------------

    def render_photometry(self, rgb: np.ndarray, seed: int = 0) -> np.ndarray:
        """The sensor, lens and encoder on an already framed picture; same size out. Only the noise is random, and
        it is drawn from `seed` alone."""
        img = rgb
        if self.blur_sigma > 0:
            img = cv2.GaussianBlur(img, (0, 0), self.blur_sigma)
        h, w = img.shape[:2]
        small = (max(1, round(w * self.sensor_scale)), max(1, round(h * self.sensor_scale)))
        if small != (w, h):
            img = cv2.resize(img, small, interpolation=cv2.INTER_AREA)
        if self.gain != 1 or self.gamma != 1:
            img = cv2.LUT(img, tone_table(self.gamma, self.gain))  # gamma on the level, then the gain
        if self.noise_sigma > 0:
            # At the sensor's resolution: a small sensor's noise is coarse once scaled up, as on a real one.
            noise = np.random.default_rng(seed).standard_normal(img.shape, dtype=np.float32) * self.noise_sigma
            img = np.clip(img.astype(np.float32) + noise, 0, 255).round().astype(np.uint8)
        if small != (w, h):
            img = cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)
        if self.jpeg_quality is not None:
            img = _jpeg(img, self.jpeg_quality)
        return np.ascontiguousarray(img)

    # --- both -----------------------------------------------------------------------------------------------------

    def apply(self, rgb: np.ndarray, boxes=None, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rgb2, boxes2, keep): the uint8 RGB frame seen through this camera, its boxes ([[x1, y1, x2, y2], ...]
        in pixels, or None) mapped and clipped to the new frame, and `keep`, the indices of the input boxes that
        boxes2 holds, in order (labels' classes follow with `classes[keep]`). A box is dropped when less than
        MIN_VISIBLE of it stays in the frame or it is degenerate. The noise is drawn from `seed`."""
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"View.apply: expected a uint8 [H, W, 3] frame, got {rgb.dtype} {rgb.shape}")
        h, w = rgb.shape[:2]
        mapped, visible = self.map_boxes(boxes, (w, h))
        keep = np.flatnonzero(visible >= MIN_VISIBLE)
        return self.render_photometry(self.render_geometry(rgb), seed), mapped[keep], keep

    def describe(self) -> dict:
        return asdict(self)

    def geometry(self) -> View:
        """This view without its photometric part."""
        return View(crop=self.crop, scale=self.scale, perspective=self.perspective, mirror=self.mirror)


def _floats(name: str, values, n: int) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"View.{name}: expected {n} numbers, got {values!r}") from None
    if len(out) != n or not all(math.isfinite(v) for v in out):
        raise ValueError(f"View.{name}: expected {n} finite numbers, got {values!r}")
    return out


def _as_boxes(boxes) -> np.ndarray:
    b = np.zeros((0, 4)) if boxes is None else np.asarray(boxes, dtype=float)
    if b.size == 0:
        return np.zeros((0, 4))
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"boxes: expected [[x1, y1, x2, y2], ...], got shape {b.shape}")
    return b


def _perspective_matrix(offsets: tuple[float, ...], w: int, h: int) -> np.ndarray:
    """The homography stretching the quadrilateral marked by the inward corner offsets onto the whole w x h frame."""
    if not any(offsets):
        return np.eye(3)
    tlx, tly, trx, try_, brx, bry, blx, bly = offsets
    src = np.float32([[tlx * w, tly * h], [w - trx * w, try_ * h], [w - brx * w, h - bry * h], [blx * w, h - bly * h]])
    dst = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    return cv2.getPerspectiveTransform(src, dst).astype(float)


def _pixel_centres(m: np.ndarray) -> np.ndarray:
    """A continuous-coordinate homography in cv2's convention, where pixel i's centre is at i (not i + 0.5)."""
    shift = np.array([[1, 0, 0.5], [0, 1, 0.5], [0, 0, 1]])
    return np.linalg.inv(shift) @ m @ shift


def _jpeg(rgb: np.ndarray, quality: int) -> np.ndarray:
    # cv2 codes BGR: converting keeps the chroma planes (and so their artefacts) the ones a real encoder makes.
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


# --- cameras -------------------------------------------------------------------------------------------------------

def random_view(rng: np.random.Generator) -> View:
    """A random camera for training augmentation. Each part is on or off by its own chance and its ranges stay
    mild, so a person stays recognisable: zoom to at least 60% of each side, scale 0.5-1.25, gain 0.45-1.4 with
    gamma 0.7-1.6 (mid-grey at worst about 38 levels, a dim evening), noise up to 10 levels, blur up to 1.5 px,
    JPEG quality 30-90, a sensor at 45-85% of the resolution, corners pulled in by up to 8%."""
    crop = (0.0, 0.0, 1.0, 1.0)
    if rng.random() < 0.6:
        s = rng.uniform(0.6, 1.0)
        w, h = float(np.clip(s * rng.uniform(0.9, 1.1), 0.6, 1.0)), s  # a slightly different aspect too: another lens
        crop = (rng.uniform(0, 1 - w), rng.uniform(0, 1 - h), w, h)
    perspective = tuple(rng.uniform(0, 0.08, 8)) if rng.random() < 0.4 else (0.0,) * 8
    return View(
        crop=crop,
        scale=float(rng.uniform(0.5, 1.25)),
        perspective=perspective,
        mirror=bool(rng.random() < 0.5),
        gain=float(np.exp(rng.uniform(np.log(0.45), np.log(1.4)))),
        gamma=float(np.exp(rng.uniform(np.log(0.7), np.log(1.6)))),
        noise_sigma=float(rng.uniform(1, 10)) if rng.random() < 0.6 else 0.0,
        blur_sigma=float(rng.uniform(0.5, 1.5)) if rng.random() < 0.4 else 0.0,
        jpeg_quality=int(rng.integers(30, 91)) if rng.random() < 0.5 else None,
        sensor_scale=float(rng.uniform(0.45, 0.85)) if rng.random() < 0.3 else 1.0,
    )


# Held-out cameras for evaluation: never used for training or for fitting (fit_views are others).
EVAL_VIEWS: dict[str, View] = {
    # Mounted elsewhere: a tighter frame (86% x 82% of the sides; it keeps the car park at the top right, where
    # the human-checked set's cars and trucks are), seen from the other side, turned a little (left corners in).
    "reframed": View(crop=(0.14, 0.06, 0.86, 0.82), mirror=True,
                     perspective=(0.05, 0.03, 0.0, 0.0, 0.0, 0.02, 0.03, 0.0)),
    # Dusk: dark mid-tones (mid-grey 128 -> about 41), amplified sensor noise, a soft lens.
    "low-light": View(gain=0.45, gamma=1.5, noise_sigma=6.0, blur_sigma=0.8),
    # A cheap camera: half the resolution scaled back up, some noise, hard JPEG compression.
    "small-sensor": View(sensor_scale=0.5, noise_sigma=3.0, jpeg_quality=35),
}


def fit_views() -> dict[str, View]:
    """Other fixed cameras (none shares its parameters with EVAL_VIEWS), to make a "new camera" to fit a
    per-camera adapter on while the eval views stay held out."""
    return {
        # Further right and lower resolution: the right three quarters, shrunk, turned the other way round.
        "fit-corner": View(crop=(0.22, 0.0, 0.78, 0.9), scale=0.8, perspective=(0.0, 0.0, 0.0, 0.05, 0.05, 0.0, 0.0, 0.0),
                           gain=0.85, gamma=1.15, noise_sigma=2.0, jpeg_quality=70),
        # Overcast, overexposed and mirrored, a little soft.
        "fit-bright": View(mirror=True, gain=1.3, gamma=0.8, blur_sigma=1.2, noise_sigma=1.5),
        # A zoomed-in, low-resolution camera at night.
        "fit-night-zoom": View(crop=(0.3, 0.08, 0.66, 0.7), scale=1.1, gain=0.6, gamma=1.3, noise_sigma=8.0,
                               sensor_scale=0.7, jpeg_quality=55),
    }


# --- whole videos and their human-checked sets -----------------------------------------------------------------------

def even_size(width: int, height: int) -> tuple[int, int]:
    """The size an H.264 yuv420p encode needs (even sides): the view's size, one pixel more where odd."""
    return width + width % 2, height + height % 2


def pad_even(rgb: np.ndarray) -> np.ndarray:
    """One replicated column / row added at the right / bottom where a side is odd; box coordinates are unchanged."""
    h, w = rgb.shape[:2]
    ew, eh = even_size(w, h)
    if (ew, eh) == (w, h):
        return rgb
    return cv2.copyMakeBorder(rgb, 0, eh - h, 0, ew - w, cv2.BORDER_REPLICATE)


def write_view_video(src: Path, dst: Path, view: View, seed: int = 0) -> dict:
    """Re-render a whole video through `view` into an H.264 MP4 (libx264, yuv420p, CRF VIDEO_CRF, 1-s GOPs, one
    thread): every decoded frame through `View.apply` with seed + its index (so the noise is fresh per frame and
    the same on every run), written with the source frame's own timestamp in the source's time base, at the
    source's frame rate. The frame at time t of the output is the view of the frame at t of the source.

    H.264 yuv420p needs even sides: where the view's size is odd, one column / row is added at the right /
    bottom, a copy of the last one (`pad_even`); box coordinates are unchanged by it, and `carry_human_set`
    records the padded size. Returns {"frames", "size" (the video's, padded), "view_size", "seconds"}."""
    import time

    import av

    t0 = time.monotonic()
    n = 0
    with av.open(str(src)) as inp:
        ist = inp.streams.video[0]
        ist.thread_type = "NONE"  # one decode thread (the machine is shared)
        size = view.out_size(ist.codec_context.width, ist.codec_context.height)
        ew, eh = even_size(*size)
        rate = ist.average_rate or Fraction(25)
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        with av.open(str(dst), "w", options={"movflags": "+faststart"}) as out:
            ost = out.add_stream("libx264", rate=rate)
            ost.width, ost.height, ost.pix_fmt = ew, eh, "yuv420p"
            ost.time_base = ist.time_base  # the source's clock: its timestamps are written as they are
            ost.codec_context.time_base = ist.time_base
            ost.options = {"crf": str(VIDEO_CRF), "preset": "medium", "g": str(max(1, round(rate))), "threads": "1"}
            for i, frame in enumerate(inp.decode(ist)):
                rgb, _, _ = view.apply(frame.to_ndarray(format="rgb24"), None, seed=seed + i)
                vf = av.VideoFrame.from_ndarray(pad_even(rgb), format="rgb24")
                vf.pts = frame.pts if frame.pts is not None else round(i / rate / ist.time_base)
                vf.time_base = ist.time_base
                out.mux(ost.encode(vf))
                n += 1
            out.mux(ost.encode(None))
    return {"frames": n, "size": (ew, eh), "view_size": size, "seconds": round(time.monotonic() - t0, 2)}


def carry_human_set(human_json_path: str | Path, view: View, src_video_stem: str, new_stem: str,
                    out_path: str | Path, source: str | None = None) -> dict:
    """Write the human-checked set of one video as the set of its re-rendering through `view` (same COCO format,
    loads with evaluate.load_human_set): only src_video_stem's images, each keeping its id and "t", with "video"
    = new_stem, "file_name" = new_stem@t, "source" = `source` (default "<new_stem>.mp4"), width / height = the
    video's (`write_view_video`'s, padded to even), and every box passed through the view's geometry
    (`View.map_boxes`, coordinates rounded to 0.01 px). Flags and notes are kept. A box with less than
    MIN_VISIBLE of it left inside the new frame becomes ignore / iscrowd (a sliver of a person at the edge is
    neither something a detector must find nor a false positive) with a note; a box with nothing left is
    omitted. activity_clips are dropped (a mirror turns walking_left into walking_right, a perspective changes
    motion): the "activities" list stays, with no clips. Returns the counts."""
    data = json.loads(Path(human_json_path).read_text())
    images = [img for img in data["images"] if img["video"] == src_video_stem]
    if not images:
        raise ValueError(f"carry_human_set: no images of video {src_video_stem!r} in {human_json_path}")
    by_id = {img["id"]: img for img in images}
    new_images = []
    for img in images:
        w, h = even_size(*view.out_size(img["width"], img["height"]))
        new_images.append({**img, "file_name": f"{new_stem}@{float(img['t']):.3f}", "video": new_stem,
                           "source": source or f"{new_stem}.mp4", "width": w, "height": h})
    anns = [a for a in data["annotations"] if a["image_id"] in by_id]
    counts = {"images": len(new_images), "boxes": 0, "made_ignore": 0, "omitted": 0}
    new_anns = []
    for a in anns:
        img = by_id[a["image_id"]]
        x, y, bw, bh = a["bbox"]
        (box,), (visible,) = view.map_boxes([[x, y, x + bw, y + bh]], (img["width"], img["height"]))
        if visible <= 0:
            counts["omitted"] += 1
            continue
        x1, y1, x2, y2 = (round(float(v), 2) for v in box)
        new = {**a, "bbox": [x1, y1, round(x2 - x1, 2), round(y2 - y1, 2)], "area": round((x2 - x1) * (y2 - y1), 2)}
        if visible < MIN_VISIBLE and not a.get("ignore"):
            note = f"{visible:.0%} left inside view {new_stem}: don't-care"
            new.update(iscrowd=1, ignore=1, note=f"{a['note']}; {note}" if a.get("note") else note)
            counts["made_ignore"] += 1
        new_anns.append(new)
        counts["boxes"] += 1
    info = {**data.get("info", {})}
    info["description"] = (f"{src_video_stem} through the camera view {new_stem}: " + info.get("description", "")
                           + " Boxes carried through the view's geometry (vlora_va.training.views.carry_human_set);"
                           + " activity clips dropped.")
    info["view"] = view.describe()
    out = {**data, "info": info, "images": new_images, "annotations": new_anns, "activity_clips": []}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(out, separators=(",", ":")) + "\n")  # the source file's own layout
    return counts

