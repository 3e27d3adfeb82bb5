"""vlora_va.cluster.ray_connection.HeadWatch: when the controller decides Ray's head is lost. Its probe is replaced
here by one the test controls (answers, fails, hangs); the real probe against a killed head is tested on separate
hosts (tests/cluster/test_hosts.py, the head lost)."""

from __future__ import annotations

import threading
import time

from vlora_va.cluster.ray_connection import HeadWatch


class ScriptedHead(HeadWatch):
    """A HeadWatch whose probe does what `mode` says: "answer", "fail", or "hang" (until released)."""

    def __init__(self, timeout_s: float = 0.05, misses: int = 3):
        super().__init__(timeout_s, misses)
        self.mode = "answer"
        self.release = threading.Event()
        self.asked = 0

    def _ask(self) -> None:
        self.asked += 1
        if self.mode == "hang":
            self.release.wait(10)
            return
        if self.mode == "answer":
            self._answered.set()


def rounds(watch: HeadWatch, n: int, every_s: float = 0.0) -> list[bool]:
    out = []
    for _ in range(n):
        if every_s:
            time.sleep(every_s)
        out.append(watch.lost())
        if watch._probe is not None:
            watch._probe.join(0.5) if watch.mode != "hang" else None
    return out


def test_a_head_that_answers_is_never_lost():
    watch = ScriptedHead()
    assert rounds(watch, 10) == [False] * 10
    assert watch.asked == 10


def test_a_head_whose_probes_fail_is_lost_at_the_third_failure_in_a_row():
    watch = ScriptedHead()
    watch.mode = "fail"
    assert rounds(watch, 4) == [False, False, False, True]  # a probe's failure is seen at the next round


def test_an_answer_starts_the_count_again():
    watch = ScriptedHead()
    watch.mode = "fail"
    got = rounds(watch, 2)
    watch.mode = "answer"
    got += rounds(watch, 2)
    watch.mode = "fail"
    got += rounds(watch, 4)
    assert got == [False] * 7 + [True]  # without the reset, the sixth round would have said lost


def test_a_hanging_probe_counts_a_miss_per_timeout_and_is_not_asked_twice():
    watch = ScriptedHead(timeout_s=0.05)
    watch.mode = "hang"
    try:
        got = rounds(watch, 5, every_s=0.06)
        assert got[-1] is True and got[:2] == [False, False], got
        assert watch.asked == 1  # one probe in flight at a time: a dead head does not collect hanging threads
    finally:
        watch.release.set()
