"""The daemon's HTTP server (aiohttp, on its own thread and event loop): dashboard, /events, /metrics, /healthz,
/readyz, and the events' snapshot JPEGs under /snapshots/ (only files inside `snapshots.dir`). It reads the daemon
(status(), the metrics registry, the Hub fed by its taps) and never blocks it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from urllib.parse import quote, urlsplit

from vlora_va.contracts.security import is_local_host
from vlora_va.outputs.dashboard import url_for
from vlora_va.outputs.dashboard.hub import HISTORY_S, Hub, encode

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
TICK_S = 1.0  # one update a second for every stream together, whatever the number of cameras
RATE_WINDOW_S = 10.0  # images/s and the mean batch size are over this long
CLIENT_QUEUE = 8  # updates waiting for a slow page; past that it is cut off (its EventSource reconnects)
SHUTDOWN_S = 3.0
# The page loads nothing from elsewhere (frames arrive as data: URLs inside the event stream).
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'"


def start_http(daemon) -> "HttpServer | PrometheusOnly | None":
    """The server for daemon.http_port (None when it is 0 or cannot be bound: the daemon serves without it)."""
    d = daemon.config.daemon
    if not d.http_port:
        return None
    if not is_local_host(d.http_host):
        log.warning("daemon.http_host is %s, not loopback: the dashboard, /metrics and the health checks are open "
                    "to the network, with no authentication", d.http_host)
    try:
        import aiohttp  # noqa: F401
        server = HttpServer(daemon, d.http_host, d.http_port, dashboard=d.dashboard, frame_s=d.dashboard_frame_s)
    except ImportError:
        log.warning("aiohttp is not installed (pip install \"vlora-va[dashboard]\"): serving /metrics only, "
                    "no dashboard or health checks")
        server = PrometheusOnly(daemon.metrics.registry, d.http_host, d.http_port)
    try:
        server.start()
    except OSError as e:
        log.error("HTTP server not started: cannot bind %s:%d (%s); serving without the dashboard, /metrics and the "
                  "health checks (set daemon.http_port to a free port)", d.http_host, d.http_port, e.strerror or e)
        return None
    if isinstance(server, PrometheusOnly):
        log.info("/metrics on %smetrics", server.url)
    else:
        log.info("dashboard on %s (also /metrics, /healthz, /readyz)" if d.dashboard else
                 "/metrics, /healthz and /readyz on %s", server.url)
    return server


# ---------------------------------------------------------------- health
STALL_S = 120.0  # /healthz reports the daemon stalled when its loop has not gone round for this long
def sink_problems(daemon) -> dict[str, str]:
    """Sink name -> why it cannot write, for every sink that cannot. A sink object that has `health()` says it
    (None = fine, else a sentence); otherwise a file sink is checked for a writable path."""
    problems = {}
    sinks = daemon.row_writer.sinks or list(daemon.config.sinks)  # not serving yet: the configured ones
    for s in sinks:
        where = getattr(s, "options", s)  # a configured sink (SinkConfig): its own keys name its file or URL
        name = getattr(s, "name", None) or f"{s.type}:{getattr(where, 'path', '') or getattr(where, 'url', '')}"
        health = getattr(s, "health", None)
        if callable(health):
            problem = health()
        else:
            path = getattr(where, "path", None)
            problem = _unwritable(Path(path)) if path else None
        if problem:
            problems[name] = str(problem)
    return problems


def _unwritable(path: Path) -> str | None:
    if path.exists():
        return None if os.access(path, os.W_OK) else f"{path} is not writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:  # the sink creates missing directories
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: {parent} is not a writable directory"
    return None


def readiness(daemon) -> dict:
    """What /readyz answers: ready only when warmed up and listening, every configured adapter loaded, and every
    sink able to write."""
    failed = dict(daemon.failed_adapters)
    loaded = sorted(daemon.catalog.adapters)
    sinks = sink_problems(daemon)
    checks = {"warmed_up": daemon.ready.is_set(),
              "adapters": {"ok": bool(loaded) and not failed, "loaded": loaded, "failed": failed},
              "sinks": {"ok": not sinks, "problems": sinks}}
    return {"ready": checks["warmed_up"] and checks["adapters"]["ok"] and checks["sinks"]["ok"], "checks": checks}


def _source(url: str) -> str:
    """A stream's source as the page shows it: a file's name, a camera URL without its credentials."""
    if "://" not in url:
        return Path(url).name
    u = urlsplit(url)
    return f"{u.scheme}://{u.hostname or ''}{f':{u.port}' if u.port else ''}{u.path}"


def _scene(stream) -> dict:
    """A stream's lines and zones as the page draws them (original-frame pixels)."""
    return {"lines": [{"name": line.name, "points": [list(p) for p in line.points]} for line in stream.lines],
            "zones": [{"name": z.name, "points": [list(p) for p in z.points], "dwell_s": z.dwell_s}
                      for z in stream.zones]}


# ---------------------------------------------------------------- snapshots
SNAPSHOT_TYPES = (".jpg", ".jpeg")  # what the daemon writes; nothing else under the directory is served


def snapshot_file(directory: Path, rel: str) -> Path | None:
    """The file that /snapshots/<rel> names, or None when rel names anything but a JPEG inside directory: an
    absolute path, one that leaves it (`..`, or a symlink pointing out), another kind of file, or nothing."""
    if not rel or rel.startswith(("/", "\\")) or "\x00" in rel:
        return None
    try:
        root = directory.resolve()
        path = (root / rel).resolve()  # follows `..` and symlinks: what would really be read
    except (OSError, ValueError, RuntimeError):
        return None
    if not path.is_relative_to(root) or path.suffix.lower() not in SNAPSHOT_TYPES or not path.is_file():
        return None
    return path


def snapshot_url(directory: Path, snapshot: str | None) -> str | None:
    """The page's URL for an event's snapshot path; None when there is none or it is not under directory."""
    if not snapshot:
        return None
    try:
        rel = Path(snapshot).resolve().relative_to(directory.resolve())
    except (OSError, ValueError, RuntimeError):
        return None
    return "/snapshots/" + quote(rel.as_posix())


# ---------------------------------------------------------------- the server
class _Threaded:
    """An asyncio server on its own thread: start() returns once it listens (or raises why it cannot)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return url_for(self.host, self.port)

    def start(self):
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, args=(started,), name="http", daemon=True)
        self._thread.start()
        started.result()  # re-raises a bind error here
        return self

    def _main(self, started: concurrent.futures.Future) -> None:
        self.loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start())
        except BaseException as e:  # noqa: BLE001 - handed to start()
            started.set_exception(e)
            loop.close()
            return
        started.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._stop())
            loop.close()

    def close(self) -> None:
        if self.loop is None or self._thread is None or not self._thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(SHUTDOWN_S + 2.0)

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError


class HttpServer(_Threaded):
    def __init__(self, daemon, host: str, port: int, dashboard: bool = True, frame_s: float = 1.0):
        super().__init__(host, port)
        self.daemon, self.dashboard = daemon, dashboard
        config = daemon.config
        self.hub = Hub([s.id for s in config.streams], frame_s)
        self._streams_info = {s.id: {"source": _source(s.source), "fps": s.fps,
                                     "tasks": [{"name": t.name, "adapter": t.adapter, "deadline_ms": t.deadline_ms,
                                                "frames": t.frames_per_chunk} for t in s.tasks],
                                     **_scene(s)}
                              for s in config.streams}
        self.snapshots_dir = Path(config.snapshots.dir)
        self._clients: set[asyncio.Queue] = set()
        self._system_history: deque = deque(maxlen=int(HISTORY_S / TICK_S))
        self._system: dict = {}
        self._totals: deque = deque(maxlen=int(RATE_WINDOW_S / TICK_S) + 1)  # (time, totals) of recent ticks
        self._sent = (0, 0)  # (point seq, frame version) of the last update
        self._runner = None
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ lifecycle
    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        if self.dashboard:
            app.router.add_get("/", self._index)
            app.router.add_get("/events", self._events)
            app.router.add_static("/static/", STATIC, append_version=False)
            app.router.add_get("/snapshots/{path:.+}", self._snapshot_file)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        self.port = self._runner.addresses[0][1]  # the real port when 0 (any free one) was asked
        if self.dashboard:
            self._attach()
            self._tasks.append(asyncio.get_running_loop().create_task(self._ticker()))

    def _attach(self) -> None:
        self.daemon.row_writer.observe_served(self.hub.frame)
        self.daemon.row_writer.observe_rows(self.hub.rows)

    def _detach(self) -> None:
        self.daemon.row_writer.forget(self.hub.frame)
        self.daemon.row_writer.forget(self.hub.rows)

    async def _stop(self) -> None:
        self._detach()
        for t in self._tasks:
            t.cancel()
        for q in list(self._clients):
            _cut_off(q)
        if self._runner is not None:
            await self._runner.cleanup()

    # ------------------------------------------------------------------ plain endpoints
    async def _healthz(self, request):
        """Alive: the daemon's loop went round recently (a batch can take seconds; a hung one shows here)."""
        from aiohttp import web

        age = time.monotonic() - self.daemon.heartbeat
        stalled = age > STALL_S
        return web.json_response({"status": "stalled" if stalled else "alive", "pid": os.getpid(),
                                  "loop_age_s": round(age, 3)}, status=503 if stalled else 200)

    async def _readyz(self, request):
        from aiohttp import web

        body = readiness(self.daemon)
        return web.json_response(body, status=200 if body["ready"] else 503)

    async def _metrics(self, request):
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = generate_latest(self.daemon.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _status(self, request):
        from aiohttp import web

        # This thread's CPU time: what the server (dashboard updates, JPEGs, scrapes) has cost the daemon process.
        return web.json_response({**self._status_now(), "http_thread_cpu_s": round(time.thread_time(), 3)})

    async def _index(self, request):
        from aiohttp import web

        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache",
                                                                  "Content-Security-Policy": CSP})

    async def _snapshot_file(self, request):
        """An event's snapshot JPEG; 404 for any path that is not a JPEG inside snapshots.dir."""
        from aiohttp import web

        path = snapshot_file(self.snapshots_dir, request.match_info["path"])
        if path is None:
            return web.Response(status=404, text="no such snapshot\n")
        return web.FileResponse(path, headers={"Content-Type": "image/jpeg", "Cache-Control": "max-age=86400",
                                               "X-Content-Type-Options": "nosniff"})

    # ------------------------------------------------------------------ live updates
    async def _events(self, request):
        """Server-sent events: a snapshot, then the shared one-a-second updates until the page goes away."""
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        q: asyncio.Queue = asyncio.Queue(CLIENT_QUEUE)
        self._clients.add(q)
        try:
            await resp.write(b"retry: 2000\n\n" + _event("snapshot", self._snapshot()))
            while True:
                msg = await q.get()
                if msg is None:
                    break
                await resp.write(msg)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._clients.discard(q)
        return resp

    def _status_now(self) -> dict:
        for _ in range(3):
            try:
                return self.daemon.snapshot()
            except RuntimeError:  # a dict changed size while it was copied on the daemon's thread: try again
                continue
        return dict(self._system)

    def _tick_system(self) -> dict:
        """The system panel now, and one point of its history (rates from the totals since the last tick)."""
        s = self._status_now()
        now = time.time()
        totals = s.get("totals", {})
        point = {"t": round(now, 3), "images_s": 0.0, "results_s": 0.0, "batch": 0.0,
                 "queue": s.get("queue", {}).get("images", 0), "load": s.get("offered_load", 0.0),
                 "mode": s.get("last_batch", {}).get("mode")}
        self._totals.append((now, totals))
        t0, prev = self._totals[0]
        if now > t0:  # rates over the last RATE_WINDOW_S: a batch can take seconds, one tick says little
            images = totals.get("images", 0) - prev.get("images", 0)
            batches = totals.get("batches", 0) - prev.get("batches", 0)
            point["images_s"] = round(images / (now - t0), 2)
            point["results_s"] = round((totals.get("ok", 0) - prev.get("ok", 0)) / (now - t0), 2)
            point["batch"] = round(images / batches, 2) if batches else 0.0
        self._system_history.append(point)
        s["rates"] = point
        self._system = s
        return s

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += TICK_S
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            try:
                system = self._tick_system()
                if self._clients:
                    msg = _event("update", self._update(system))
                    for q in list(self._clients):
                        try:
                            q.put_nowait(msg)
                        except asyncio.QueueFull:  # a page that does not keep up starts again from a snapshot
                            _cut_off(q)
                else:
                    self._sent = (self.hub.seq, self._sent[1])
            except Exception:  # noqa: BLE001 - the page goes stale, the server stays
                log.exception("dashboard update failed")

    def _snapshot(self) -> dict:
        system = self._system or self._tick_system()
        now = time.time()
        seq, _, streams = self.hub.snapshot(now - HISTORY_S)
        return {"now": now, "history_s": HISTORY_S, "tick_s": TICK_S, "system": system,
                "system_history": list(self._system_history),
                "streams": [self._stream_json(sid, st) for sid, st in streams.items()],
                "events": self._events_json(0, seq)}

    def _update(self, system: dict) -> dict:
        after = self._sent[0]
        seq, version, streams = self.hub.changes(*self._sent)
        self._sent = (seq, version)
        return {"now": time.time(), "system": system, "system_point": self._system_history[-1],
                "streams": [self._stream_json(sid, st) for sid, st in streams.items()],
                "events": self._events_json(after, seq)}

    def _events_json(self, after_seq: int, upto_seq: int) -> list[dict]:
        return [{**e, "snapshot": snapshot_url(self.snapshots_dir, e["snapshot"])}
                for e in self.hub.events(after_seq, upto_seq)]

    def _stream_json(self, sid: str, st: dict) -> dict:
        return {"id": sid, **self._streams_info.get(sid, {"source": "", "tasks": []}), **st,
                "frame": encode(st["frame"])}


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _cut_off(q: asyncio.Queue) -> None:
    while not q.empty():
        q.get_nowait()
    q.put_nowait(None)


class PrometheusOnly:
    """Without aiohttp: /metrics alone, from prometheus_client's own server (on the configured host)."""

    def __init__(self, registry, host: str, port: int):
        self.registry, self.host, self.port = registry, host, port
        self._httpd = None

    @property
    def url(self) -> str:
        return url_for(self.host, self.port)

    def start(self) -> "PrometheusOnly":
        from prometheus_client import start_http_server

        self._httpd, _ = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._httpd.server_address[1]
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
