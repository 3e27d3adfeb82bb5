"""vlora_va/serving/prometheus.py: every event counted once, and series bounded whatever stream ids senders invent."""

from prometheus_client import generate_latest

from vlora_va.contracts.events import EventRecord
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import ResultRecord
from vlora_va.serving.prometheus import MAX_STREAM_LABELS, OTHER_STREAMS, DaemonMetrics


def req(stream):
    return Request(stream, 0, "t", "a", [], [0.0], Letterbox(1, 0, 0), (1, 1), 0.0, 0.0, 1.0)


def test_stream_series_are_bounded_and_counts_are_not_lost():
    m = DaemonMetrics()
    n = MAX_STREAM_LABELS + 500
    for i in range(n):
        m.chunk(f"s{i}", 1, 0)
        rec = ResultRecord.not_served(req(f"s{i}"), "shed", "late", 2.0)
        m.row(rec.stream, rec.task, rec.status, rec.deadline_met, rec.latency.total_s, "deadline")
    text = generate_latest(m.registry).decode()
    chunk_lines = [line for line in text.splitlines() if line.startswith("vlora_chunks_received_total{")]
    assert len(chunk_lines) == MAX_STREAM_LABELS + 1  # the first streams, then one shared series
    assert f'vlora_chunks_received_total{{stream="{OTHER_STREAMS}"}} 500.0' in text
    assert m.totals.chunks == m.totals.shed == n  # totals count everything
    assert len(m.totals.shed_by) == MAX_STREAM_LABELS + 1 and m.totals.shed_by[(OTHER_STREAMS, OTHER_STREAMS)] == 500


# ---------------------------------------------------------------- event rows: lines, zones, events, tracks
def event(n, name, stream="cam", **kw):
    return EventRecord(id=f"run-{n}", event=name, stream=stream, ts=float(n), captured_at=1_800_000_000.0 + n, **kw)


def value(m, name, **labels):
    return m.registry.get_sample_value(name, labels)


def line_counts(in_person=0, out_person=0, in_car=0):
    return {"in": {"person": in_person, **({"car": in_car} if in_car else {})}, "out": {"person": out_person}}


def test_line_crossings_follow_the_lines_running_totals():
    """The counters equal the line's totals, also when a cooldown held an event back (the totals jump by 2), an
    event came without totals (it counts itself, once), or the totals started again (counts_since changed)."""
    m = DaemonMetrics()
    since = 1_800_000_000.0
    result = ResultRecord.not_served(req("cam"), "shed", "late", 2.0)
    line = {"line": "path", "task": "detect", "track_id": "run-7"}
    m.events([result, event(1, "line_crossed", direction="in", cls="person", counts=line_counts(1), counts_since=since,
                            **line)])
    m.events([event(2, "line_crossed", direction="in", cls="person", counts=line_counts(3), counts_since=since, **line),
              event(3, "line_crossed", direction="out", cls="person", **line)])  # no totals: counts itself
    m.events([event(4, "line_crossed", direction="in", cls="car", counts=line_counts(3, 1, in_car=1),
                    counts_since=since, **line)])  # the out crossing above is in these totals: not twice
    c = "vlora_line_crossings_total"
    assert value(m, c, stream="cam", line="path", direction="in", **{"class": "person"}) == 3
    assert value(m, c, stream="cam", line="path", direction="out", **{"class": "person"}) == 1
    assert value(m, c, stream="cam", line="path", direction="in", **{"class": "car"}) == 1
    m.events([event(5, "line_crossed", direction="in", cls="person", counts=line_counts(1), counts_since=since + 60,
                    **line)])  # totals since a new start: 1 more crossing, not a drop from 3 to 1
    assert value(m, c, stream="cam", line="path", direction="in", **{"class": "person"}) == 4
    assert value(m, "vlora_events_total", stream="cam", event="line_crossed") == 5
    assert m.totals.events == 5  # the result row in the list was not counted


def test_zone_occupancy_is_the_zones_inside_totals_and_a_class_that_left_is_zero():
    m = DaemonMetrics()
    zone = {"zone": "lawn", "task": "detect"}
    m.events([event(1, "zone_entered", phase="start", cls="person", counts={
        "inside": {"person": 2, "car": 1}, "entered": {"person": 2, "car": 1}, "left": {}}, **zone)])
    g = "vlora_zone_occupancy"
    assert value(m, g, stream="cam", zone="lawn", **{"class": "person"}) == 2
    assert value(m, g, stream="cam", zone="lawn", **{"class": "car"}) == 1
    m.events([event(2, "zone_left", phase="end", cls="car", counts={
        "inside": {"person": 1}, "entered": {"person": 2, "car": 1}, "left": {"person": 1, "car": 1}}, **zone)])
    assert value(m, g, stream="cam", zone="lawn", **{"class": "person"}) == 1
    assert value(m, g, stream="cam", zone="lawn", **{"class": "car"}) == 0
    assert value(m, "vlora_events_total", stream="cam", event="zone_left") == 1


def test_every_event_name_is_counted_known_or_not_and_tracks_active_is_set():
    m = DaemonMetrics()
    m.events([event(1, "stream_offline", phase="start"), event(2, "stream_online", phase="end"),
              event(3, "stream_moved"), event(4, "stream_moved", stream="gate")])  # a name from a later version
    assert value(m, "vlora_events_total", stream="cam", event="stream_offline") == 1
    assert value(m, "vlora_events_total", stream="cam", event="stream_moved") == 1
    assert value(m, "vlora_events_total", stream="gate", event="stream_moved") == 1
    m.tracks_active("cam", 7)
    m.tracks_active("cam", 4)
    assert value(m, "vlora_tracks_active", stream="cam") == 4


def test_scene_series_text_has_help_type_and_escaped_labels():
    m = DaemonMetrics()
    m.events([event(1, "line_crossed", line="path", direction="in", cls='tuk "tuk"\\',
                    counts={"in": {'tuk "tuk"\\': 1}, "out": {}}, counts_since=0.0)])
    m.events([event(2, "zone_entered", zone="lawn", cls="person", counts={"inside": {"person": 1}})])
    m.tracks_active("cam", 1)
    text = generate_latest(m.registry).decode()
    for name, kind in (("vlora_line_crossings_total", "counter"), ("vlora_events_total", "counter"),
                       ("vlora_zone_occupancy", "gauge"), ("vlora_tracks_active", "gauge")):
        assert f"# TYPE {name} {kind}\n" in text and f"# HELP {name} " in text
    assert ('vlora_line_crossings_total{class="tuk \\"tuk\\"\\\\",direction="in",line="path",stream="cam"} 1.0'
            in text)
    assert 'vlora_zone_occupancy{class="person",stream="cam",zone="lawn"} 1.0' in text


def test_event_streams_share_the_bounded_labels():
    m = DaemonMetrics()
    for i in range(MAX_STREAM_LABELS + 3):
        m.events([event(i, "stream_offline", stream=f"s{i}", phase="start")])
        m.tracks_active(f"s{i}", 1)
    assert value(m, "vlora_events_total", stream=OTHER_STREAMS, event="stream_offline") == 3
    assert value(m, "vlora_tracks_active", stream=OTHER_STREAMS) == 1
