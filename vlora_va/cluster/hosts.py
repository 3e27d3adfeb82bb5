"""What runs inside the cluster's actors: a daemon, the ingest of some streams, the collector. Plain classes; the
controller (controller.py) makes Ray actors of them, so each can also be tested without Ray.

    DaemonHost   one inference daemon: free ports on its node, rows to the collector, adapters loaded and unloaded on
                 the controller's word, streams released when they move away
    IngestHost   each of its streams in its own ingest worker (run_ingest) with a Route the controller can change,
                 and the ledger of what was sent to which daemon
    CollectorHost the collector (collector.py) on a port of its node

Frames go ingest → daemon over ZeroMQ, never through Ray: Ray places the actors, restarts them and carries the
controller's calls.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from contextlib import ExitStack

from vlora_va.common.logs import setup_logging
from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.plugins import load_plugins

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0  # a daemon builds its engine, measures (or loads) its costs and warms up first
STOP_TIMEOUT_S = 600.0


def free_port(host: str) -> int:
    """A TCP port free on `host` now (the OS's choice). The daemon binds it a moment later; another process taking
    it in between makes the daemon fail to start, and Ray starts it again on fresh ports."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_address() -> str:
    """The address other nodes reach this one at: Ray's node IP inside a cluster, loopback outside one."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def address_and_free_port(host: str = "") -> tuple[str, int]:
    """On the node this runs on: the address to bind (`host`, default the node's own) and a free port there."""
    host = host or node_address()
    return host, free_port(host)


class DaemonHost:
    def __init__(self, config: PipelineConfig, name: str, collector: str, threads: int = 0, host: str = "",
                 log_level: str = "INFO"):
        """config: the pipeline; name: this daemon's; collector: the collector's endpoint; threads: torch threads
        (0: daemon.threads); host: the address to bind (default: this node's)."""
        setup_logging(log_level, f"daemon-{name}")
        load_plugins(config.plugins)  # a new process starts with empty registries
        from vlora_va.serving.daemon import Daemon

        self.name, self.collector = name, collector
        host = host or node_address()
        d = config.daemon
        d = dataclasses.replace(
            d, endpoint=f"tcp://{host}:{free_port(host)}",
            control_endpoint=f"tcp://127.0.0.1:{free_port('127.0.0.1')}",  # the controller's calls arrive here
            results_endpoint=None, threads=threads or d.threads,
            http_port=free_port(d.http_host) if d.http_port else 0, metrics_port=0)
        self.config = dataclasses.replace(config, daemon=d, sinks=())
        self.started = time.time()
        self.daemon = Daemon(self.config)
        # the collector owns <prefix>/available; each daemon says <prefix>/daemons/<name>/available on the broker of
        # every mqtt sink, until stop() (its last will says "offline" when the process dies)
        self._availability = ExitStack()
        for sink in config.sinks:
            if sink.type == "mqtt":
                from vlora_va.outputs.availability import DaemonAvailability

                self._availability.enter_context(DaemonAvailability(sink, name))
        self._stop = threading.Event()
        self._drained = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"daemon-{name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        from vlora_va.outputs.dashboard.server import start_http
        from vlora_va.outputs.sinks.zmq_push import CollectorSink

        def open_sinks(stack):
            return [stack.enter_context(CollectorSink(self.collector, self.name, self.config.security.curve))]

        http = start_http(self.daemon)
        try:
            self.daemon.run(self._stop, drained=self._drained, open_sinks=open_sinks)
        except BaseException as e:  # noqa: BLE001 - said by ready()/ping(); Ray restarts a dead actor
            self._failed = e
            log.exception("daemon %s failed", self.name)
            os._exit(1)  # a daemon that cannot serve must look dead to the controller, not idle
        finally:
            if http is not None:
                http.close()

    # ------------------------------------------------------------------ the controller's calls
    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict:
        """Wait until the daemon listens; then where it is and what it holds."""
        if not self.daemon.ready.wait(timeout_s):
            raise TimeoutError(f"daemon {self.name} was not ready in {timeout_s:.0f} s")
        return self.info()

    def info(self) -> dict:
        d = self.config.daemon
        return {"name": self.name, "endpoint": d.endpoint, "control": d.control_endpoint, "pid": os.getpid(),
                "node": node_address(), "started": self.started, "http_port": d.http_port,
                "adapters": sorted(self.daemon.catalog.adapters), "max_slots": d.max_slots}

    def ping(self) -> float:
        return time.time()

    def status(self) -> dict:
        """What the placement reads: the adapters held, the offered load (admission's measure, 1.0 = the machine's
        capacity), the queue, the totals."""
        s = self.daemon.snapshot()
        return {"name": self.name, "adapters": sorted(s["adapters"]), "offered_load": s["offered_load"],
                "queue": s["queue"], "totals": s["totals"], "ready": s["ready"], "pid": os.getpid()}

    def stream_loads(self, stream_ids: list[str]) -> dict[str, float]:
        """Each stream's cost here alone: seconds of compute per second of video (the admission estimate)."""
        from vlora_va.serving.capacity import estimate

        out = {}
        for sid in stream_ids:
            one = dataclasses.replace(self.config, streams=(self.config.stream(sid),))
            out[sid] = estimate(one, self.daemon.catalog, self.daemon.costs).need_s
        return out

    def adapter(self, op: str, name: str, path: str = "") -> dict:
        """Load or unload an adapter through the daemon's own control socket (the checks of `vlora-va adapters`)."""
        from vlora_va.serving.control import request

        message = {"op": op, "name": name, **({"path": path, "pin": True} if op == "load" else {})}
        return request(self.config.daemon.control_endpoint, message, curve=self.config.security.curve)

    def cluster_view(self, view: dict) -> None:
        """The controller's latest view of the cluster: this daemon's dashboard shows it (status()["cluster"])."""
        self.daemon.cluster_view = view

    def release_stream(self, stream: str) -> None:
        self.daemon.release_stream(stream)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict:
        """Drain (every request received is answered, the rows reach the collector) and stop."""
        self._stop.set()
        self._drained.wait(timeout_s)
        self._thread.join(timeout_s)
        self._availability.close()
        t = self.daemon.totals
        return {"name": self.name, "requests": t.requests, "ok": t.ok, "shed": t.shed, "errors": t.errors}


class IngestHost:
    def __init__(self, config: PipelineConfig, routes: dict[str, tuple[str, str]], log_level: str = "INFO",
                 resume: dict[str, list[float]] | None = None):
        """routes: stream id -> (daemon endpoint, daemon name) to start with. Each stream runs in its own ingest
        worker, so one stream can follow its daemon without disturbing the others. resume: stream id -> where a lost
        ingest actor left it (`positions()`' values): its chunk numbers and media time go on from there."""
        setup_logging(log_level, "ingest")
        load_plugins(config.plugins)
        from vlora_va.ingest.route import Route, SentLedger
        from vlora_va.ingest.stream_position import StreamPosition
        from vlora_va.ingest.worker import run_ingest

        self.ledger = SentLedger()
        self.routes = {sid: Route(endpoint, daemon) for sid, (endpoint, daemon) in routes.items()}
        resume = resume or {}
        self._positions = {sid: StreamPosition(list(resume[sid]) if sid in resume else None) for sid in routes}
        self._stop, self._release = threading.Event(), threading.Event()
        self._flushed = {sid: threading.Event() for sid in routes}
        self._stats: dict[str, dict] = {}
        self._threads = {}
        for sid in routes:
            def run(sid=sid):
                stats = run_ingest(config, [sid], self._stop, self._flushed[sid], self._release,
                                   resume={sid: self._positions[sid]}, route=self.routes[sid], ledger=self.ledger)
                self._stats[sid] = stats.get(sid)
            self._threads[sid] = threading.Thread(target=run, name=f"ingest-{sid}", daemon=True)
            self._threads[sid].start()

    def move(self, stream: str, endpoint: str, daemon: str, linger_s: float) -> None:
        self.routes[stream].set(endpoint, daemon, linger_s)

    def take_sent(self, daemon: str, timeout_s: float = 2.0) -> list[dict]:
        """What was sent to `daemon` (it died), once every stream has followed its latest route (a chunk sent to the
        dead daemon a moment ago is in the ledger then)."""
        deadline = time.monotonic() + timeout_s
        while not all(r.followed() for sid, r in self.routes.items() if not self._flushed[sid].is_set()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return [c.to_json() for c in self.ledger.take(daemon)]

    def latest_sent(self, daemon: str) -> dict[str, int]:
        """Per stream, the last chunk seq sent to `daemon` so far (what it owes at most; the ledger keeps them)."""
        return self.ledger.latest(daemon)

    def positions(self) -> dict[str, list[float]]:
        """Per stream, where it stands (StreamPosition's values): what a new ingest actor continues from if this one
        is lost (the controller asks every second for live streams)."""
        return {sid: p.values() for sid, p in self._positions.items()}

    def progress(self) -> dict:
        """Per stream: flushed (everything it made is handed to ZeroMQ), finished (its worker returned), its stats."""
        return {sid: {"flushed": self._flushed[sid].is_set(), "finished": not t.is_alive(),
                      "stats": self._stats.get(sid)} for sid, t in self._threads.items()}

    def stop(self) -> None:
        """Stop the sources; each worker flushes what it queued, then waits for release()."""
        self._stop.set()

    def release(self) -> dict:
        """The daemons have drained: the workers disconnect and end."""
        self._release.set()
        for t in self._threads.values():
            t.join(30)
        return self.progress()


class CollectorHost:
    def __init__(self, config: PipelineConfig, host: str = "", port: int = 0, log_level: str = "INFO"):
        """host, port: where daemons connect (default: this node's address; 0: any free port). The controller gives
        a fixed port, so a collector Ray restarts binds the address the daemons know."""
        setup_logging(log_level, "collector")
        load_plugins(config.plugins)
        from vlora_va.cluster.collector import Collector

        self.collector = Collector(config, f"tcp://{host or node_address()}:{port or '*'}")

    def endpoint(self) -> str:
        return self.collector.endpoint

    def pid(self) -> int:
        return os.getpid()

    def settle(self, daemon: str) -> None:
        self.collector.settle(daemon)

    def lost(self, daemon: str, chunks: list[dict]) -> int:
        from vlora_va.ingest.route import SentChunk

        return self.collector.lost(daemon, [SentChunk.from_json(c) for c in chunks])

    def event(self, row: dict) -> None:
        self.collector.event(row)

    def snapshot(self) -> dict:
        return self.collector.snapshot()

    def close(self) -> dict:
        snap = self.collector.snapshot()
        self.collector.close()
        return snap
