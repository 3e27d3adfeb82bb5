"""vlora_va.contracts.results: the one row every request gets (ok / shed / error), its JSON, and the rows built from a
Request. Times below are binary-exact so every expected number is computed by hand."""

import json

import pytest

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import (
    RESULT_VERSION,
    STATUSES,
    ActivityResult,
    Detection,
    DetectionResult,
    FrameDetections,
    JsonlFollower,
    Latency,
    PersonActivity,
    ResultRecord,
    iso_utc,
)


def record(**kw) -> ResultRecord:
    fields = dict(stream="cam", chunk=3, task="det", adapter="detect", status="ok", frame_ts=(0.5,),
                  latency=Latency(), deadline_ms=2000.0, deadline_met=True)
    fields.update(kw)
    return ResultRecord(**fields)


def request(**kw) -> Request:
    fields = dict(stream="cam", seq=3, task="det", adapter="detect", frames=[], frame_ts=[0.5, 0.75],
                  letterbox=Letterbox(1.0, 0.0, 0.0), orig_size=(640, 480),
                  ready=100.0, received=100.25, deadline=102.0, dropped_before=1)
    fields.update(kw)
    return Request(**fields)


DETECTIONS = DetectionResult((FrameDetections(0.5, (Detection((282.44, 215.16, 318.04, 301.0), "person", 0.66789),
                                                    Detection((1.0, 2.0, 3.0, 4.0), "car", 0.5))),))


# ---------------------------------------------------------------- the record's rules


@pytest.mark.parametrize("status, deadline_met, reason", [
    ("shed", False, None),
    ("shed", False, ""),
    ("error", False, None),
    ("shed", True, "cannot meet its deadline"),
    ("error", True, "unknown adapter 'x'"),
])
def test_shed_and_error_rows_need_a_reason_and_never_meet_the_deadline(status, deadline_met, reason):
    with pytest.raises(ValueError, match=f"a {status} row needs a reason and never meets its deadline"):
        record(status=status, deadline_met=deadline_met, reason=reason)


@pytest.mark.parametrize("status", ["late", "OK", "", None, "dropped"])
def test_unknown_status_is_rejected(status):
    with pytest.raises(ValueError, match="result status must be one of"):
        record(status=status)


def test_legal_rows():
    assert STATUSES == ("ok", "shed", "error")
    assert record(status="ok", deadline_met=False).deadline_met is False  # served late
    assert record(status="shed", deadline_met=False, reason="overload").reason == "overload"
    assert record(status="error", deadline_met=False, reason="adapter failed to load").status == "error"


# ---------------------------------------------------------------- JSON rows


def test_ok_detection_row():
    row = record(stream="pedestrians", chunk=0, task="detect", frame_ts=(0.5,), result=DETECTIONS,
                 latency=Latency(0.05049, 0.89571, 0.95123), batch_images=10, mode="premerged").to_json()
    assert row == {
        "v": 3, "type": "result", "stream": "pedestrians", "chunk": 0, "task": "detect", "adapter": "detect", "status": "ok",
        "frame_ts": [0.5],
        "frames": [{"ts": 0.5, "detections": [{"box": [282.4, 215.2, 318.0, 301.0], "class": "person", "score": 0.6679},
                                              {"box": [1.0, 2.0, 3.0, 4.0], "class": "car", "score": 0.5}]}],
        "latency_ms": {"queue": 50.5, "compute": 895.7, "total": 951.2},
        "deadline_ms": 2000.0, "deadline_met": True, "batch_images": 10, "mode": "premerged",
    }
    assert RESULT_VERSION == 3
    # the documented order: identity, status, what was looked at, the result, then the timing
    assert list(row) == ["v", "type", "stream", "chunk", "task", "adapter", "status", "frame_ts", "frames", "latency_ms",
                         "deadline_ms", "deadline_met", "batch_images", "mode"]
    assert json.loads(json.dumps(row)) == row  # plain JSON types only


def test_activity_row_with_persons():
    result = ActivityResult(label="walking_left", score=0.50444, scores={"standing": 0.08123, "walking_left": 0.50444},
                            persons=(PersonActivity((10.04, 20.06, 30.0, 40.56), 0.91234, "walking_left", 0.61239),
                                     PersonActivity((0.0, 0.0, 5.0, 5.0), 0.5, "standing", 1.0, "track")))
    row = record(task="activity", adapter="actions-persons", frame_ts=(0.0, 1 / 3, 0.66666), result=result,
                 latency=Latency(0.0, 0.0, 2.68996), deadline_ms=3000.04, untrained=True, dropped_before=2,
                 extra={"frames_used": 4}).to_json()
    assert row == {
        "v": 3, "type": "result", "stream": "cam", "chunk": 3, "task": "activity", "adapter": "actions-persons", "status": "ok",
        "frame_ts": [0.0, 0.3333, 0.6667], "untrained": True,
        "label": "walking_left", "score": 0.5044, "scores": {"standing": 0.0812, "walking_left": 0.5044},
        "persons": [{"box": [10.0, 20.1, 30.0, 40.6], "score": 0.9123, "activity": "walking_left",
                     "activity_score": 0.6124, "activity_from": "maps"},
                    {"box": [0.0, 0.0, 5.0, 5.0], "score": 0.5, "activity": "standing", "activity_score": 1.0,
                     "activity_from": "track"}],
        "latency_ms": {"queue": 0.0, "compute": 0.0, "total": 2690.0},
        "deadline_ms": 3000.0, "deadline_met": True, "dropped_before": 2, "frames_used": 4,
    }


def test_activity_row_without_a_person_branch_has_no_persons_key():
    plain = record(result=ActivityResult("no_person", 0.9, {"no_person": 0.9})).to_json()
    assert "persons" not in plain and plain["label"] == "no_person"
    nobody = record(result=ActivityResult("no_person", 0.9, {"no_person": 0.9}, persons=())).to_json()
    assert nobody["persons"] == []  # a per-person adapter that found nobody says so


def test_shed_row_json_says_why_and_has_no_result():
    row = record(status="shed", reason="cannot meet its deadline: needs ~820 ms, 310 ms left", deadline_met=False,
                 deadline_ms=3000.0, latency=Latency(0.0, 0.0, 2.69)).to_json()
    assert row == {"v": 3, "type": "result", "stream": "cam", "chunk": 3, "task": "det", "adapter": "detect", "status": "shed",
                   "reason": "cannot meet its deadline: needs ~820 ms, 310 ms left", "frame_ts": [0.5],
                   "latency_ms": {"queue": 0.0, "compute": 0.0, "total": 2690.0}, "deadline_ms": 3000.0,
                   "deadline_met": False}


# ---------------------------------------------------------------- rows from requests


def test_served_computes_latency_and_deadline_from_the_request():
    # ready 100.0, received 100.25, batch 100.5 -> 101.25, deadline 102.0 (2000 ms)
    rec = ResultRecord.served(request(), DETECTIONS, compute_start=100.5, compute_end=101.25, batch_images=6, mode="unmerged")
    assert rec.status == "ok" and rec.reason is None and rec.result is DETECTIONS
    assert (rec.stream, rec.chunk, rec.task, rec.adapter) == ("cam", 3, "det", "detect")
    assert rec.frame_ts == (0.5, 0.75)
    assert rec.latency == Latency(queue_s=0.25, compute_s=0.75, total_s=1.25)
    assert rec.deadline_ms == 2000.0 and rec.deadline_met is True
    row = rec.to_json()
    assert row["latency_ms"] == {"queue": 250.0, "compute": 750.0, "total": 1250.0}
    assert (row["deadline_ms"], row["deadline_met"], row["batch_images"], row["mode"], row["dropped_before"]) == \
        (2000.0, True, 6, "unmerged", 1)
    assert "untrained" not in row and "degraded" not in row and "reason" not in row


@pytest.mark.parametrize("compute_end, met, total_ms", [
    (101.75, True, 1750.0),
    (102.0, True, 2000.0),  # exactly at the deadline is in time
    (102.125, False, 2125.0),
    (110.0, False, 10000.0),
])
def test_served_deadline_met_compares_the_end_with_the_deadline(compute_end, met, total_ms):
    rec = ResultRecord.served(request(), DETECTIONS, compute_start=101.5, compute_end=compute_end, batch_images=1, mode="merged")
    assert rec.deadline_met is met
    assert rec.to_json()["latency_ms"]["total"] == total_ms


@pytest.mark.parametrize("handed_at, met, handoff_ms", [
    (101.5, True, 250.0),
    (102.0, True, 750.0),  # handed exactly at the deadline is in time
    (102.05, False, 800.0),  # computed in time, handed to the sinks after it: late
])
def test_a_row_is_judged_where_it_is_handed_to_the_sinks(handed_at, met, handoff_ms):
    """docs/results.md#deadline_met: compute ends at 101.25 (in time for 102.0); the row is judged at its hand-off."""
    rec = ResultRecord.served(request(), DETECTIONS, compute_start=100.5, compute_end=101.25, batch_images=1,
                              mode="merged")
    handed = rec.handed(handed_at)
    assert handed.deadline_met is met and rec.deadline_met is True
    assert handed.to_json()["latency_ms"] == {"queue": 250.0, "compute": 750.0,
                                              "total": round((handed_at - 100.0) * 1000, 1), "handoff": handoff_ms}
    shed = ResultRecord.not_served(request(), "shed", "late", now=101.0)
    assert shed.handed(101.5).deadline_met is False  # a row not served never meets its deadline, wherever judged


def test_served_marks_untrained_adapters_degraded_requests_and_extras():
    req = request(degraded="overload: 4 of 8 frames")
    rec = ResultRecord.served(req, DETECTIONS, compute_start=100.5, compute_end=101.0, batch_images=2, mode="mixture",
                 trained=False, extra={"frames_used": 4})
    row = rec.to_json()
    assert row["untrained"] is True
    assert row["degraded"] == "overload: 4 of 8 frames"
    assert row["frames_used"] == 4
    assert row["status"] == "ok" and row["deadline_met"] is True


def test_not_served_rows_say_why_and_never_meet_the_deadline():
    req = request()
    shed = ResultRecord.not_served(req, "shed", "cannot meet its deadline: needs ~820 ms, 310 ms left", now=101.5)
    assert shed.deadline_met is False  # 101.5 is before the deadline: shedding still is not meeting it
    assert shed.latency == Latency(0.0, 0.0, 1.5)
    assert shed.to_json() == {
        "v": 3, "type": "result", "stream": "cam", "chunk": 3, "task": "det", "adapter": "detect", "status": "shed",
        "reason": "cannot meet its deadline: needs ~820 ms, 310 ms left", "frame_ts": [0.5, 0.75],
        "captured_at": "1970-01-01T00:01:40.000Z",
        "latency_ms": {"queue": 0.0, "compute": 0.0, "total": 1500.0}, "deadline_ms": 2000.0, "deadline_met": False,
        "dropped_before": 1,
    }
    err = ResultRecord.not_served(req, "error", "unknown adapter 'detect'", now=103.0)
    assert (err.status, err.deadline_met, err.result, err.batch_images, err.mode) == ("error", False, None, None, None)
    assert err.to_json()["latency_ms"]["total"] == 3000.0
    with pytest.raises(ValueError, match="needs a reason"):
        ResultRecord.not_served(req, "error", "", now=101.0)
    with pytest.raises(ValueError, match="not_served rows are shed or error"):
        ResultRecord.not_served(req, "timeout", "late", now=101.0)
    with pytest.raises(ValueError, match="not_served rows are shed or error"):
        ResultRecord.not_served(req, "ok", "fine", now=101.0)


def test_rows_carry_capture_time_in_utc_and_their_provenance():
    """Rows people can join and audit: the capture wall time of the chunk (ISO 8601, UTC) beside the media
    timestamps, and what produced them."""
    prov = {"adapter_sha256": "0123456789abcdef", "backbone": "dinov2-small@21ae54b83eb8", "config_sha256": "feedc0de"}
    req = request()
    req.ready = 1795430130.1234
    row = ResultRecord.served(req, DETECTIONS, compute_start=1795430130.5, compute_end=1795430131.0, batch_images=1,
                 mode="premerged", provenance=prov).to_json()
    assert row["captured_at"] == "2026-11-23T10:35:30.123Z"
    assert row["provenance"] == prov
    assert ResultRecord.not_served(req, "shed", "late", now=1795430131.0, provenance=prov).to_json()["provenance"] == prov
    assert iso_utc(0.0) == "1970-01-01T00:00:00.000Z"


def test_a_follower_returns_each_complete_line_once_and_waits_for_a_partial_one(tmp_path):
    path = tmp_path / "rows.jsonl"
    follower = JsonlFollower(path)
    assert follower.new_lines() == []  # not written yet
    with open(path, "w") as f:
        f.write('{"a":1}\n{"b":')
        f.flush()
        assert follower.new_lines() == ['{"a":1}']
        f.write('2}\n\n{"c":3}\n')
        f.flush()
        assert follower.new_lines() == ['{"b":2}', '{"c":3}']
        assert follower.new_lines() == []


def test_a_tracked_detection_carries_its_track_id_and_others_do_not():
    from vlora_va.contracts.results import Detection
    assert Detection((1, 2, 3, 4), "person", 0.5, "run-t3").to_json()["track_id"] == "run-t3"
    assert "track_id" not in Detection((1, 2, 3, 4), "person", 0.5).to_json()


def test_an_event_row_has_its_type_version_and_only_the_fields_that_apply():
    from vlora_va.contracts.events import EventRecord
    line = EventRecord(id="run-1", event="line_crossed", stream="cam", ts=61.43219, captured_at=1764151530.123,
                       task="detect", chunk=61, line="path", direction="in", track_id="run-t4", cls="person",
                       box=(282.44, 215.2, 318.0, 301.0), counts={"in": {"person": 5}, "out": {}},
                       counts_since=1764151469.0)
    assert line.to_json() == {
        "v": 3, "type": "event", "id": "run-1", "event": "line_crossed", "stream": "cam", "task": "detect",
        "chunk": 61, "line": "path", "direction": "in", "track_id": "run-t4", "class": "person", "ts": 61.4322,
        "captured_at": "2025-11-26T10:05:30.123Z", "box": [282.4, 215.2, 318.0, 301.0],
        "counts": {"in": {"person": 5}, "out": {}}, "counts_since": "2025-11-26T10:04:29.000Z", "snapshot": None}
    offline = EventRecord(id="run-2", event="stream_offline", phase="start", stream="cam", ts=7.5, captured_at=None)
    assert offline.to_json() == {"v": 3, "type": "event", "id": "run-2", "event": "stream_offline", "phase": "start",
                                 "stream": "cam", "ts": 7.5, "captured_at": None, "snapshot": None}
    with pytest.raises(ValueError, match="phase"):
        EventRecord(id="x", event="zone_left", phase="middle", stream="cam", ts=0.0, captured_at=None)
