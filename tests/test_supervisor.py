"""The supervisor's child processes and the signals a terminal sends to the whole process group."""

import multiprocessing as mp
import os
import signal
import time
from contextlib import nullcontext

from vlora_va.supervisor import signals_ignored_for_children


def _nap() -> None:
    time.sleep(1.0)


def test_a_child_started_with_signals_ignored_survives_a_ctrl_c_while_it_starts():
    """Ctrl-C reaches every process of the group; a child still importing must not die of it (it made a run
    exit 1 when a reload had just started a worker). Without the guard the same child dies."""
    ctx = mp.get_context("spawn")
    # as in `vlora-va run` (Ctrl-C is handled); an earlier test of this process may have left it ignored
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for guard, survives in ((nullcontext, False), (signals_ignored_for_children, True)):
            child = ctx.Process(target=_nap)
            with guard():
                child.start()
            os.kill(child.pid, signal.SIGINT)  # while it is starting: spawn runs a fresh interpreter
            child.join(30)
            assert (child.exitcode == 0) == survives, (guard, child.exitcode)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the parent's handler is back
    finally:
        signal.signal(signal.SIGINT, before)
