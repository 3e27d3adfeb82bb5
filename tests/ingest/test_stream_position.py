"""vlora_va.ingest.stream_position: a stream's position, named fields over a shared array that a spawned worker
process writes and its supervisor reads (as `vlora-va run` keeps it across worker restarts)."""

from __future__ import annotations

import multiprocessing as mp

from vlora_va.ingest.stream_position import StreamPosition


def advance(position: StreamPosition) -> None:
    """What a worker does with its stream's position: chunks made and sent, then the stream ends."""
    position.made(7, 3.5, 1000.25)
    position.last_sent = 5
    position.ended = True


def test_a_fresh_position_has_made_nothing():
    p = StreamPosition()
    assert (p.started, p.next_seq, p.last_sent, p.media_end, p.last_wall, p.ended) == (False, 0, -1, 0.0, 0.0, False)


def test_what_a_spawned_worker_writes_its_supervisor_reads():
    ctx = mp.get_context("spawn")  # as the supervisor starts workers: nothing is inherited but the arguments
    position = StreamPosition.shared(ctx)
    child = ctx.Process(target=advance, args=(position,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert (position.started, position.next_seq, position.last_sent, position.media_end, position.last_wall,
            position.ended) == (True, 7, 5, 3.5, 1000.25, True)
    position.ended = False  # a changed stream may run again (SIGHUP reload)
    assert not position.ended and position.next_seq == 7


def test_a_position_travels_as_plain_values_and_skips_numbers_a_lost_worker_may_have_used():
    """Cluster mode: an ingest actor's positions go to the controller as lists (Ray), and a lost actor's camera
    restarts from one, past the chunk numbers its worker may have used since it was read."""
    p = StreamPosition()
    advance(p)
    q = StreamPosition(p.values())
    assert q.values() == p.values() and q.values() is not p.values()  # a copy: the reader cannot write the worker's
    q.skip(3)
    assert (q.next_seq, q.last_sent, q.media_end, q.last_wall) == (10, 5, 3.5, 1000.25)
    assert p.next_seq == 7
    fresh = StreamPosition()
    fresh.skip(2)
    assert fresh.started and fresh.next_seq == 2  # a worker lost before its first chunk: resumed, numbers skipped
