"""`vlora-va run`: the daemon and the ingest workers as separate processes, supervised.

    start daemon ─► wait until it listens ─► start ingest workers ─► supervise until the sources end
    (or Ctrl-C / SIGTERM) ─► stop ingest (each flushes its queue, stays connected) ─► stop daemon (it
    drains: every chunk sent gets its result, sinks are flushed) ─► ingest workers disconnect and exit

Supervision (Frigate's per-camera watchdog): a child that dies is started again with backoff (RESTART_INITIAL_S
doubling to RESTART_MAX_S; a child that ran STABLE_S starts afresh). A restarted ingest worker continues its
streams where the dead one left them (`vlora_va.ingest.stream_position`: chunk numbers go on, the time down is reported as
an outage, chunks it made but never sent as `dropped_before`). A restarted daemon is reconnected to by the
running workers on their own (ZeroMQ); meanwhile their queues apply the drop policy, and the first chunk each
stream sends afterwards says how many were dropped. What was in flight when a child died is lost: at most
`inflight_bound` chunks per worker (README, *Reliability*).

SIGHUP re-reads the pipeline file: added, removed and changed streams start and stop their workers (the other
workers' streams are not touched), added, changed and removed adapters are loaded and unloaded through the
daemon's control socket. A file that does not validate is refused (logged) and the running pipeline is left as
it is; changes to daemon:, ingest:, sinks: and security: take a restart (logged).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from vlora_va.common.logs import setup_logging
from vlora_va.contracts.config import ConfigError, PipelineConfig, load_config
from vlora_va.contracts.plugins import load_plugins

log = logging.getLogger(__name__)

DAEMON_START_TIMEOUT_S = 300.0
DAEMON_DRAIN_TIMEOUT_S = 600.0
RESTART_INITIAL_S = 0.5
RESTART_MAX_S = 30.0
STABLE_S = 60.0  # a child that ran this long before it died starts its backoff afresh
DAEMON_MAX_FAILED_STARTS = 5  # a daemon that dies this many times in a row before it is ready: give up
POLL_S = 0.1
CONTROL_TIMEOUT_S = 120.0
PARENT_CHECK_S = 1.0


def _as_child(parent_pid: int, on_orphaned) -> None:
    """Signals in a child: Ctrl-C and SIGTERM reach the whole process group (a terminal, systemd's
    control-group kill) and SIGHUP a closing terminal, but the parent decides the shutdown order, so the child
    ignores them. Should the parent die without stopping it, the child stops itself (no orphans)."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        log.error("the supervising vlora-va run (pid %d) is gone: stopping", parent_pid)
        on_orphaned()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@contextmanager
def signals_ignored_for_children():
    """Start child processes inside this: a spawned child runs a fresh interpreter and ignores Ctrl-C only once
    `_as_child` has run, so a Ctrl-C to the process group while it is still importing (a worker started just
    before, e.g. by a reload) killed it with KeyboardInterrupt and made the run exit 1. Ignored signals stay
    ignored across exec: a child started here ignores them from birth. A signal to this process in the few
    milliseconds of the start is lost (press Ctrl-C again). Only the main thread can change signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def daemon_process(config: PipelineConfig, stop, ready, drained, log_level: str, parent_pid: int) -> None:
    setup_logging(log_level, "daemon")
    _as_child(parent_pid, stop.set)
    load_plugins(config.plugins)  # a spawned child starts with empty registries
    from vlora_va.outputs.attach import serve

    status = serve(config, stop, ready, drained)
    if status:
        raise SystemExit(status)


def ingest_process(config: PipelineConfig, stream_ids: list[str], stop, flushed, release, log_level: str,
                   worker: int, resume: dict, parent_pid: int) -> None:
    setup_logging(log_level, f"ingest-{worker}")
    _as_child(parent_pid, lambda: (stop.set(), release.set()))
    load_plugins(config.plugins)  # a spawned child starts with empty registries
    from vlora_va.ingest.worker import run_ingest

    run_ingest(config, stream_ids, stop, flushed, release, resume)


def say_http_url(config, daemon_pid: int | None) -> None:
    """Log the dashboard's URL once the daemon answers there (not another process that holds the port)."""
    d = config.daemon
    if not d.http_port:
        return
    from vlora_va.outputs.dashboard import url_for

    url = url_for(d.http_host, d.http_port)
    try:
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with no_proxy.open(url + "healthz", timeout=2) as r:
            pid = json.load(r).get("pid")
    except (OSError, ValueError, AttributeError):
        pid = None
    if pid != daemon_pid:
        log.warning("the daemon's HTTP server does not answer on %s (see the daemon's log)", url)
    elif d.dashboard:
        log.info("dashboard: %s", url)
    else:
        log.info("metrics and health checks: %smetrics, %shealthz, %sreadyz", url, url, url)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Backoff:
    """RESTART_INITIAL_S doubling to RESTART_MAX_S; a child that ran STABLE_S before dying starts afresh."""

    def __init__(self, initial: float = RESTART_INITIAL_S, maximum: float = RESTART_MAX_S):
        self.initial, self.maximum, self.n = initial, maximum, 0

    def next(self, ran_s: float) -> float:
        if ran_s >= STABLE_S:
            self.n = 0
        delay = min(self.initial * 2 ** self.n, self.maximum)
        self.n += 1
        return delay


@dataclasses.dataclass
class Child:
    name: str
    process: mp.Process | None = None
    started: float = 0.0
    restart_at: float | None = None  # a restart is due then (the child died)
    restarts: int = 0
    backoff: Backoff = dataclasses.field(default_factory=Backoff)

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


@dataclasses.dataclass
class DaemonChild(Child):
    stop: object = None
    ready: object = None
    drained: object = None
    ready_seen: bool = False
    failed_starts: int = 0


@dataclasses.dataclass
class WorkerChild(Child):
    index: int = 0
    streams: list[str] = dataclasses.field(default_factory=list)
    stop: object = None
    flushed: object = None
    release: object = None
    retiring: bool = False  # stopped by a reload; released close_grace_s after it flushed
    release_at: float | None = None
    after: "WorkerChild | None" = None  # start only once this retiring worker has flushed (same streams)


class Supervisor:
    def __init__(self, config_path: str | Path, log_level: str = "INFO"):
        self.path, self.log_level = str(config_path), log_level
        self.config = load_config(self.path)
        self.ctx = mp.get_context("spawn")  # no fork: torch and zmq state must not be copied into children
        self.resume: dict[str, object] = {}  # stream id -> its StreamPosition (vlora_va/ingest/stream_position.py)
        self.workers: list[WorkerChild] = []
        self.daemon = DaemonChild("daemon")
        self.signals = 0
        self.reload_requested = False
        self.reloads = 0
        self._next_index = 0
        self._pending_unload: list[str] = []

    # ------------------------------------------------------------------ signals
    def _on_stop(self, signum, _frame) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info("%s received: stopping ingest, then draining the daemon", signal.Signals(signum).name)
        else:
            log.info("%s received again: draining the daemon now (what ingest has not sent yet is not served)",
                     signal.Signals(signum).name)
            if self.daemon.stop is not None:
                self.daemon.stop.set()

    def _on_hup(self, _signum, _frame) -> None:
        self.reload_requested = True

    # ------------------------------------------------------------------ children
    def _start_daemon(self) -> None:
        d = self.daemon
        d.stop, d.ready, d.drained = self.ctx.Event(), self.ctx.Event(), self.ctx.Event()
        d.ready_seen, d.restart_at, d.started = False, None, time.monotonic()
        d.process = self.ctx.Process(target=daemon_process, name="daemon",
                                     args=(self.config, d.stop, d.ready, d.drained, self.log_level, os.getpid()))
        with signals_ignored_for_children():
            d.process.start()
        log.info("daemon started (pid %d)", d.process.pid)

    def _start_worker(self, w: WorkerChild) -> None:
        from vlora_va.ingest.stream_position import StreamPosition

        for sid in w.streams:
            if sid not in self.resume:
                self.resume[sid] = StreamPosition.shared(self.ctx)
        w.stop, w.flushed, w.release = self.ctx.Event(), self.ctx.Event(), self.ctx.Event()
        w.restart_at, w.started = None, time.monotonic()
        w.process = self.ctx.Process(
            target=ingest_process, name=f"ingest-{w.index}",
            args=(self.config, w.streams, w.stop, w.flushed, w.release, self.log_level, w.index,
                  {sid: self.resume[sid] for sid in w.streams}, os.getpid()))
        with signals_ignored_for_children():
            w.process.start()
        log.info("ingest worker %d (pid %d): streams %s", w.index, w.process.pid, ", ".join(w.streams))

    def _new_worker(self, streams: list[str], after: WorkerChild | None = None) -> WorkerChild:
        w = WorkerChild(f"ingest-{self._next_index}", index=self._next_index, streams=list(streams), after=after)
        self._next_index += 1
        self.workers.append(w)
        if after is None:
            self._start_worker(w)
        return w

    def _wait_first_ready(self) -> bool:
        d = self.daemon
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while not d.ready.wait(0.2):
            if not d.process.is_alive() or time.monotonic() > deadline or self.signals:
                log.error("the daemon did not start (%s)", describe_exit(d.process.exitcode))
                return False
        d.ready_seen = True
        return True

    def _watch_daemon(self) -> bool:
        """Restart a dead daemon with backoff. False when it cannot be brought back."""
        d, now = self.daemon, time.monotonic()
        if d.alive():
            if not d.ready_seen:
                if d.ready.is_set():
                    d.ready_seen, d.failed_starts = True, 0
                    log.info("daemon restarted and ready (restart %d); ingest workers reconnect by themselves",
                             d.restarts)
                elif now - d.started > DAEMON_START_TIMEOUT_S:
                    log.error("the restarted daemon was not ready in %.0f s: killing it", DAEMON_START_TIMEOUT_S)
                    d.process.kill()
            return True
        if d.restart_at is None:
            if not d.ready_seen:
                d.failed_starts += 1
                if d.failed_starts >= DAEMON_MAX_FAILED_STARTS:
                    log.error("the daemon died %d times before it was ready (%s): giving up", d.failed_starts,
                              describe_exit(d.process.exitcode))
                    return False
            delay = d.backoff.next(now - d.started)
            d.restart_at = now + delay
            log.error("the daemon died (%s) after %.0f s; restarting it in %.1f s (ingest keeps running: what it "
                      "queues meanwhile is subject to its drop policy and counted)", describe_exit(d.process.exitcode),
                      now - d.started, delay)
        elif now >= d.restart_at:
            d.restarts += 1
            self._start_daemon()
        return True

    def _watch_workers(self) -> None:
        now = time.monotonic()
        for w in list(self.workers):
            if w.process is None:  # waiting for the retiring worker that had its streams
                if w.after is None or w.after.flushed.is_set() or not w.after.alive():
                    w.after = None
                    self._start_worker(w)
                continue
            if w.retiring:
                if w.release_at is None and (w.flushed.is_set() or not w.alive()):
                    w.release_at = now + self.config.ingest.close_grace_s
                if w.release_at is not None and now >= w.release_at:
                    w.release.set()
                if not w.alive():
                    log.info("ingest worker %d (streams %s) stopped (%s)", w.index, ", ".join(w.streams),
                             describe_exit(w.process.exitcode))
                    self.workers.remove(w)
                continue
            if w.alive() or w.process.exitcode == 0:
                continue
            if w.restart_at is None:
                delay = w.backoff.next(now - w.started)
                w.restart_at = now + delay
                log.error("ingest worker %d (streams %s) died (%s); restarting it in %.1f s", w.index,
                          ", ".join(w.streams), describe_exit(w.process.exitcode), delay)
            elif now >= w.restart_at:
                w.restarts += 1
                self._start_worker(w)
        if self._pending_unload and not any(w.retiring and not w.flushed.is_set() for w in self.workers):
            names, self._pending_unload = self._pending_unload, []
            for name in names:
                self._control("unload", name=name)

    def _sources_ended(self) -> bool:
        """Every worker has handed all its chunks to ZeroMQ (its streams ended) and none is to be restarted."""
        active = [w for w in self.workers if not w.retiring]
        return all(w.process is not None and w.restart_at is None and
                   (w.flushed.is_set() or (not w.alive() and w.process.exitcode == 0)) for w in active)

    # ------------------------------------------------------------------ reload (SIGHUP)
    def _control(self, op: str, **kw) -> dict | None:
        from vlora_va.serving.control import control_endpoint, request

        d = self.config.daemon
        endpoint = control_endpoint(d.control_endpoint, d.endpoint)
        if not (self.daemon.alive() and self.daemon.ready.is_set()):
            log.info("reload: the daemon is restarting; it takes the adapters from the file (%s %s skipped)", op,
                     kw.get("name"))
            return None
        try:
            reply = request(endpoint, {"op": op, **kw}, timeout_s=CONTROL_TIMEOUT_S, curve=self.config.security.curve)
        except TimeoutError as e:
            log.error("reload: adapter %s %s: %s", op, kw.get("name"), e)
            return None
        if reply.get("ok"):
            log.info("reload: adapter %s %s (slot %s)", kw.get("name"), {"load": "reloaded" if reply.get("reloaded")
                     else "loaded", "unload": "unloaded"}[op], reply.get("slot"))
        else:
            log.error("reload: adapter %s %s refused: %s", op, kw.get("name"), reply.get("error"))
        return reply

    def reload(self) -> None:
        self.reload_requested = False
        try:
            new = load_config(self.path)
        except ConfigError as e:
            for problem in e.errors:  # one line each: a log line never spans lines
                log.error("SIGHUP: %s; not reloaded: the running pipeline is unchanged", problem)
            return
        old = self.config
        fixed = [name for name in ("daemon", "ingest", "sinks", "security", "cluster")
                 if getattr(new, name) != getattr(old, name)]
        if fixed:
            log.warning("SIGHUP: %s changed in %s: that takes a restart of vlora-va run; applying streams and "
                        "adapters only", ", ".join(f"{n}:" for n in fixed), self.path)
        old_s, new_s = {s.id: s for s in old.streams}, {s.id: s for s in new.streams}
        removed = [sid for sid in old_s if sid not in new_s]
        added = [sid for sid in new_s if sid not in old_s]
        changed = [sid for sid in new_s if sid in old_s and new_s[sid] != old_s[sid]]
        a_added = [n for n in new.adapters if n not in old.adapters]
        a_changed = [n for n in new.adapters if n in old.adapters and new.adapters[n] != old.adapters[n]]
        a_removed = [n for n in old.adapters if n not in new.adapters]
        self.reloads += 1
        log.info("SIGHUP: reloading %s: streams +%s -%s ~%s; adapters +%s -%s ~%s", self.path, added or "[]",
                 removed or "[]", changed or "[]", a_added or "[]", a_removed or "[]", a_changed or "[]")
        self.config = dataclasses.replace(old, adapters=new.adapters, streams=new.streams)
        for name in a_added + a_changed:  # before any stream asks for them
            self._control("load", name=name, path=str(Path(new.adapters[name]).resolve()), pin=True)
        touched = set(removed) | set(changed)
        for sid in changed:  # a changed stream is a new stream under the same id: it may run again
            if sid in self.resume:
                self.resume[sid].ended = False
        for w in [w for w in self.workers if not w.retiring and set(w.streams) & touched]:
            self._retire(w)
            keep = [sid for sid in w.streams if sid not in removed]
            if keep:  # its other streams go on in a new worker, from where this one leaves them
                self._new_worker(keep, after=w)
        n = self.config.ingest.streams_per_worker
        for i in range(0, len(added), n):
            for sid in added[i:i + n]:
                self.resume.pop(sid, None)  # an id that was removed before starts afresh
            self._new_worker(added[i:i + n])
        self._pending_unload += a_removed  # once the streams that used them have flushed

    def _retire(self, w: WorkerChild) -> None:
        w.retiring = True
        if w.process is None:  # never started: nothing to stop
            self.workers.remove(w)
            return
        w.stop.set()
        log.info("ingest worker %d (streams %s): stopping for the reload", w.index, ", ".join(w.streams))

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        from vlora_va.ingest.worker import plan_workers

        handlers = {signal.SIGINT: self._on_stop, signal.SIGTERM: self._on_stop, signal.SIGHUP: self._on_hup}
        old = {s: signal.signal(s, h) for s, h in handlers.items()}
        try:
            self._start_daemon()
            if not self._wait_first_ready():
                return 1
            say_http_url(self.config, self.daemon.process.pid)
            for stream_ids in plan_workers(self.config):
                self._new_worker(stream_ids)
            while not self.signals:
                if self.reload_requested:
                    self.reload()
                if not self._watch_daemon():
                    return self._shutdown(failed=True)
                self._watch_workers()
                if self._sources_ended():
                    break
                time.sleep(POLL_S)
            return self._shutdown()
        finally:
            self._cleanup()
            for s, h in old.items():
                signal.signal(s, h)

    def _shutdown(self, failed: bool = False) -> int:
        """Stop ingest (each worker flushes what it queued), then drain the daemon, then release the workers."""
        d = self.daemon
        workers = [w for w in self.workers if w.process is not None]
        for w in workers:
            w.stop.set()
        # A worker is done once everything it made is handed to ZeroMQ; it stays connected until the daemon
        # has drained (ZeroMQ would drop what is in flight if it disconnected earlier). A second signal cuts
        # this short.
        while d.alive() and self.signals < 2 and any(w.alive() and not w.flushed.is_set() for w in workers):
            time.sleep(POLL_S)
        if not d.alive():
            log.error("the daemon is not running at shutdown (%s)", describe_exit(d.process.exitcode))
            failed = True
        d.stop.set()
        d.process.join(DAEMON_DRAIN_TIMEOUT_S)
        for w in workers:
            w.release.set()  # also when the daemon died: workers must not wait for it
        for w in workers:
            w.process.join(30)
        restarts = sum(w.restarts for w in self.workers)
        if d.restarts or restarts or self.reloads:
            log.info("supervisor: %d daemon restart(s), %d ingest worker restart(s), %d reload(s)", d.restarts,
                     restarts, self.reloads)
        ok = d.process.exitcode == 0 and all(w.process.exitcode == 0 for w in workers)
        return 0 if ok and not failed else 1

    def _cleanup(self) -> None:
        d = self.daemon
        for w in self.workers:
            if w.process is not None:
                w.stop.set()
                w.release.set()
        if d.process is not None:
            d.stop.set()
        for p in [*(w.process for w in self.workers if w.process is not None), d.process]:
            if p is None:
                continue
            p.join(10)
            if p.is_alive():
                log.warning("%s did not stop in time: killing it", p.name)
                p.kill()
                p.join(10)


def run_pipeline(config_path: str | Path, log_level: str = "INFO") -> int:
    """Run everything until the sources end or a signal arrives. Returns a process exit code."""
    return Supervisor(config_path, log_level).run()
