"""vlora_va.transport's clock-offset estimate: the minimum of (received - sent) per stream over a window, in
memory bounded whatever stream ids and clocks the senders claim (issue 14: no message may leak the daemon)."""

from vlora_va.transport import ClockOffset


def test_offset_is_the_least_delayed_sample_in_the_window():
    c = ClockOffset(window_s=10)
    assert c.update("a", sent=100.0, received=100.5) == 0.5
    assert c.update("a", sent=101.0, received=101.25) == 0.25  # less delayed: a tighter bound
    assert c.update("a", sent=102.0, received=102.75) == 0.25
    assert c.update("a", sent=112.0, received=112.5) == 0.5  # the 0.25 sample has left the window
    assert c.update("b", sent=50.0, received=112.5) == 62.5  # streams are independent


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
    assert c.update("s999", sent=1000.0, received=1000.0) == 0.0  # the most recent ones stay
    for i in range(1000):  # an offset that keeps rising keeps every sample, up to the bound
        c.update("r", sent=0.0, received=float(i))
    assert len(c._samples["r"]) == 50 and c.update("r", sent=0.0, received=1000.0) == 951.0
