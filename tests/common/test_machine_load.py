"""How busy the rest of the machine is while something is measured (common/machine_load.py): read from /proc/stat
against a real competing process."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import pytest

from vlora_va.common import machine_load as L


@contextmanager
def spinning(n: int):
    """n real processes that each keep one CPU busy until the block ends (started before it is entered)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                                 stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for s in spinners:
            assert s.stdout.readline().strip() == "spinning"
        yield
    finally:
        for s in spinners:
            s.kill()
            s.wait()
            s.stdout.close()


def test_other_processes_cpu_time_is_measured():
    if L.machine_busy() is None:
        pytest.skip("no /proc/stat here")
    with spinning(os.cpu_count() or 1):
        result, others = L.others_share(lambda: "done")
    assert result == "done"
    assert others > L.QUIET_MAX_SHARE, others  # one spinning process per CPU, this one waiting
    assert not L.quiet(others) and f"{others:.0%} of the CPUs" in L.describe(others)


def test_an_unreadable_load_counts_as_quiet():
    assert L.quiet(None) and "not readable" in L.describe(None)
    assert L.quiet(L.QUIET_MAX_SHARE) and not L.quiet(L.QUIET_MAX_SHARE + 0.01)
