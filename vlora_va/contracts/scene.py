"""What a stream's scene declares beyond its tasks: lines and zones, tracking, snapshots (the schema, and checks).

In pipelines.yaml, per stream, in original-frame pixels (x right, y down):

    lines: [{name: path, points: [[x1, y1], [x2, y2]], min_distance_px: 8, cooldown_s: 2}]
    zones: [{name: lawn, points: [[x, y], ...], dwell_s: 10, cooldown_s: 2}]
    offline_after_s: 10      # a live stream that delivers no frame this long is offline (an event)
    snapshots: false         # events of this stream store a JPEG of their frame

and at the top level `tracking: {...}` (TrackingConfig) and `snapshots: {dir, max_mb, max_age_s}`.

A line counts a confirmed track whose reference point (the bottom centre of its box) crosses the segment itself,
not its extension. `in` is from the walker's left to the walker's right for someone walking the line from its first
point to its second, as seen on screen: s = (x2-x1)(cy-y1) - (y2-y1)(cx-x1) goes from negative to positive.
The parsing functions take config.py's checker (duck typed) so this module does not import config.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlora_va.contracts.wire import NAME

Point = tuple[float, float]
# appearance: ours (analytics/appearance_tracker.py), ByteTrack's association plus each box's appearance and
# re-entry; the others are Roboflow `trackers` on box geometry alone
TRACKERS = ("appearance", "bytetrack", "sort", "ocsort")
MATCHES = ("diou", "giou", "iou")  # how a track's predicted box and a detection are compared (tracking.py)


@dataclass(frozen=True)
class LineConfig:
    name: str
    points: tuple[Point, Point]
    # Hysteresis: a crossing counts once the reference point is this far past the line (pixels), so a track
    # jittering on the line does not count; it counts again only after going this far back across.
    min_distance_px: float = 8.0
    cooldown_s: float = 2.0  # a track's events on this line closer together than this are not sent (counts still are)


@dataclass(frozen=True)
class ZoneConfig:
    name: str
    points: tuple[Point, ...]  # a simple polygon, at least 3 points
    dwell_s: float = 0.0  # a track inside this long is loitering (an event); 0 = no loitering events
    cooldown_s: float = 2.0  # a track's entered/left events on this zone closer together than this are not sent


@dataclass(frozen=True)
class TrackingConfig:
    """How tracked tasks (`track: true`) link boxes across chunks (vlora_va/analytics/tracking.py)."""

    tracker: str = "appearance"  # one of TRACKERS
    # diou: overlap minus the centres' distance, so boxes that do not overlap still match by nearness: at a few
    # frames per second a walker's boxes 0.5 s apart often do not overlap (bench/tracking.py measures all three)
    match: str = "diou"
    lost_after_s: float = 2.0  # a track not seen this long ends (also across a shed chunk or an outage)
    min_hits: int = 2  # frames a track must be matched in before it is confirmed (gets a track_id, counts)
    min_score: float = 0.3  # detections below this score are not tracked
    activation_score: float = 0.5  # a new track starts only from a box this sure (weaker ones can only continue one)
    class_nms_iou: float = 0.7  # boxes of different classes overlapping this much are one object: the surer one stays
    # appearance tracker: a track lost for up to this long can be revived by appearance and keep its id (0: never)
    reid_window_s: float = 30.0
    appearance_weight: float = 4.0  # how much appearance counts against box geometry when matching (0: not at all)
    embeddings_in_rows: bool = False  # write each tracked box's embedding into its row (privacy: off by default)
    unique_window_s: float = 3600.0  # unique_objects counts the distinct tracks of the last this many seconds


@dataclass(frozen=True)
class SnapshotConfig:
    dir: str = "results/snapshots"
    max_mb: float = 200.0  # the oldest snapshots are deleted past this
    max_age_s: float = 7 * 86400.0  # and past this age
    max_width: int = 1280  # ingest scales wider sources down to this
    quality: int = 85  # JPEG quality


# ---------------------------------------------------------------- geometry checks
def _cross(o: Point, a: Point, b: Point) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def segments_intersect(p1: Point, p2: Point, q1: Point, q2: Point) -> bool:
    """Whether closed segments p1p2 and q1q2 share a point (touching counts)."""
    d1, d2 = _cross(q1, q2, p1), _cross(q1, q2, p2)
    d3, d4 = _cross(p1, p2, q1), _cross(p1, p2, q2)
    if ((d1 > 0) != (d2 > 0)) and d1 != 0 and d2 != 0 and ((d3 > 0) != (d4 > 0)) and d3 != 0 and d4 != 0:
        return True

    def on(a: Point, b: Point, c: Point) -> bool:  # c on segment ab, given collinear
        return min(a[0], b[0]) <= c[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= c[1] <= max(a[1], b[1])
    return ((d1 == 0 and on(q1, q2, p1)) or (d2 == 0 and on(q1, q2, p2)) or (d3 == 0 and on(p1, p2, q1))
            or (d4 == 0 and on(p1, p2, q2)))


def polygon_problem(points: tuple[Point, ...]) -> str | None:
    """Why points do not make a simple polygon (None when they do): too few, zero area, or edges that cross."""
    n = len(points)
    if n < 3:
        return f"a zone needs at least 3 points, got {n}"
    for i in range(n):  # crossings first: a symmetric bow-tie's signed area is 0, yet its problem is the crossing
        a1, a2 = points[i], points[(i + 1) % n]
        for j in range(i + 1, n):
            if j == i or (j + 1) % n == i or j == (i + 1) % n:
                continue  # neighbouring edges share a point by construction
            b1, b2 = points[j], points[(j + 1) % n]
            if segments_intersect(a1, a2, b1, b2):
                return f"edge {i} ({a1} to {a2}) crosses edge {j} ({b1} to {b2}): not a simple polygon"
    area2 = sum(points[i][0] * points[(i + 1) % n][1] - points[(i + 1) % n][0] * points[i][1] for i in range(n))
    if abs(area2) < 1e-9:
        return "the points enclose no area"
    return None


def outside_frame(points, width: int, height: int) -> list[Point]:
    """The points that lie outside a width x height frame."""
    return [p for p in points if not (0 <= p[0] <= width and 0 <= p[1] <= height)]


def scene_outside_frame(lines: tuple[LineConfig, ...], zones: tuple[ZoneConfig, ...], width: int,
                        height: int) -> list[str]:
    """One message per line or zone with a point outside a width x height frame (validate, and ingest at a live
    stream's first frame)."""
    out = []
    for kind, rules in (("lines", lines), ("zones", zones)):
        for r in rules:
            bad = outside_frame(r.points, width, height)
            if bad:
                pts = ", ".join(f"[{x:g}, {y:g}]" for x, y in bad)
                out.append(f"{kind} {r.name!r}: point(s) {pts} outside the {width}x{height} frame")
    return out


# ---------------------------------------------------------------- parsing (c: config_checker.Checker)
def _points(c, raw: Any, path: str) -> tuple[Point, ...] | None:
    if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 for p in raw):
        c.error(path, "expected a list of [x, y] points in original-frame pixels")
        return None
    out = []
    for i, (x, y) in enumerate(raw):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e6 for v in (x, y)):
            c.error(f"{path}[{i}]", f"expected two numbers (pixels), got {[x, y]!r}")
            return None
        out.append((float(x), float(y)))
    return tuple(out)


def _name(c, d: dict, path: str, seen: set[str], what: str) -> str | None:
    name = c.get(d, "name", path, str)
    if name is None:
        return None
    if not NAME.fullmatch(name):
        c.error(f"{path}.name", f"must be 1-64 characters of letters, digits, '_', '.', '-', got {name!r}")
        return None
    if name in seen:
        c.error(f"{path}.name", f"duplicate {what} name {name!r} in this stream")
        return None
    seen.add(name)
    return name


def _each(c, raw: Any, path: str, kind: str, example: str, keys: set[str]):
    """(mapping, its key path, its name, its points) of each item of a lines: / zones: list; the name is None when
    missing, bad or a duplicate, the points None when unreadable (each reported)."""
    if raw is None:
        return
    if not isinstance(raw, list):
        c.error(path, f"expected a list of {kind}s: {example}")
        return
    seen: set[str] = set()
    for i, item in enumerate(raw):
        p = f"{path}[{i}]"
        d = c.mapping(item, p, keys | {"name", "points", "cooldown_s"})
        if d is not None:
            yield d, p, _name(c, d, p, seen, kind), _points(c, d.get("points"), f"{p}.points")


def parse_lines(c, raw: Any, path: str) -> tuple[LineConfig, ...]:
    out = []
    for d, p, name, pts in _each(c, raw, path, "line", "[{name, points: [[x1, y1], [x2, y2]]}]", {"min_distance_px"}):
        if pts is not None and (len(pts) != 2 or pts[0] == pts[1]):
            c.error(f"{p}.points", f"a line is two different points [[x1, y1], [x2, y2]], got {len(pts)} point(s)"
                    if len(pts) != 2 else "a line's two points are the same")
            pts = None
        dist = c.get(d, "min_distance_px", p, float, 8.0, minimum=0)
        cooldown = c.get(d, "cooldown_s", p, float, 2.0, minimum=0)
        if name is not None and pts is not None:
            out.append(LineConfig(name, (pts[0], pts[1]), dist, cooldown))
    return tuple(out)


def parse_zones(c, raw: Any, path: str) -> tuple[ZoneConfig, ...]:
    out = []
    for d, p, name, pts in _each(c, raw, path, "zone", "[{name, points: [[x, y], ...], dwell_s}]", {"dwell_s"}):
        if pts is not None and (problem := polygon_problem(pts)) is not None:
            c.error(f"{p}.points", problem)
            pts = None
        dwell = c.get(d, "dwell_s", p, float, 0.0, minimum=0)
        cooldown = c.get(d, "cooldown_s", p, float, 2.0, minimum=0)
        if name is not None and pts is not None:
            out.append(ZoneConfig(name, pts, dwell, cooldown))
    return tuple(out)


def parse_tracking(c, raw: Any) -> TrackingConfig:
    d = c.mapping(raw if raw is not None else {}, "tracking",
                  {"tracker", "match", "lost_after_s", "min_hits", "min_score", "activation_score",
                   "class_nms_iou", "reid_window_s", "appearance_weight", "embeddings_in_rows", "unique_window_s"})
    if d is None:
        return TrackingConfig()
    t = TrackingConfig()
    return TrackingConfig(
        tracker=c.get(d, "tracker", "tracking", str, t.tracker, choices=TRACKERS),
        match=c.get(d, "match", "tracking", str, t.match, choices=MATCHES),
        lost_after_s=c.get(d, "lost_after_s", "tracking", float, t.lost_after_s, minimum=0.1),
        min_hits=c.get(d, "min_hits", "tracking", int, t.min_hits, minimum=1),
        min_score=c.get(d, "min_score", "tracking", float, t.min_score, minimum=0),
        activation_score=c.get(d, "activation_score", "tracking", float, t.activation_score, minimum=0),
        class_nms_iou=c.get(d, "class_nms_iou", "tracking", float, t.class_nms_iou, minimum=0),
        reid_window_s=c.get(d, "reid_window_s", "tracking", float, t.reid_window_s, minimum=0),
        appearance_weight=c.get(d, "appearance_weight", "tracking", float, t.appearance_weight, minimum=0),
        embeddings_in_rows=c.get(d, "embeddings_in_rows", "tracking", bool, t.embeddings_in_rows),
        unique_window_s=c.get(d, "unique_window_s", "tracking", float, t.unique_window_s, minimum=1))


def parse_snapshots(c, raw: Any, base_dir) -> SnapshotConfig:
    d = c.mapping(raw if raw is not None else {}, "snapshots", {"dir", "max_mb", "max_age_s", "max_width", "quality"})
    if d is None:
        return SnapshotConfig()
    s = SnapshotConfig()
    directory = c.get(d, "dir", "snapshots", str, s.dir)
    return SnapshotConfig(
        dir=str(directory if str(directory).startswith("/") else base_dir / directory),
        max_mb=c.get(d, "max_mb", "snapshots", float, s.max_mb, minimum=0.1),
        max_age_s=c.get(d, "max_age_s", "snapshots", float, s.max_age_s, minimum=1),
        max_width=c.get(d, "max_width", "snapshots", int, s.max_width, minimum=64),
        quality=c.get(d, "quality", "snapshots", int, s.quality, minimum=10))
