"""vlora_va.ingest.filtering and its use by the chunker: a task whose frames show nothing new since the last ones
sent for it sends none, names the chunk whose result stands for it, and the message carries only the frames a
sending task needs (none at all when every task reuses)."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import replace

import av
import cv2
import numpy as np
import pytest

from tests.conftest import PEDESTRIANS
from tests.ingest.ingest_helpers import IMAGE_SIZE, Receiver, WorkerThread, pipeline, stream
from vlora_va.contracts.config import TaskConfig
from vlora_va.contracts.filtering import FilterConfig
from vlora_va.contracts.wire import decode_message, encode_chunk
from vlora_va.ingest.chunker import Chunker
from vlora_va.ingest.filtering import BLOCK, THUMB, FrameFilter, difference, thumbnail
from vlora_va.ingest.source import Frame


def image(level: int, side: int = 2 * THUMB, seed: int = 0) -> np.ndarray:
    """A textured RGB image whose grey level is shifted by `level` (a light change)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(60, 180, (side, side, 3), dtype=np.int16)
    return np.clip(base + level, 0, 255).astype(np.uint8)


def test_the_feature_is_the_largest_blocks_mean_grey_difference_of_the_thumbnails():
    a, b = image(0), image(0, seed=1)
    b[:16, :16] = 255  # one corner changes much more than the rest: its block is the feature
    # reference: grey (OpenCV's weights), then the mean of each 2x2 block (area resize of a 2x image, rounded to a
    # grey level as OpenCV does for uint8), then |a - b|, the mean over each BLOCK x BLOCK block of the thumbnail
    # by a plain loop, and the largest
    def ref_thumb(im):
        g = cv2.cvtColor(im, cv2.COLOR_RGB2GRAY).astype(np.float64)
        return np.floor(g.reshape(THUMB, 2, THUMB, 2).mean(axis=(1, 3)) + 0.5)  # halves up, as OpenCV rounds
    d = np.abs(ref_thumb(a) - ref_thumb(b))
    blocks = [d[i:i + BLOCK, j:j + BLOCK].mean() for i in range(0, THUMB, BLOCK) for j in range(0, THUMB, BLOCK)]
    want = max(blocks)
    assert want > 2 * np.mean(d)  # a local change, not the frame's mean
    same = thumbnail(a)
    assert difference([same, same], [same, thumbnail(b)]) == pytest.approx(want, abs=0.01)  # the larger pair


def test_a_small_person_leaving_the_view_is_a_change_though_the_frames_mean_hardly_moves():
    """A person covering 1.5% of the view walks out: the frame's mean grey difference is about 1 (noise-sized),
    the blocks they covered change by tens of grey levels. The empty scene must not reuse the frame they were in."""
    f = FrameFilter(FilterConfig(threshold=2.5, refresh_chunks=100))
    person = image(0)
    person[20:44, 100:110] = 250  # 24 x 10 px of a 128 x 128 view, bright against the textured scene
    assert f.decide(0, [person]) == -1
    assert np.mean(np.abs(thumbnail(person) - thumbnail(image(0)))) < 2.5  # the old, whole-frame feature: "same"
    assert f.decide(1, [image(0)]) == -1  # gone: sent, so its row shows nobody


def test_unchanged_frames_reuse_the_chunk_last_sent_until_the_refresh():
    f = FrameFilter(FilterConfig(threshold=2.5, refresh_chunks=4))
    decisions = [f.decide(seq, [image(0)]) for seq in range(9)]
    assert decisions == [-1, 0, 0, 0, -1, 4, 4, 4, -1]  # frames at least every 4 chunks
    assert (f.sent, f.reused) == (3, 6)


def test_a_slow_drift_adds_up_against_the_frames_last_sent():
    """One grey level per chunk never passes a 2.5 threshold against the previous chunk, but it does against the
    reference: frames are sent again once the scene has drifted that far."""
    f = FrameFilter(FilterConfig(threshold=2.5, refresh_chunks=100))
    assert [f.decide(seq, [image(seq)]) for seq in range(7)] == [-1, 0, 0, -1, 3, 3, -1]


def test_a_change_anywhere_in_the_tasks_frames_sends_them():
    f = FrameFilter(FilterConfig(threshold=2.5, refresh_chunks=100))
    assert f.decide(0, [image(0), image(0)]) == -1
    moved = image(0)
    moved[40:120, 40:100] = 255  # someone walks in, in the second frame only
    assert f.decide(1, [image(0), moved]) == -1
    assert f.decide(2, [image(0), moved]) == 1


def test_a_dropped_reference_makes_the_next_chunk_send():
    f = FrameFilter(FilterConfig(threshold=2.5, refresh_chunks=100))
    assert f.decide(0, [image(0)]) == -1
    assert not f.invalidate(5)  # not the reference: nothing changes
    assert f.decide(1, [image(0)]) == 0
    assert f.invalidate(0)  # the reference will never reach the daemon
    assert f.decide(2, [image(0)]) == -1
    assert f.decide(3, [image(0)]) == 2


def frame(rgb: np.ndarray, ts: float) -> Frame:
    return Frame(av.VideoFrame.from_ndarray(rgb, format="rgb24"), ts, time.time())


def chunks_of(chunker: Chunker, frames: list[np.ndarray], fps: float) -> list:
    out = [chunker.add(frame(rgb, i / fps)) for i, rgb in enumerate(frames)]
    return [c for c in out if c is not None]


def filtered(name: str, k: int, threshold: float = 2.5) -> TaskConfig:
    return TaskConfig(name=name, adapter=name, frames_per_chunk=k, deadline_ms=1000.0,
                      filter=FilterConfig(threshold=threshold, refresh_chunks=100))


def test_a_reusing_task_sends_no_frames_and_the_message_carries_only_what_the_others_need():
    still = image(0, side=96)
    tasks = (filtered("act", 4), TaskConfig(name="det", adapter="det", frames_per_chunk=1, deadline_ms=500.0))
    chunker = Chunker(stream("cam", "x.mp4", fps=4, tasks=tasks), IMAGE_SIZE)
    first, second = chunks_of(chunker, [still] * 8, fps=4)
    assert len(first.frames) == 4 and first.header.tasks[0].reuse_chunk == -1
    act, det = second.header.tasks
    assert act.reuse_chunk == 0 and act.frames == () and act.reuse_ts == (1.0, 1.25, 1.5, 1.75)
    assert det.reuse_chunk == -1 and len(second.frames) == 1 and second.header.frame_ts == (1.5,)
    assert det.frames == (0,)
    # Over the wire, the daemon's requests: the reusing task has no frames and the times it stands for.
    requests = decode_message(encode_chunk(second.header, second.frames)).requests(time.time())
    assert [(r.task, r.reuse_chunk, len(r.frames), r.frame_ts) for r in requests] == [
        ("act", 0, 0, [1.0, 1.25, 1.5, 1.75]), ("det", -1, 1, [1.5])]


def test_when_every_task_reuses_the_message_is_a_header_alone():
    still = image(0, side=96)
    chunker = Chunker(stream("cam", "x.mp4", fps=2, tasks=(filtered("a", 2), filtered("b", 1))), IMAGE_SIZE)
    _, second = chunks_of(chunker, [still] * 4, fps=2)
    parts = encode_chunk(second.header, second.frames)
    assert len(parts) == 1 and second.header.frame_ts == ()
    requests = decode_message(parts).requests(time.time())
    assert [(r.task, r.reuse_chunk, r.frame_ts) for r in requests] == [("a", 0, [1.0, 1.5]), ("b", 0, [1.5])]


def test_a_task_without_a_filter_sends_every_chunk():
    still = image(0, side=96)
    chunker = Chunker(stream("cam", "x.mp4", fps=2, tasks=(replace(filtered("a", 2), filter=None),)), IMAGE_SIZE)
    assert all(c.header.tasks[0].reuse_chunk == -1 and len(c.frames) == 2
               for c in chunks_of(chunker, [still] * 6, fps=2))


@pytest.mark.parametrize("policy", ["drop_newest", "drop_oldest"])
def test_a_reference_chunk_the_queue_drops_makes_the_next_chunk_send_its_frames(zmq_ctx, caplog, policy):
    """A real worker behind a slow daemon: its queue drops chunks, some of them a filter's reference. No chunk may
    name a dropped reference except those already decided when it was dropped (drop_newest drops a chunk as it is
    made: none; drop_oldest: the send_hwm chunks queued behind it), and the first chunk after those sends frames."""
    slow = Receiver(zmq_ctx, rcvhwm=1, rcvbuf=64 * 1024)
    send_hwm = 2
    # threshold at the feature's maximum: "det" sends frames only first, every 4th chunk, or after a dropped
    # reference. "act" is not filtered: every message carries a frame, so the slow daemon's socket fills and the
    # queue drops chunks.
    det = filtered("det", 1, threshold=255.0)
    det = replace(det, filter=replace(det.filter, refresh_chunks=4))
    act = TaskConfig(name="act", adapter="act", frames_per_chunk=1, deadline_ms=1000.0)
    # paced like a camera, 5 chunks/s, against a daemon that takes 0.4 s per chunk: drops all along the run
    cfg = pipeline(slow.endpoint, stream("peds", PEDESTRIANS, fps=10, chunk_seconds=0.2, max_chunks=40,
                                         realtime=True, tasks=(det, act)), send_hwm=send_hwm, drop_policy=policy)
    with caplog.at_level(logging.DEBUG, logger="vlora_va.ingest.worker"):
        w = WorkerThread(cfg)
        w.start()
        chunks = slow.drain(w, timeout=60, delay=0.4)
        w.finish()
    # which dropped chunks were references: the worker says so (the test cannot see a chunk that never came)
    dropped_refs = [int(m.group(1)) for r in caplog.records
                    if (m := re.search(r"dropped chunk (\d+) held task det's reference", r.getMessage()))]
    assert dropped_refs, "no reference was dropped: the scenario did not happen"
    received = {c.header.seq: c.header.tasks[0].reuse_chunk for c in chunks}  # seq -> the chunk det reuses (-1: none)
    decided_before = 0 if policy == "drop_newest" else send_hwm
    checked = 0
    for d in dropped_refs:
        assert d not in received
        assert all(c - d <= decided_before for c, ref in received.items() if ref == d), (d, received)
        after = [c for c in received if c > d + decided_before]
        if after:  # the first chunk that arrived after those sends frames, or reuses a newer reference
            first = min(after)
            assert received[first] == -1 or received[first] > d, (d, first, received)
            checked += 1
    assert checked
