"""The daemon's analytics (vlora_va/analytics/pipeline.py): tracked rows in chunk order with track ids, line and zone
events, snapshots, and streams going offline and coming back."""

import dataclasses
import json

import cv2
import numpy as np
import pytest

from vlora_va.analytics.liveness import Liveness
from vlora_va.analytics.order import ChunkOrder
from vlora_va.analytics.pipeline import Analytics, new_run_id
from vlora_va.contracts.config import DaemonConfig, IngestConfig, PipelineConfig, StreamConfig, TaskConfig
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections, Latency, ResultRecord
from vlora_va.contracts.scene import LineConfig, SnapshotConfig, ZoneConfig

# A vertical line drawn top to bottom at x = 300: walking right to left is `in`.
LINE = LineConfig("path", ((300.0, 100.0), (300.0, 400.0)), min_distance_px=8.0, cooldown_s=0.0)
ZONE = ZoneConfig("lawn", ((0.0, 0.0), (200.0, 0.0), (200.0, 500.0), (0.0, 500.0)), dwell_s=0.0, cooldown_s=0.0)


def config(tmp_path, snapshots=False, offline_after_s=10.0) -> PipelineConfig:
    tasks = (TaskConfig("detect", "detect", 2, 2000.0, track=True), TaskConfig("activity", "actions", 8, 3000.0))
    stream = StreamConfig(id="cam", source="x.mp4", fps=10.0, tasks=tasks, lines=(LINE,), zones=(ZONE,),
                          snapshots=snapshots, offline_after_s=offline_after_s)
    return PipelineConfig(daemon=DaemonConfig(), ingest=IngestConfig(), adapters={}, streams=(stream,), sinks=(),
                          snapshots=SnapshotConfig(dir=str(tmp_path / "snaps")))


def walker_x(t: float) -> float:
    """Walks right to left at 40 px/s from x = 420: crosses x = 300 near t = 3 s, enters the zone (x < 200) near
    t = 5.5 s."""
    return 420.0 - 40.0 * t


def box(t: float) -> tuple:
    x = walker_x(t)
    return (x - 15, 250.0, x + 15, 330.0)


def row(seq: int, status: str = "ok", task: str = "detect") -> ResultRecord:
    ts = (seq + 0.0, seq + 0.5)
    if status != "ok":
        return ResultRecord(stream="cam", chunk=seq, task=task, adapter="detect", status=status, frame_ts=ts,
                            latency=Latency(), deadline_ms=2000.0, deadline_met=False, reason="shed for the test",
                            captured_at=1000.0 + seq)
    result = DetectionResult(tuple(FrameDetections(t, (Detection(box(t), "person", 0.8),)) for t in ts))
    return ResultRecord(stream="cam", chunk=seq, task=task, adapter="detect", status="ok", frame_ts=ts,
                        latency=Latency(), deadline_ms=2000.0, deadline_met=True, result=result,
                        captured_at=1000.0 + seq)


def request_with_jpegs(seq: int, jpeg: bytes) -> Request:
    """The request of chunk seq as the daemon holds it: ingest's JPEG of each tracked frame (768 x 576)."""
    return Request(stream="cam", seq=seq, task="detect", adapter="detect", frames=[], frame_ts=[seq, seq + 0.5],
                   letterbox=Letterbox(1.0, 0.0, 0.0), orig_size=(768, 576), ready=0.0, received=0.0, deadline=1.0,
                   jpegs={seq + 0.0: jpeg, seq + 0.5: jpeg})


def track_ids(rec: ResultRecord) -> set:
    return {d.track_id for f in rec.result.frames for d in f.detections if d.track_id}


def test_chunk_order_holds_a_row_until_the_rows_before_it_have_left():
    order = ChunkOrder()
    for seq in (3, 4, 5):
        order.expect(seq)
    assert order.done(4, "r4") == [] and len(order) == 1
    assert order.done(3, "r3") == ["r3", "r4"]
    assert order.done(5, "r5") == ["r5"]
    assert order.done(9, "r9") == ["r9"]  # never announced: leaves at once, in its place


def test_tracked_rows_leave_in_chunk_order_whatever_order_batches_finish_in(tmp_path):
    analytics = Analytics(config(tmp_path), run_id="run")
    for seq in range(4):
        analytics.order["cam", "detect"].expect(seq)
    out = analytics.rows([(row(1), None, None), (row(3), None, None)])
    assert out == []  # chunk 0 is not answered yet
    out = analytics.rows([(row(0), None, None)])
    assert [r.chunk for r, _, _ in out if r.type == "result"] == [0, 1]
    out = analytics.rows([(row(2), None, None)])
    assert [r.chunk for r, _, _ in out if r.type == "result"] == [2, 3]
    # an untracked task's rows pass at once
    assert analytics.rows([(row(7, task="activity"), None, None)])[0][0].chunk == 7


def test_a_walker_crossing_the_line_and_entering_the_zone_makes_events_with_counts(tmp_path):
    analytics = Analytics(config(tmp_path), run_id="run")
    written = []
    for seq in range(8):
        written += analytics.rows([(row(seq), None, None)])
    events = [r.to_json() for r, _, _ in written if r.type == "event"]
    results = [r for r, _, _ in written if r.type == "result"]
    ids = set().union(*(track_ids(r) for r in results))
    assert len(ids) == 1 and ids.pop().startswith("run-t")
    assert [(e["event"], e.get("line") or e.get("zone"), e.get("direction")) for e in events] == [
        ("line_crossed", "path", "in"), ("zone_entered", "lawn", None)]
    crossed, entered = events
    assert crossed["counts"] == {"in": {"person": 1}, "out": {}} and crossed["class"] == "person"
    assert 2.5 <= crossed["ts"] <= 3.5 and crossed["chunk"] in (2, 3) and crossed["snapshot"] is None
    assert entered["phase"] == "start" and entered["counts"]["inside"] == {"person": 1}
    assert len({e["id"] for e in events}) == 2 and all(e["id"].startswith("run-") for e in events)
    json.dumps(events)  # every event row is JSON


def test_a_shed_chunk_in_the_middle_does_not_split_the_track_or_lose_the_crossing(tmp_path):
    analytics = Analytics(config(tmp_path), run_id="run")
    written = []
    for seq in range(8):
        written += analytics.rows([(row(seq, status="shed" if seq == 3 else "ok"), None, None)])
    results = [r for r, _, _ in written if r.type == "result"]
    assert [r.status for r in results].count("shed") == 1
    assert len(set().union(*(track_ids(r) for r in results if r.status == "ok"))) == 1
    assert [r.event for r, _, _ in written if r.type == "event"] == ["line_crossed", "zone_entered"]


def test_an_event_stores_a_snapshot_of_its_frame_with_the_box_drawn(tmp_path):
    analytics = Analytics(config(tmp_path, snapshots=True), run_id="run")
    frame = np.full((576, 768, 3), 90, np.uint8)
    jpeg = cv2.imencode(".jpg", frame)[1].tobytes()
    written = []
    for seq in range(5):
        written += analytics.rows([(row(seq), None, request_with_jpegs(seq, jpeg))])
    event = next(r for r, _, _ in written if r.type == "event")
    image = cv2.imread(event.snapshot)
    assert image.shape == (576, 768, 3)
    x1, y1, x2, y2 = (int(v) for v in event.box)
    assert abs(int(image[y1, (x1 + x2) // 2, 2]) - 90) > 60  # the box's edge is drawn (orange), not the grey
    assert abs(int(image[(y1 + y2) // 2, (x1 + x2) // 2, 2]) - 90) < 10  # its inside is left as it was


def test_offline_after_no_frames_online_again_and_ended_files_are_not_offline():
    live = Liveness({"cam": 1.0, "file": 1.0})
    live.heard("cam", "live", 0.1, received=100.0)
    live.heard("file", "live", 0.1, received=100.0)
    assert live.changes(100.5) == []  # online from the start is not news
    live.heard("cam", "live", 1.5, received=101.5)  # ingest still talks, the camera delivers nothing
    live.heard("file", "ended", 1.5, received=101.5)
    assert live.changes(101.5) == [("cam", False, 100.0)]  # its last frame: 101.5 - 1.5
    assert live.changes(102.0) == []  # said once
    live.heard("cam", "live", 0.0, received=103.0)
    assert live.changes(103.0) == [("cam", True, 103.0)]
    assert live.changes(120.0) == [("cam", False, 103.0)]  # ingest itself went silent: its last word ages


def test_a_stream_going_offline_is_an_event_and_ends_its_tracks_zone_presences(tmp_path):
    analytics = Analytics(config(tmp_path, offline_after_s=1.0), run_id="run")
    for seq in range(8):
        analytics.rows([(row(seq), None, None)])
        analytics.frames("cam", 1000.0 + seq, seq + 0.5)
    analytics.heard("cam", "live", 0.2, received=1007.5)
    assert analytics.tick(1007.6) == []
    events = [e.to_json() for e in analytics.tick(1009.0)]
    assert [(e["event"], e.get("phase")) for e in events] == [("stream_offline", "start"), ("zone_left", "end")]
    assert events[0]["ts"] == 7.5 and analytics.tracks_active() == {"cam": 0}
    analytics.heard("cam", "live", 0.0, received=1010.0)
    assert [e.event for e in analytics.tick(1010.0)] == ["stream_online"]


def test_run_ids_differ():
    assert len({new_run_id() for _ in range(50)}) == 50


@pytest.mark.parametrize("bad", [b"", b"not a jpeg"])
def test_a_broken_snapshot_is_counted_and_the_event_still_goes_out(tmp_path, bad):
    analytics = Analytics(config(tmp_path, snapshots=True), run_id="run")
    written = []
    for seq in range(5):
        written += analytics.rows([(row(seq), None, request_with_jpegs(seq, bad))])
    events = [r for r, _, _ in written if r.type == "event"]
    assert events and all(e.snapshot is None for e in events) and analytics.snapshots.failed == len(events)


def test_when_the_daemon_stops_every_open_zone_presence_ends(tmp_path):
    analytics = Analytics(config(tmp_path), run_id="run")
    for seq in range(8):
        analytics.rows([(row(seq), None, None)])
        analytics.frames("cam", 1000.0 + seq, seq + 0.5)
    ended = [e.to_json() for e in analytics.end()]
    assert [(e["event"], e["phase"], e["zone"]) for e in ended] == [("zone_left", "end", "lawn")]
    assert ended[0]["counts"]["inside"] == {"person": 0} and analytics.tracks_active() == {"cam": 0}
    assert analytics.end() == []  # said once
    # event rows of a tracked task pass through as they are (the daemon writes these through the same path)
    written = analytics.rows([(ev, None, None) for ev in ended_records(tmp_path)])
    assert [r.event for r, _, _ in written] == ["zone_left"]


def ended_records(tmp_path):
    other = Analytics(config(tmp_path), run_id="other")
    for seq in range(8):
        other.rows([(row(seq), None, None)])
    return other.end()


def test_time_the_daemon_was_not_reading_does_not_make_a_stream_offline():
    """Under backpressure the daemon reads nothing, heartbeats included: that silence is the daemon's, not the
    camera's."""
    live = Liveness({"cam": 1.0})
    live.heard("cam", "live", 0.0, received=100.0)
    live.deaf(True, 100.2)
    assert live.changes(105.0) == []  # 5 s without a word, but the daemon was not listening
    live.deaf(False, 105.0)
    assert live.changes(105.5) == []  # the 4.8 s deaf do not count: 0.7 s since the last frame
    assert live.changes(106.3) == [("cam", False, 104.8)]  # a real second of silence after that does


def test_a_row_the_tracker_chokes_on_goes_out_untracked_and_serving_goes_on(tmp_path, caplog):
    analytics = Analytics(config(tmp_path), run_id="run")
    bad = row(0)
    broken = DetectionResult((FrameDetections(0.0, (Detection((1.0, 2.0, 3.0), "person", 0.8),)),))  # 3 corners
    bad = ResultRecord(**{**bad.__dict__, "result": broken})
    with caplog.at_level("ERROR"):
        out = analytics.rows([(bad, None, None)])
    assert [r for r, _, _ in out] == [bad] and analytics.failures == 1
    assert "tracking failed" in caplog.text
    assert analytics.rows([(row(1), None, None)])[0][0].chunk == 1  # the next row is tracked as usual


def test_the_snapshot_store_keeps_within_its_size_and_age_and_adopts_an_earlier_runs_files(tmp_path):
    import os

    from vlora_va.analytics.snapshots import SnapshotStore
    jpeg = cv2.imencode(".jpg", np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8))[1]
    probe = SnapshotStore(SnapshotConfig(dir=str(tmp_path / "probe"))).save("p", jpeg.tobytes(), None, (160, 120))
    size = os.path.getsize(probe)  # what one snapshot of it takes, as the store writes it
    cfg = SnapshotConfig(dir=str(tmp_path / "s"), max_mb=3.5 * size / 1e6, max_age_s=100.0)
    store = SnapshotStore(cfg)
    paths = [store.save(f"e{i}", jpeg.tobytes(), None, (160, 120)) for i in range(5)]
    kept = sorted(p.name for p in (tmp_path / "s").glob("*.jpg"))
    assert kept == ["e2.jpg", "e3.jpg", "e4.jpg"] and all(paths)  # over 3.5 files' worth: the oldest went
    os.utime(tmp_path / "s" / "e2.jpg", (0, 0))  # an old file, as an earlier run left it
    again = SnapshotStore(cfg)  # a restarted daemon counts what is there
    again.prune()
    assert sorted(p.name for p in (tmp_path / "s").glob("*.jpg")) == ["e3.jpg", "e4.jpg"]


# ---------------------------------------------------------------- a stream moved to another daemon (cluster mode)

def two_streams(tmp_path, offline_after_s=1.0) -> PipelineConfig:
    """config() with a second stream, "yard", like "cam"."""
    cam = config(tmp_path, offline_after_s=offline_after_s).streams[0]
    return PipelineConfig(daemon=DaemonConfig(), ingest=IngestConfig(), adapters={},
                          streams=(cam, dataclasses.replace(cam, id="yard")), sinks=())


def yard(rec: ResultRecord) -> ResultRecord:
    return dataclasses.replace(rec, stream="yard")


def test_chunk_order_flush_gives_every_held_row_in_chunk_order_and_starts_afresh():
    order = ChunkOrder()
    for seq in (3, 4, 5, 6):
        order.expect(seq)
    assert order.done(6, "r6") == [] and order.done(5, "r5") == []  # chunks 3 and 4 not answered
    assert order.flush() == ["r5", "r6"] and len(order) == 0
    assert order.done(4, "r4") == ["r4"]  # nothing is expected any more: a late row leaves at once
    assert order.flush() == []


def test_a_released_stream_flushes_its_held_rows_ends_its_tracks_and_starts_fresh_ones(tmp_path):
    analytics = Analytics(config(tmp_path), run_id="run")
    written = []
    for seq in range(8):  # chunks arrive in order; the walker crosses the line, then enters the zone
        analytics.order["cam", "detect"].expect(seq)
        analytics.frames("cam", 1000.0 + seq, seq + 0.5)
    for seq in (0, 1, 2, 3, 5, 7, 6):  # their rows do not: chunk 4 is not answered yet, rows 5 to 7 wait for it
        written += analytics.rows([(row(seq), None, None)])
    assert [r.chunk for r, _, _ in written if r.type == "result"] == [0, 1, 2, 3]
    assert analytics.held() == 3 and analytics.tracks_active() == {"cam": 1}
    out = analytics.release("cam")
    results = [r for r, _, _ in out if r.type == "result"]
    events = [r.to_json() for r, _, _ in out if r.type == "event"]
    assert [r.chunk for r in results] == [5, 6, 7]  # the held rows, in chunk order, tracked, out now
    old = set().union(*(track_ids(r) for r, _, _ in written if r.type == "result"))
    assert len(old) == 1 and all(track_ids(r) == old for r in results)
    # the walker entered the zone near 5.5 s: its track ends with the move, and so does its presence
    assert [(e["event"], e.get("phase"), e.get("zone")) for e in events] == [("zone_entered", "start", "lawn"),
                                                                            ("zone_left", "end", "lawn")]
    assert events[-1]["ts"] == 7.5 and events[-1]["counts"]["inside"] == {"person": 0}
    assert analytics.held() == 0 and analytics.tracks_active() == {"cam": 0}
    # the stream comes back (moved here again) and a second walker comes by: its rows leave at once (nothing is
    # expected), on a new track, and the rules count afresh (a new epoch of counts: the collector adds them up)
    back = []
    for seq in range(10, 18):
        back += analytics.rows([(later(seq, shift=10), None, None)])
    again = [r for r, _, _ in back if r.type == "result"]
    assert [r.chunk for r in again] == list(range(10, 18))
    new_ids = set().union(*(track_ids(r) for r in again))
    assert len(new_ids) == 1 and new_ids.isdisjoint(old)
    crossed = next(r.to_json() for r, _, _ in back if r.type == "event" and r.event == "line_crossed")
    first = next(r.to_json() for r, _, _ in written if r.type == "event" and r.event == "line_crossed")
    assert crossed["counts"]["in"] == {"person": 1} and crossed["counts_since"] >= first["counts_since"]


def later(seq: int, shift: int) -> ResultRecord:
    """row(seq - shift) as chunk seq, `shift` seconds of media later: the walker walks by again."""
    rec = row(seq - shift)
    frames = tuple(FrameDetections(f.ts + shift, f.detections) for f in rec.result.frames)
    return dataclasses.replace(rec, chunk=seq, frame_ts=tuple(t + shift for t in rec.frame_ts),
                               result=DetectionResult(frames))


def test_after_release_a_late_chunk_never_makes_the_stream_offline_until_a_heartbeat_arms_it(tmp_path):
    analytics = Analytics(config(tmp_path, offline_after_s=1.0), run_id="run")
    for seq in range(3):
        analytics.rows([(row(seq), None, None)])
        analytics.frames("cam", 1000.0 + seq, seq + 0.5)
    analytics.heard("cam", "live", 0.1, received=1002.5)
    assert analytics.tick(1002.5) == [] and analytics.liveness.online("cam") is True
    analytics.release("cam")
    analytics.frames("cam", 1003.0, 3.5)  # a chunk that was on its way when the stream moved
    assert analytics.tick(1010.0) == [] and analytics.tick(1100.0) == []  # its silence is no outage here
    assert analytics.liveness.online("cam") is None
    analytics.heard("cam", "live", 0.0, received=1100.0)  # moved back here: ingest speaks again
    assert analytics.tick(1100.0) == []  # online from its (new) start is not news
    analytics.frames("cam", 1101.0, 4.5)  # ... and its chunks count again
    assert analytics.tick(1101.5) == []
    offline = [e.to_json() for e in analytics.tick(1102.5)]
    assert [e["event"] for e in offline] == ["stream_offline"] and offline[0]["ts"] == 4.5
    assert analytics.liveness.online("cam") is False


def test_releasing_one_stream_leaves_the_others_untouched(tmp_path):
    analytics = Analytics(two_streams(tmp_path), run_id="run")
    yard_rows = []
    for seq in range(8):
        for rec in analytics.rows([(row(seq), None, None), (yard(row(seq)), None, None)]):
            yard_rows += [rec[0]] if rec[0].stream == "yard" and rec[0].type == "result" else []
        analytics.frames("cam", 1000.0 + seq, seq + 0.5)
        analytics.frames("yard", 1000.0 + seq, seq + 0.5)
    analytics.heard("cam", "live", 0.0, received=1007.5)
    analytics.heard("yard", "live", 0.0, received=1007.5)
    assert analytics.tick(1007.5) == []
    analytics.order["yard", "detect"].expect(8)
    assert analytics.rows([(yard(row(9)), None, None)]) == []  # yard's row 9 waits for chunk 8
    out = analytics.release("cam")
    assert out and {r.stream for r, _, _ in out} == {"cam"}
    assert analytics.held() == 1 and analytics.tracks_active() == {"cam": 0, "yard": 1}
    later = [r for r, _, _ in analytics.rows([(yard(row(8)), None, None)]) if r.type == "result"]
    assert [r.chunk for r in later] == [8, 9]  # still in order, on the same track as before
    assert set().union(*(track_ids(r) for r in yard_rows + later)) == track_ids(yard_rows[0])
    # yard is still judged: its silence is an outage (cam's is not: it moved away)
    assert [(e.event, e.stream) for e in analytics.tick(1010.0) if e.event.startswith("stream")] == [
        ("stream_offline", "yard")]
