"""What the benchmarks say about the machine they ran on."""

from __future__ import annotations

from vlora_va.common.host import cpu_name

__all__ = ["cpu_name", "rss_mb"]


def rss_mb() -> float:
    """This process's resident memory in MB (/proc/self/status VmRSS; 0 where there is none)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
