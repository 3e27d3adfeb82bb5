"""What benches and tests share to run the product and read its figures: a free port, a percentile, a CLI
process (the daemon, an ingest worker) with its log in a file, and the books of "every chunk sent has one row".

The free port is the product's own (the cluster picks its daemons' ports with it): not a third copy.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from vlora_va.cluster.hosts import free_port as free_port_on
from vlora_va.common.percentile import percentile  # noqa: F401 - the benches' percentile is the project's one

ROOT = Path(__file__).resolve().parents[2]  # the checkout the benches run from
POLL_S = 0.25


def row_books(rows: list[dict], sent: dict[str, int]) -> dict:
    """Result rows against what ingest says it sent (stream -> chunks 0..n-1): "duplicates", (stream, chunk) -> rows
    for keys with more than one; per stream of `sent`, "missing" (chunks sent without a row) and "extra" (rows of
    chunks it did not send). All empty: every chunk sent has exactly one row."""
    keys = collections.Counter((r["stream"], r["chunk"]) for r in rows)
    books: dict = {"duplicates": {k: n for k, n in keys.items() if n > 1}, "missing": {}, "extra": {}}
    for sid, n in sent.items():
        got, want = {c for s, c in keys if s == sid}, set(range(n))
        if want - got:
            books["missing"][sid] = sorted(want - got)
        if got - want:
            books["extra"][sid] = sorted(got - want)
    return books


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (loopback unless told): cluster.hosts.free_port."""
    return free_port_on(host)


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child only calls into it
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: killed when the bench process dies, so a bench killed by its time cap leaves no
    daemon or ingest worker behind (the CLI's daemon and ingest commands have no parent watch of their own; and a
    daemon told SIGTERM during start-up would finish measuring and warming up first). Nobody reads the results then."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class Child:
    """A `python -m vlora_va.cli ...` process, its stderr (the log) in a file."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None):
        """env: variables added to this process's environment (e.g. an ISA cap for the daemon)."""
        self.log = log
        self._file = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "vlora_va.cli", *args], cwd=ROOT,
                                     env={**child_env(), **(env or {})},
                                     stdout=subprocess.DEVNULL, stderr=self._file, preexec_fn=_die_with_parent)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def reap(self, deadline: float) -> int:
        """Wait until the monotonic deadline, then kill. Returns the exit code (negative: the signal)."""
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._file.close()
        return self.proc.returncode

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def stop_all(children: list[Child], timeout_s: float) -> list[int]:
    """SIGTERM to each, then each is waited for until one shared deadline and killed past it: the exit codes."""
    for c in children:
        c.terminate()
    deadline = time.monotonic() + timeout_s
    return [c.reap(deadline) for c in children]


def wait_daemon_ready(daemon: Child, timeout_s: float) -> None:
    """Until the daemon's log says it is ready; a RuntimeError with its last lines if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "daemon ready" in daemon.text():
            return
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited {daemon.proc.returncode} before it was ready:\n"
                               + "\n".join(daemon.text().splitlines()[-20:]))
        time.sleep(POLL_S)
    raise RuntimeError(f"the daemon was not ready within {timeout_s:.0f} s")
