"""vlora_va.serving.transport's clock-offset estimate: from the least delayed of a stream's recent messages, robust to
one wrong sent time, in memory bounded whatever stream ids and clocks the senders claim (issue 14: no message
may leak the daemon or shift another message's deadline)."""

from vlora_va.serving.transport import CLOCK_ROBUST_RANK, ClockOffset


def test_offset_is_near_the_least_delayed_samples_in_the_window():
    c = ClockOffset(window_s=10)
    assert c.update("a", sent=100.0, received=100.5) == 0.5  # fewer samples than the rank: the largest so far
    assert c.update("a", sent=101.0, received=101.25) == 0.5
    assert c.update("a", sent=102.0, received=102.75) == 0.75  # third smallest of 0.5, 0.25, 0.75
    for i in range(3):
        c.update("a", sent=103.0 + i, received=103.1 + i)  # three quick ones: the estimate tightens
    assert abs(c.update("a", sent=106.0, received=106.9) - 0.1) < 1e-9
    assert abs(c.update("a", sent=120.0, received=120.5) - 0.5) < 1e-9  # the 0.1 samples left the window
    assert c.update("b", sent=50.0, received=112.5) == 62.5  # streams are independent


def test_one_wrong_sent_time_does_not_move_the_offset():
    """A sender whose clock jumps once (or a hostile message) claims a far-future send time: ignored."""
    c = ClockOffset(window_s=600)
    for i in range(10):
        c.update("cam", sent=1000.0 + i, received=1000.2 + i)
    assert abs(c.update("cam", sent=9e10, received=1010.2) - 0.2) < 1e-6
    assert abs(c.update("cam", sent=1011.0, received=1011.2) - 0.2) < 1e-6
    assert CLOCK_ROBUST_RANK >= 2


def test_streams_are_forgotten_once_their_samples_leave_the_window():
    c = ClockOffset(window_s=10)
    for i in range(1000):  # a new stream id every message, as a fuzzer sends
        c.update(f"s{i}", sent=float(i), received=float(i))
    assert len(c) <= 11
    assert c.update("s999", sent=1000.0, received=1000.0) == 0.0


def test_stream_count_and_samples_per_stream_are_bounded():
    c = ClockOffset(window_s=1e9, max_streams=100, max_samples=50)
    for i in range(1000):
        c.update(f"s{i}", sent=0.0, received=float(i))
    assert len(c) == 100
    assert c.update("s999", sent=1000.0, received=1000.0) == 999.0  # still known: its earlier sample is kept
    for i in range(1000):  # an offset that keeps rising: only the last max_samples are kept
        c.update("r", sent=0.0, received=float(i))
    assert len(c._samples["r"]) == 50 and c.update("r", sent=0.0, received=1000.0) == 953.0  # 951..1000
