"""`vlora-va run`: the daemon and the ingest workers as separate processes, started and stopped in order.

    start daemon ─► wait until it listens ─► start ingest workers ─► wait until the sources end
    (or Ctrl-C / SIGTERM) ─► stop ingest (each flushes its queue, stays connected) ─► stop daemon (it
    drains: every chunk sent gets its result, sinks are flushed) ─► ingest workers disconnect and exit
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
from pathlib import Path

from contracts.config import load_config
from .logs import setup_logging

log = logging.getLogger(__name__)

DAEMON_START_TIMEOUT_S = 300.0
DAEMON_DRAIN_TIMEOUT_S = 600.0


def _children_ignore_ctrl_c() -> None:
    # Ctrl-C reaches the whole process group; the parent decides the shutdown order instead.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def daemon_process(config_path: str, stop, ready, drained, log_level: str) -> None:
    _children_ignore_ctrl_c()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    setup_logging(log_level, "daemon")
    from .daemon import Daemon

    Daemon(load_config(config_path)).run(stop, ready, drained)


def ingest_process(config_path: str, stream_ids: list[str], stop, flushed, release, log_level: str,
                   worker: int) -> None:
    _children_ignore_ctrl_c()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    setup_logging(log_level, f"ingest-{worker}")
    from streams.worker import run_ingest

    run_ingest(load_config(config_path), stream_ids, stop, flushed, release)


def run_pipeline(config_path: str | Path, log_level: str = "INFO") -> int:
    """Run everything until the sources end or a signal arrives. Returns a process exit code."""
    from streams.worker import plan_workers

    config_path = str(config_path)
    config = load_config(config_path)
    ctx = mp.get_context("spawn")  # no fork: torch and zmq state must not be copied into children
    daemon_stop, daemon_ready, daemon_drained, ingest_stop = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    signals = {"n": 0}

    def on_signal(signum, _frame):
        signals["n"] += 1
        log.info("%s received: stopping ingest, then draining the daemon", signal.Signals(signum).name)
        ingest_stop.set()
        if signals["n"] > 1:
            daemon_stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    daemon = ctx.Process(target=daemon_process, name="daemon",
                         args=(config_path, daemon_stop, daemon_ready, daemon_drained, log_level))
    daemon.start()
    workers: list = []  # (process, flushed event)
    try:
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while not daemon_ready.wait(0.2):
            if not daemon.is_alive() or time.monotonic() > deadline or ingest_stop.is_set():
                log.error("the daemon did not start (exit code %s)", daemon.exitcode)
                daemon_stop.set()
                return 1
        for i, stream_ids in enumerate(plan_workers(config)):
            flushed = ctx.Event()
            p = ctx.Process(target=ingest_process, name=f"ingest-{i}",
                            args=(config_path, stream_ids, ingest_stop, flushed, daemon_drained, log_level, i))
            p.start()
            workers.append((p, flushed))
            log.info("ingest worker %d: streams %s", i, ", ".join(stream_ids))
        # A worker is done once everything it made is handed to ZeroMQ; it stays connected until the
        # daemon has drained (ZeroMQ would drop what is in flight if it disconnected earlier).
        for p, flushed in workers:
            while p.is_alive() and daemon.is_alive() and not flushed.wait(0.5):
                pass
        if not daemon.is_alive():
            log.error("the daemon exited early (exit code %s)", daemon.exitcode)
            ingest_stop.set()
        daemon_stop.set()
        daemon.join(DAEMON_DRAIN_TIMEOUT_S)
        daemon_drained.set()  # also when the daemon died: workers must not wait for it
        for p, _ in workers:
            p.join(30)
        return 0 if daemon.exitcode == 0 and all(p.exitcode == 0 for p, _ in workers) else 1
    finally:
        ingest_stop.set()
        daemon_stop.set()
        daemon_drained.set()
        for p in [*(w for w, _ in workers), daemon]:
            p.join(10)
            if p.is_alive():
                log.warning("%s did not stop in time: terminating it", p.name)
                p.terminate()
        for s, h in old.items():
            signal.signal(s, h)
