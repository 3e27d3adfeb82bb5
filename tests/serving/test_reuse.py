"""Reused results (vlora_va/serving/reuse.py): a task whose frames ingest filtered out gets the row of the chunk it
names, with its own chunk number and times, or a shed row saying that chunk was not served."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from tests.serving.test_daemon import RunningDaemon, config
from vlora_va.contracts.filtering import FilterConfig
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import DetectionResult, FrameDetections, ResultRecord
from vlora_va.contracts.wire import ChunkHeader, TaskRequest, encode_chunk
from vlora_va.serving.reuse import Reuse
from vlora_va.testing.messages import make_seeing_detector
from vlora_va.testing.tiny import TINY_IMAGE


def request(seq: int, reuse: int = -1, deadline_in: float = 30.0) -> Request:
    now = time.time()
    frames = [] if reuse >= 0 else [np.zeros((4, 4, 3), np.uint8)]
    return Request(stream="cam", seq=seq, task="det", adapter="d", frames=frames, frame_ts=[float(seq)],
                   letterbox=Letterbox(1.0, 0.0, 0.0), orig_size=(4, 4), ready=now, received=now,
                   deadline=now + deadline_in, reuse_chunk=reuse)


def served(req: Request, boxes: int = 1) -> ResultRecord:
    result = DetectionResult(frames=(FrameDetections(ts=req.frame_ts[0], detections=()),) * boxes)
    return ResultRecord.served(req, result, compute_start=req.received, compute_end=req.received + 0.01,
                               batch_images=1, mode="premerged")


def test_a_reuse_of_a_written_row_is_that_row_with_its_own_chunk_and_times():
    reuse = Reuse()
    first = request(0)
    reuse.expect([(first.stream, first.task, first.seq)])
    source = served(first)
    assert reuse.written(source) == []
    rec = reuse.take(request(1, reuse=0), time.time())
    assert (rec.status, rec.chunk, rec.frame_ts, rec.extra["reused_chunk"]) == ("ok", 1, (1.0,), 0)
    assert rec.result == source.result and rec.latency.compute_s == 0 and rec.mode is None and rec.deadline_met


def test_a_reuse_waits_for_a_row_still_to_come_and_leaves_with_it():
    reuse = Reuse()
    first = request(3)
    reuse.expect([(first.stream, first.task, first.seq)])
    assert reuse.take(request(4, reuse=3), time.time()) is None and len(reuse) == 1
    released = reuse.written(served(first))
    assert [(req.seq, src.chunk) for req, src in released] == [(4, 3)] and len(reuse) == 0


@pytest.mark.parametrize("source_status", ["shed", "unknown"])
def test_a_reuse_of_a_chunk_not_served_is_shed_saying_so(source_status):
    reuse = Reuse()
    if source_status == "shed":
        first = request(0)
        reuse.expect([(first.stream, first.task, first.seq)])
        reuse.written(ResultRecord.not_served(first, "shed", "deadline", time.time()))
    rec = reuse.take(request(1, reuse=0), time.time())
    assert (rec.status, rec.reason, rec.extra["reused_chunk"], rec.deadline_met) == (
        "shed", "reused chunk 0 not served", 0, False)


def test_a_held_reuse_is_shed_at_its_deadline_and_all_at_drain():
    reuse = Reuse()
    reuse.expect([("cam", "det", 0), ("cam", "det", 5)])
    reuse.take(request(1, reuse=0, deadline_in=-1.0), time.time())  # already late
    reuse.take(request(6, reuse=5), time.time())
    late = reuse.expire(time.time())
    assert [(req.seq, rec.status, rec.reason) for req, rec in late] == [(1, "shed", "reused chunk 0 not served")]
    assert [req.seq for req, _ in reuse.expire(time.time(), everything=True)] == [6] and len(reuse) == 0


def test_a_best_effort_reuse_waits_past_its_deadline_for_its_source_row():
    """Files read as fast as they go are best-effort: their requests are never shed, so a reuse of one must wait
    however late its source is served (the default pipeline, run best-effort, shed chunk 42 "reused chunk 41 not
    served" while 41 was still queued)."""
    reuse = Reuse()
    reuse.expect([("cam", "det", 41)])
    late = dataclasses.replace(request(42, reuse=41, deadline_in=-1.0), best_effort=True)
    assert reuse.take(late, time.time()) is None
    assert reuse.expire(time.time()) == [] and len(reuse) == 1
    released = reuse.written(served(request(41)))
    assert [(req.seq, src.chunk, src.status) for req, src in released] == [(42, 41, "ok")]


def parts(seq: int, frames: int, reuse: int = -1):
    """A chunk of stream cam with one task "det": with `frames` frames, or none reusing chunk `reuse`."""
    now = time.time()
    rng = np.random.default_rng(seq)
    images = [rng.integers(0, 255, (TINY_IMAGE, TINY_IMAGE, 3), dtype=np.uint8) for _ in range(frames)]
    ts = tuple(seq + 0.1 * i for i in range(2))
    task = (TaskRequest("det", "seeing", (), 30_000.0, reuse_chunk=reuse, reuse_ts=ts) if reuse >= 0 else
            TaskRequest("det", "seeing", tuple(range(frames)), 30_000.0))
    header = ChunkHeader(stream="cam", seq=seq, fps=10.0, frame_ts=ts if reuse < 0 else (),
                         frame_shape=(TINY_IMAGE, TINY_IMAGE, 3), orig_size=(TINY_IMAGE, TINY_IMAGE),
                         letterbox=Letterbox(1.0, 0.0, 0.0), tasks=(task,), ready_wall=now, sent_wall=now)
    return encode_chunk(header, images)


def test_the_daemon_answers_frameless_chunks_from_the_chunk_they_reuse(tmp_path, tiny_backbone_dir):
    seeing = make_seeing_detector(tmp_path / "seeing")
    # Batches wait up to 1 s for more: chunk 3 is still queued when the chunk reusing it arrives.
    cfg = config(tmp_path, tiny_backbone_dir, {"seeing": seeing}, max_wait_ms=1000)
    cam = cfg.streams[0]  # its task filters (the daemon keeps the rows a reuse may name only where one does)
    task = dataclasses.replace(cam.tasks[0], filter=FilterConfig(threshold=1.0))
    d = RunningDaemon(dataclasses.replace(cfg, streams=(dataclasses.replace(cam, tasks=(task,)),)))
    for message in (parts(0, 2), parts(1, 0, reuse=0), parts(3, 2), parts(4, 0, reuse=3), parts(6, 0, reuse=5)):
        d.send(message)
    rows = {r["chunk"]: r for r in d.finish()}
    assert sorted(rows) == [0, 1, 3, 4, 6]
    assert rows[0]["frames"] and any(f["detections"] for f in rows[0]["frames"])  # a head that sees
    for chunk, source in ((1, 0), (4, 3)):
        r = rows[chunk]
        assert r["status"] == "ok" and r["reused_chunk"] == source and r["frames"] == rows[source]["frames"]
        assert r["frame_ts"] == [chunk, chunk + 0.1] and "batch_images" not in r
    assert (rows[6]["status"], rows[6]["reason"]) == ("shed", "reused chunk 5 not served")  # never sent
    # /metrics says how many rows the filter spared the backbone
    reused = d.daemon.metrics.registry.get_sample_value("vlora_results_reused_total", {"stream": "cam", "task": "det"})
    assert reused == 3  # chunks 1, 4 (served) and 6 (shed)
