"""Is the machine quiet while something is measured: the share of the CPUs other processes took meanwhile.

Start-up measurements (the precision probe, engine/precision_choice.py; the cost profile, serving/profiling.py) stand
for this machine's speed in every later start. Taken while other processes shared the cores they come out slow (a
profile ~3x too slow, 2026-11-28: the scheduler then shed a priority-1 task as hopeless), so each is timed inside
`others_share` and kept as the machine's truth only when it was `quiet`.
"""

from __future__ import annotations

import os
import time

QUIET_MAX_SHARE = 0.15  # a measurement counts as quiet while other processes took at most this share of the CPUs
LOAD_WINDOW_S = 0.25  # the shortest window that share is read over (/proc/stat counts in 10 ms ticks)


def machine_busy() -> tuple[float, int] | None:
    """(CPU-seconds the whole machine has been busy since boot, its number of CPUs) from /proc/stat; None where
    there is none. Busy is everything but idle and iowait, steal included (a VM's neighbours)."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        ticks = [int(v) for v in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, IndexError, ValueError):
        return None
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), max(1, cpus)


def others_share(fn):
    """(fn(), the share of the machine's CPU time that other processes took while it ran; None where that cannot
    be read). The machine's busy time less this process's own (`own_cpu_s`), over at least LOAD_WINDOW_S: a shorter
    run (a tiny model) is followed by an idle wait, as the counters advance in ticks."""
    before, own, t0 = machine_busy(), own_cpu_s(), time.perf_counter()
    result = fn()
    rest = LOAD_WINDOW_S - (time.perf_counter() - t0)
    if rest > 0:
        time.sleep(rest)
    after, own, wall = machine_busy(), own_cpu_s() - own, time.perf_counter() - t0
    if before is None or after is None:
        return result, None
    return result, min(1.0, max(0.0, (after[0] - before[0] - own) / (wall * after[1])))


def own_cpu_s() -> float:
    """CPU seconds of this process and of its children that ended: libraries fork helpers of their own while a model
    is compiled or timed (a tiny OpenVINO daemon's start-up forked 88 short-lived children, 3.3 CPU-s), and that is
    this process's work, not another process's load."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def quiet(share: float | None) -> bool:
    """Whether a measurement with `share` (others_share's) counts as the machine's own speed (None: unreadable
    here, so it counts)."""
    return share is None or share <= QUIET_MAX_SHARE


def describe(share: float | None) -> str:
    return ("machine load not readable here" if share is None else
            f"other processes took {share:.0%} of the CPUs, quiet is at most {QUIET_MAX_SHARE:.0%}")
