"""vlora_va.analytics.rules: confirmed tracks -> line crossings and zone hits (direction, segment, hysteresis,
cooldown, lifecycle pairs, counts by class, bounded state), checked against hand-worked expectations and against a
plain per-track reference written here."""

from __future__ import annotations

import math
import random

import pytest

from vlora_va.analytics.rules import Hit, SceneRules, TrackPoint
from vlora_va.contracts.scene import LineConfig, ZoneConfig, segments_intersect

DT = 0.2  # 5 fps


def box_at(x: float, y: float) -> tuple[float, float, float, float]:
    """A 20 x 40 px box whose foot (bottom centre) is (x, y)."""
    return (x - 10.0, y - 40.0, x + 10.0, y)


def walk(rules: SceneRules, path: list[tuple[float, float]], track_id: str = "t1", cls: str = "person",
         t0: float = 0.0) -> list[Hit]:
    """One track along `path`, one point per frame (DT apart from t0); every hit."""
    hits = []
    for i, (x, y) in enumerate(path):
        hits += rules.update(t0 + i * DT, [TrackPoint(track_id, cls, box_at(x, y))])
    return hits


def line(p1, p2, **kw) -> LineConfig:
    kw.setdefault("cooldown_s", 0.0)  # hysteresis, not the cooldown, is under test unless a test says so
    return LineConfig("door", (p1, p2), **kw)


def brief(hits: list[Hit]) -> list[tuple]:
    return [(h.event, h.phase, h.rule, h.track_id, h.direction, round(h.ts, 3)) for h in hits]


VERTICAL = ((100.0, 0.0), (100.0, 200.0))  # drawn top to bottom


def test_foot_is_the_bottom_centre_of_the_box():
    assert TrackPoint("a", "person", (10.0, 20.0, 30.0, 60.0)).foot == (20.0, 60.0)


def test_worked_example_vertical_line_top_to_bottom_walking_right_to_left_is_in():
    # s = (x2-x1)(cy-y1) - (y2-y1)(cx-x1) = -200 (cx - 100): negative on the right, positive on the left
    rules = SceneRules((line(*VERTICAL),), ())
    hits = walk(rules, [(150 - 10 * i, 100) for i in range(11)])  # x 150 -> 50 at y 100
    # settled 10 px left of the line (>= min_distance_px 8) at x 90, frame 6
    assert brief(hits) == [("line_crossed", None, "door", "t1", "in", 1.2)]
    h = hits[0]
    assert (h.kind, h.cls, h.box, h.extra) == ("line", "person", box_at(90, 100), {})
    assert h.counts == {"in": {"person": 1}, "out": {}}


@pytest.mark.parametrize("p1, p2, start, end, direction", [
    (VERTICAL[0], VERTICAL[1], (150, 100), (50, 100), "in"),  # the worked example
    (VERTICAL[0], VERTICAL[1], (50, 100), (150, 100), "out"),
    (VERTICAL[1], VERTICAL[0], (150, 100), (50, 100), "out"),  # the same walk, the line drawn bottom to top
    # drawn left to right: the walker's right is down the screen (y grows down)
    ((0, 100), (200, 100), (100, 50), (100, 150), "in"),
    ((0, 100), (200, 100), (100, 150), (100, 50), "out"),
])
def test_direction_both_ways(p1, p2, start, end, direction):
    rules = SceneRules((line(p1, p2),), ())
    path = [(start[0] + (end[0] - start[0]) * i / 10, start[1] + (end[1] - start[1]) * i / 10) for i in range(11)]
    hits = walk(rules, path)
    assert [h.direction for h in hits] == [direction]
    assert rules.counts()["lines"]["door"] == {"in": {"person": 1} if direction == "in" else {},
                                               "out": {"person": 1} if direction == "out" else {}}


def test_crossing_back_counts_out():
    rules = SceneRules((line(*VERTICAL),), ())
    there = [(150 - 10 * i, 100) for i in range(11)]
    hits = walk(rules, there + there[::-1])
    assert [h.direction for h in hits] == ["in", "out"]
    assert hits[1].counts == {"in": {"person": 1}, "out": {"person": 1}}


@pytest.mark.parametrize("path, crossings", [
    ([(150, 300), (50, 300)], 0),  # crosses the line's extension below the segment
    ([(150, -40), (120, -40), (80, -40), (50, -40)], 0),  # above it, in small steps
    ([(150, 260), (50, 160)], 0),  # ends beside the segment's span, but the step crossed x=100 at y=210
    ([(150, -50), (50, 250)], 1),  # both ends outside the span; the one step (5 fps) goes through the segment
    ([(150, 260), (50, 140)], 1),  # crosses x=100 at y=200: touching the segment's end counts
])
def test_only_a_path_through_the_segment_counts_not_the_extension(path, crossings):
    rules = SceneRules((line(*VERTICAL),), ())
    assert len(walk(rules, path)) == crossings
    assert sum(rules.counts()["lines"]["door"]["in"].values()) == crossings


def test_settled_side_follows_a_pass_beside_the_segment():
    """After passing the extension, the track is on the other side: coming back through the segment is a crossing
    (out), not nothing."""
    rules = SceneRules((line(*VERTICAL),), ())
    hits = walk(rules, [(150, 300), (50, 300), (50, 100), (150, 100)])
    assert [h.direction for h in hits] == ["out"]


def jitter(n: int, x0: float = 100.0, amplitude: float = 3.0) -> list[tuple[float, float]]:
    return [(x0 + (amplitude if i % 2 else -amplitude), 100.0) for i in range(n)]


def test_hysteresis_a_track_jittering_on_the_line_makes_one_crossing():
    rules = SceneRules((line(*VERTICAL, min_distance_px=8.0),), ())
    hits = walk(rules, [(120, 100)] + jitter(20) + [(80, 100)])
    assert [h.direction for h in hits] == ["in"]
    assert rules.counts()["lines"]["door"] == {"in": {"person": 1}, "out": {}}


def test_hysteresis_jitter_that_goes_back_where_it_came_from_makes_none_and_crossing_back_counts_again():
    rules = SceneRules((line(*VERTICAL, min_distance_px=8.0),), ())
    assert walk(rules, [(120, 100)] + jitter(20) + [(120, 100)]) == []
    hits = walk(rules, jitter(20) + [(80, 100)] + jitter(20) + [(80, 100)] + jitter(20) + [(120, 100)], t0=10)
    assert [h.direction for h in hits] == ["in", "out"]
    assert rules.counts()["lines"]["door"] == {"in": {"person": 1}, "out": {"person": 1}}


def test_without_hysteresis_the_same_jitter_counts_every_flip():
    """The reference for the two tests above: min_distance_px 0 counts each sign change through the segment."""
    rules = SceneRules((line(*VERTICAL, min_distance_px=0.0),), ())
    hits = walk(rules, [(120, 100)] + jitter(20) + [(80, 100)])
    assert len(hits) == 21  # 120 -> 97 (in), then 19 flips, and 103 -> 80 (in)


def test_a_track_first_seen_on_the_line_starts_from_where_it_settles():
    rules = SceneRules((line(*VERTICAL, min_distance_px=8.0),), ())
    assert walk(rules, jitter(10) + [(80, 100)]) == []  # no known side before: no crossing
    assert [h.direction for h in walk(rules, [(120, 100)], t0=5)] == ["out"]


def test_cooldown_holds_back_hits_but_counts_change():
    rules = SceneRules((line(*VERTICAL, cooldown_s=5.0),), ())
    left, right = (80, 100), (120, 100)
    hits = walk(rules, [right, left, right, left, right, left])  # 5 real crossings in 1 s
    assert brief(hits) == [("line_crossed", None, "door", "t1", "in", 0.2)]
    assert rules.counts()["lines"]["door"] == {"in": {"person": 3}, "out": {"person": 2}}
    # another track is not held back by t1's cooldown
    assert [h.direction for h in walk(rules, [right, left], track_id="t2", t0=0.4)] == ["in"]
    # 5 s after t1's last RETURNED hit, t1's next crossing is returned, with every crossing in its counts
    hits = walk(rules, [left, right], t0=5.0)
    assert brief(hits) == [("line_crossed", None, "door", "t1", "out", 5.2)]
    assert hits[0].counts == {"in": {"person": 4}, "out": {"person": 3}}


# ---------------------------------------------------------------- zones

SQUARE = ((0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0))
OUT, IN = (150.0, 50.0), (50.0, 50.0)


def zone(**kw) -> ZoneConfig:
    kw.setdefault("cooldown_s", 0.0)
    return ZoneConfig("lawn", kw.pop("points", SQUARE), **kw)


def test_zone_enter_loiter_leave_with_dwell_and_pairs():
    rules = SceneRules((), (zone(dwell_s=1.0),))
    hits = walk(rules, [OUT, IN, IN, IN, IN, IN, IN, IN, OUT, OUT, OUT])  # inside from t=0.2 to t=1.6
    assert brief(hits) == [
        ("zone_entered", "start", "lawn", "t1", None, 0.4),  # confirmed on the 2nd frame inside
        ("loitering", "start", "lawn", "t1", None, 1.2),  # 1.0 s after the first frame inside
        ("loitering", "end", "lawn", "t1", None, 1.8),  # confirmed on the 2nd frame outside
        ("zone_left", "end", "lawn", "t1", None, 1.8),
    ]
    assert [h.extra for h in hits] == [{}, {"dwell_s": 1.0}, {"dwell_s": 1.4}, {"dwell_s": 1.4}]
    assert hits[0].counts == {"inside": {"person": 1}, "entered": {"person": 1}, "left": {}}
    assert hits[-1].counts == {"inside": {"person": 0}, "entered": {"person": 1}, "left": {"person": 1}}
    assert rules.occupancy() == {"lawn": {"person": 0}}


def test_no_loitering_when_dwell_is_zero_or_not_reached():
    rules = SceneRules((), (zone(dwell_s=0.0),))
    assert [h.event for h in walk(rules, [IN] * 30 + [OUT] * 2)] == ["zone_entered", "zone_left"]
    rules = SceneRules((), (zone(dwell_s=10.0),))
    assert [h.event for h in walk(rules, [IN] * 30 + [OUT] * 2)] == ["zone_entered", "zone_left"]


def test_boundary_flicker_changes_nothing():
    rules = SceneRules((), (zone(),))
    assert walk(rules, [OUT, IN] * 10) == []  # never 2 frames in a row inside
    assert rules.counts()["zones"]["lawn"] == {"inside": {}, "entered": {}, "left": {}}
    walk(rules, [IN, IN] + [OUT, IN] * 10, t0=5)  # inside, with single frames out
    assert rules.counts()["zones"]["lawn"] == {"inside": {"person": 1}, "entered": {"person": 1}, "left": {}}


def test_concave_zone_uses_point_in_polygon():
    ell = ((0.0, 0.0), (100.0, 0.0), (100.0, 40.0), (40.0, 40.0), (40.0, 100.0), (0.0, 100.0))
    rules = SceneRules((), (zone(points=ell),))
    assert walk(rules, [(70.0, 70.0)] * 3) == []  # inside the bounding box, outside the L
    assert [h.event for h in walk(rules, [(20.0, 70.0)] * 2, t0=1)] == ["zone_entered"]


def test_zone_cooldown_silences_starts_and_their_ends_only():
    rules = SceneRules((), (zone(cooldown_s=10.0, dwell_s=1.1),))
    # in at 0.0, out at 1.0 (its end is returned though within the cooldown), in again at 2.0 (silenced),
    # loitering from 3.2 (its own lifecycle: returned), out at 3.8
    path = [IN] * 5 + [OUT] * 5 + [IN] * 9 + [OUT] * 2
    hits = walk(rules, path)
    assert brief(hits) == [
        ("zone_entered", "start", "lawn", "t1", None, 0.2),
        ("zone_left", "end", "lawn", "t1", None, 1.2),
        ("loitering", "start", "lawn", "t1", None, 3.2),
        ("loitering", "end", "lawn", "t1", None, 4.0),  # paired with its start; the silent presence's end is not
    ]
    assert hits[-1].counts == {"inside": {"person": 0}, "entered": {"person": 2}, "left": {"person": 2}}
    assert_paired(hits)


def test_a_flickering_zone_track_yields_pairs_and_no_flood():
    rules = SceneRules((), (zone(cooldown_s=2.0),))
    hits = walk(rules, ([IN] * 2 + [OUT] * 2) * 25)  # in and out every 0.8 s for 20 s
    assert rules.counts()["zones"]["lawn"]["entered"] == {"person": 25}
    assert len(hits) <= 2 * (20 / 2.0 + 1)
    assert_paired(hits)


def assert_paired(hits: list[Hit]) -> None:
    """Per track, rule and lifecycle, returned starts and ends alternate, starting with a start."""
    open_ = set()
    for h in hits:
        key = (h.track_id, h.rule, "loitering" if h.event == "loitering" else "presence")
        if h.phase == "start":
            assert key not in open_, h
            open_.add(key)
        elif h.phase == "end":
            assert key in open_, h
            open_.remove(key)


def test_end_of_a_track_inside_a_zone_closes_its_lifecycles_and_drops_its_state():
    rules = SceneRules((line(*VERTICAL),), (zone(dwell_s=0.4),))
    walk(rules, [IN] * 4)
    assert rules.occupancy() == {"lawn": {"person": 1}} and rules.live_tracks == 1
    hits = rules.end(["t1", "never-seen"], 5.0)
    assert brief(hits) == [("loitering", "end", "lawn", "t1", None, 5.0), ("zone_left", "end", "lawn", "t1", None, 5.0)]
    assert hits[0].extra == {"dwell_s": 5.0} and hits[0].box == box_at(*IN)
    assert rules.occupancy() == {"lawn": {"person": 0}} and rules.live_tracks == 0
    assert rules.end(["t1"], 6.0) == []  # already ended


def test_ended_tracks_state_is_dropped_and_rows_reused():
    rules = SceneRules((line(*VERTICAL),), (zone(),))
    walk(rules, [(120, 100)])
    rules.end(["t1"], 0.2)
    # the same id again, now left of the line: with t1's old state the step 120 -> 80 would be a crossing
    assert walk(rules, [(80, 100), (80, 100)], t0=1.0) == []
    rules.end(["t1"], 1.2)
    for i in range(2000):  # a long run: many tracks come and go, a few dozen at a time
        ts = 2.0 + i * DT
        rules.update(ts, [TrackPoint(f"n{i}-{k}", "person", box_at(20 + k, 50)) for k in range(30)])
        rules.end([f"n{i - 1}-{k}" for k in range(30)], ts)
    assert rules.live_tracks == 30
    assert len(rules.lines.state.side) <= 64 and len(rules.zones.state.inside) <= 64  # rows reused


def test_stale_tracks_are_ended_by_update():
    rules = SceneRules((), (zone(),), stale_after_s=5.0)
    walk(rules, [IN, IN])
    assert rules.update(3.0, []) == []
    hits = rules.update(5.3, [TrackPoint("t2", "person", box_at(*OUT))])
    assert brief(hits) == [("zone_left", "end", "lawn", "t1", None, 5.3)]
    assert rules.live_tracks == 1


def test_counts_and_occupancy_by_class():
    rules = SceneRules((line(*VERTICAL),), (zone(),))
    people = [("p1", "person"), ("p2", "person"), ("c1", "car")]
    for i in range(3):  # all walk right to left across the line (in), ending in the zone (x 0..100)
        x = 130 - 40 * i
        rules.update(i * DT, [TrackPoint(tid, cls, box_at(x, 50)) for tid, cls in people])
    rules.update(1.0, [TrackPoint("c1", "car", box_at(200, 50)), TrackPoint("p1", "person", box_at(50, 50))])
    rules.update(1.2, [TrackPoint("c1", "car", box_at(200, 50))])
    assert rules.counts() == {
        "lines": {"door": {"in": {"person": 2, "car": 1}, "out": {"car": 1}}},
        "zones": {"lawn": {"inside": {"person": 2, "car": 0}, "entered": {"person": 2, "car": 1},
                           "left": {"car": 1}}}}
    assert rules.occupancy() == {"lawn": {"person": 2, "car": 0}}


def test_a_class_change_inside_a_zone_leaves_with_the_class_it_entered_with():
    rules = SceneRules((), (zone(),))
    walk(rules, [IN, IN], cls="truck")
    hits = walk(rules, [OUT, OUT], cls="car", t0=1)
    assert [(h.event, h.cls) for h in hits] == [("zone_left", "truck")]
    assert rules.occupancy() == {"lawn": {"truck": 0}}


# ---------------------------------------------------------------- many tracks against a plain reference


class Reference:
    """The rules written plainly, one track and rule at a time, without cooldown (every hit returned)."""

    def __init__(self, lines, zones, confirm=2):
        self.lines, self.zones, self.confirm = lines, zones, confirm
        self.state: dict = {}

    @staticmethod
    def s(ln: LineConfig, p) -> float:
        (x1, y1), (x2, y2) = ln.points
        return (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1)

    @staticmethod
    def inside(points, p) -> bool:
        n, hit = len(points), False
        for i in range(n):
            (ax, ay), (bx, by) = points[i], points[(i + 1) % n]
            if (ay > p[1]) != (by > p[1]) and p[0] < ax + (p[1] - ay) * (bx - ax) / (by - ay):
                hit = not hit
        return hit

    def update(self, ts, tracks):
        out = []
        for t in tracks:
            st = self.state.setdefault(t.track_id, {"prev": None, "lines": {}, "zones": {}})
            for ln in self.lines:
                side, through = st["lines"].get(ln.name, (0, False))
                s = self.s(ln, t.foot)
                if st["prev"] is not None and self.s(ln, st["prev"]) * s <= 0 and (s or self.s(ln, st["prev"])):
                    through |= segments_intersect(st["prev"], t.foot, *ln.points)
                length = math.dist(*ln.points)
                if s != 0 and abs(s) / length >= ln.min_distance_px:
                    now = 1 if s > 0 else -1
                    if side and now != side and through:
                        out.append(("line_crossed", ln.name, t.track_id, "in" if now > 0 else "out", ts))
                    side, through = now, False
                st["lines"][ln.name] = (side, through)
            for z in self.zones:
                inside, streak = st["zones"].get(z.name, (False, 0))
                streak = streak + 1 if self.inside(z.points, t.foot) != inside else 0
                if streak >= self.confirm:
                    inside, streak = not inside, 0
                    out.append(("zone_entered" if inside else "zone_left", z.name, t.track_id, None, ts))
                st["zones"][z.name] = (inside, streak)
            st["prev"] = t.foot
        return out


def test_many_random_tracks_match_the_plain_reference():
    rng = random.Random(7)
    lines = (LineConfig("a", ((100.0, 50.0), (500.0, 400.0)), 6.0, 0.0),
             LineConfig("b", ((300.0, 0.0), (300.0, 480.0)), 8.0, 0.0),
             LineConfig("c", ((600.0, 240.0), (50.0, 240.0)), 0.0, 0.0))
    zones = (ZoneConfig("box", ((200.0, 100.0), (450.0, 100.0), (450.0, 380.0), (200.0, 380.0)), 0.0, 0.0),
             ZoneConfig("ell", ((0.0, 0.0), (250.0, 0.0), (250.0, 120.0), (120.0, 120.0), (120.0, 480.0),
                                (0.0, 480.0)), 0.0, 0.0))
    rules, ref = SceneRules(lines, zones), Reference(lines, zones)
    pos = {f"r{k}": [rng.uniform(0, 640), rng.uniform(0, 480)] for k in range(40)}
    got, want = [], []
    for f in range(300):
        ts = f * DT
        tracks = []
        for tid, p in pos.items():
            if rng.random() < 0.1:
                continue  # missed in this frame: the next step starts from where it was last seen
            p[0] = min(640, max(0, p[0] + rng.gauss(0, 12)))
            p[1] = min(480, max(0, p[1] + rng.gauss(0, 12)))
            tracks.append(TrackPoint(tid, "person", box_at(*p)))
        got += [(h.event, h.rule, h.track_id, h.direction, h.ts) for h in rules.update(ts, tracks)]
        want += ref.update(ts, tracks)
    assert len(want) > 200  # the walk really crosses things
    assert sorted(got, key=str) == sorted(want, key=str)


def test_a_box_with_nan_neither_crashes_nor_counts():
    rules = SceneRules((line(*VERTICAL),), (zone(),))
    nan = float("nan")
    hits = rules.update(0.0, [TrackPoint("t1", "person", (nan, nan, nan, nan))])
    hits += walk(rules, [(120, 50), (80, 50), (50, 50), (50, 50)], t0=0.2)
    assert [h.event for h in hits] == ["line_crossed", "zone_entered"]
