"""vlora_va.contracts.scene through parse_config: a stream's lines and zones, their checks, and every error collected
with its key path and line."""

import textwrap

import pytest

from vlora_va.contracts.config import ConfigError, parse_config
from vlora_va.contracts.scene import LineConfig, ZoneConfig, polygon_problem

SCENE = textwrap.dedent("""\
    adapters: {detect: a/detect}
    streams:
      - id: cam1
        source: a.mp4
        tasks:
          - {name: det, adapter: detect, track: true}
        lines:
          - {name: path, points: [[10, 20], [300, 20]], min_distance_px: 5, cooldown_s: 1}
          - {name: gate, points: [[0, 0], [0, 100]]}
        zones:
          - {name: lawn, points: [[0, 0], [100, 0], [100, 100], [0, 100]], dwell_s: 10}
    """)


def _error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "p.yaml")
    return err.value


def test_lines_and_zones_parse_with_defaults():
    (cam,) = parse_config(SCENE, "p.yaml").streams
    assert cam.lines == (LineConfig("path", ((10.0, 20.0), (300.0, 20.0)), 5.0, 1.0),
                         LineConfig("gate", ((0.0, 0.0), (0.0, 100.0)), 8.0, 2.0))
    assert cam.zones == (ZoneConfig("lawn", ((0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0)), 10.0, 2.0),)
    assert [t.name for t in cam.tracked_tasks] == ["det"]


def test_a_stream_without_lines_or_zones_needs_no_tracked_task():
    text = SCENE.split("    lines:\n")[0].replace(", track: true", "")
    (cam,) = parse_config(text, "p.yaml").streams
    assert (cam.lines, cam.zones, cam.tracked_tasks) == ((), (), ())


BOW_TIE = "[[0, 0], [100, 100], [100, 0], [0, 100]]"  # edges 0 and 2 cross


@pytest.mark.parametrize("old, new, line, message", [
    ("[[0, 0], [100, 0], [100, 100], [0, 100]]", BOW_TIE, 11,
     ("streams[0].zones[0].points: edge 0 ((0.0, 0.0) to (100.0, 100.0)) crosses edge 2 ((100.0, 0.0) to "
      "(0.0, 100.0)): not a simple polygon")),
    ("[[0, 0], [100, 0], [100, 100], [0, 100]]", "[[0, 0], [100, 0]]", 11,
     "streams[0].zones[0].points: a zone needs at least 3 points, got 2"),
    ("[[0, 0], [100, 0], [100, 100], [0, 100]]", "[[0, 0], [50, 50], [100, 100]]", 11,
     "streams[0].zones[0].points: the points enclose no area"),
    ("name: gate", "name: path", 9, "streams[0].lines[1].name: duplicate line name 'path' in this stream"),
    ("[[0, 0], [0, 100]]", "[[0, 0], [0, 100], [50, 50]]", 9,
     "streams[0].lines[1].points: a line is two different points [[x1, y1], [x2, y2]], got 3 point(s)"),
    ("[[0, 0], [0, 100]]", "[[5, 5], [5, 5]]", 9, "streams[0].lines[1].points: a line's two points are the same"),
    ("[[0, 0], [0, 100]]", "[[0, 0], [0, x]]", 9, "streams[0].lines[1].points[1]: expected two numbers (pixels)"),
    ("[[0, 0], [0, 100]]", "[0, 100]", 9, "streams[0].lines[1].points: expected a list of [x, y] points"),
    ("name: gate", "name: 'a gate'", 9, "streams[0].lines[1].name: must be 1-64 characters"),
    ("min_distance_px: 5", "min_distance_px: -1", 8, "streams[0].lines[0].min_distance_px: must be >= 0"),
    ("dwell_s: 10", "dwell: 10", 11, "streams[0].zones[0].dwell: unknown key (allowed: cooldown_s, dwell_s, name,"),
    (", track: true", "", 7,
     "streams[0].lines: lines and zones count tracks: give one of this stream's tasks `track: true`"),
    (", track: true", ", track: yes please", 6, "streams[0].tasks[0].track: expected bool, got str"),
])
def test_scene_errors_name_key_path_and_line(old, new, line, message):
    assert old in SCENE
    err = _error(SCENE.replace(old, new, 1))
    assert str(err).startswith(f"p.yaml:{line}: {message}"), str(err)


def test_zones_without_a_tracked_task_name_the_zones():
    text = SCENE.replace(", track: true", "").replace(SCENE[SCENE.index("    lines:"):SCENE.index("    zones:")], "")
    assert _error(text).key_path == "streams[0].zones"


def test_a_line_and_a_zone_may_share_a_name():
    """Lines and zones are apart everywhere they are named (an event's "line" or "zone" key, MQTT's
    .../lines/<name> and .../zones/<name>), so only names of the same kind must differ."""
    (cam,) = parse_config(SCENE.replace("name: lawn", "name: path"), "p.yaml").streams
    assert cam.lines[0].name == cam.zones[0].name == "path"


def test_a_broken_tracked_task_is_not_also_reported_as_missing():
    err = _error(SCENE.replace("adapter: detect,", "adapter: detekt,"))
    assert [e.key_path for e in err.errors] == ["streams[0].tasks[0].adapter"], str(err)


def test_every_scene_error_is_collected_with_its_key_path():
    """Broken lines and zones do not hide that nothing tracks: each problem is reported, in file order."""
    text = (SCENE.replace("[[0, 0], [100, 0], [100, 100], [0, 100]]", BOW_TIE)
            .replace("name: gate", "name: path")
            .replace("[[10, 20], [300, 20]]", "[[10, 20], [300, 20], [5, 5]]")
            .replace("cooldown_s: 1", "cooldown_s: soon")
            .replace(", track: true", ""))
    err = _error(text)
    assert [(e.key_path, e.line) for e in err.errors] == [
        ("streams[0].lines", 7),
        ("streams[0].lines[0].points", 8),
        ("streams[0].lines[0].cooldown_s", 8),
        ("streams[0].lines[1].name", 9),
        ("streams[0].zones[0].points", 11),
    ], str(err)


@pytest.mark.parametrize("points, problem", [
    (((0, 0), (100, 0), (100, 40), (40, 40), (40, 100), (0, 100)), None),  # concave (an L) is simple
    (((0, 0), (100, 0), (0, 100), (100, 100)), "edge 1 ((100, 0) to (0, 100)) crosses edge 3"),
    (((0, 0), (100, 0), (100, 100), (50, 0), (0, 100)), "crosses"),  # a vertex touching another edge
])
def test_polygon_problem(points, problem):
    got = polygon_problem(points)
    assert got is None if problem is None else problem in got
