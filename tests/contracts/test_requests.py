"""vlora_va.contracts.requests (and wire.Chunk.requests): one Request per task of a received chunk, its times in the
daemon's clock, and which frames requests share."""

import numpy as np
import pytest

from tests.contracts.test_wire import frames, make_header
from vlora_va.contracts.wire import TaskRequest, decode_chunk, encode_chunk


def test_a_chunk_cut_into_requests_has_its_frames_and_times_in_the_daemon_clock():
    h = make_header(ready_wall=100.0, dropped_before=2,
                    tasks=(TaskRequest("det", "detect", (2,), 500.0, priority=3),
                           TaskRequest("act", "actions", (0, 1, 2), 2000.0)))
    fs = frames()
    chunk = decode_chunk(encode_chunk(h, fs))
    det, act = chunk.requests(received=1000.5, clock_offset=900.25)  # daemon clock = sender + 900.25
    assert (det.stream, det.seq, det.task, det.adapter, det.priority) == ("cam", 7, "det", "detect", 3)
    assert (act.task, act.adapter, act.priority) == ("act", "actions", 0)
    assert det.ready == act.ready == 1000.25 and det.received == 1000.5
    assert det.deadline == 1000.75 and act.deadline == 1002.25
    assert det.deadline_ms == 500.0 and act.deadline_ms == 2000.0
    assert det.num_images == 1 and np.array_equal(det.frames[0], fs[2])
    assert act.num_images == 3 and all(np.array_equal(a, b) for a, b in zip(act.frames, fs))
    assert det.frame_ts == [pytest.approx(0.2)] and act.frame_ts == pytest.approx([0.0, 0.1, 0.2])
    assert det.letterbox == h.letterbox and det.orig_size == (640, 480)
    assert det.dropped_before == act.dropped_before == 2
    assert det.key == ("cam", 7, "det") and det.degraded == ""
    # views on the received buffers, not copies
    assert np.shares_memory(act.frames[2], chunk.frames[2]) and np.shares_memory(det.frames[0], chunk.frames[2])


def test_without_an_offset_the_sender_clock_is_used():
    chunk = decode_chunk(encode_chunk(make_header(ready_wall=100.0), frames()))
    req = chunk.requests(received=100.5)[0]
    assert req.ready == 100.0 and req.deadline == pytest.approx(100.1235)


def test_ready_is_never_after_the_daemon_received_the_chunk():
    """An offset estimate a few ms too high (the third smallest of recent samples) would otherwise put the
    chunk's completion after its arrival."""
    chunk = decode_chunk(encode_chunk(make_header(ready_wall=100.0), frames()))
    req = chunk.requests(received=1000.002, clock_offset=900.006)[0]
    assert req.ready == 1000.002 and req.deadline == pytest.approx(1000.002 + req.deadline_ms / 1000.0)


def test_requests_of_one_chunk_that_look_at_one_frame_share_its_key():
    """frame_keys name the frame buffers: a frame two tasks look at has one key (what a shared prefix runs once
    for); different frames have different keys, even when their pixels are equal."""
    h = make_header(tasks=(TaskRequest("det", "detect", (1,), 500.0), TaskRequest("act", "actions", (0, 1, 2), 500.0)))
    same = [np.zeros(h.frame_shape, np.uint8) for _ in range(3)]
    det, act = decode_chunk(encode_chunk(h, same)).requests(received=100.0)
    assert det.frame_keys == (act.frame_keys[1],)
    assert len(set(act.frame_keys)) == 3
