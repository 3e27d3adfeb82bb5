"""The daemon's HTTP server (vlora_va/dashboard): /healthz, /readyz, /metrics and the dashboard's event stream
on one loopback server, with the real daemon (tiny backbone); and the dashboard page itself in headless
Chromium on the real pipeline (real default backbone, shipped adapters, a sample video paced live)."""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
import zmq

from tests.serving.test_daemon import chunk_parts, config
from vlora_va.contracts.config import ConfigError, parse_config
from vlora_va.contracts.results import PersonActivity
from vlora_va.contracts.security import is_local_host
from vlora_va.outputs.attach import run_with_outputs
from vlora_va.outputs.dashboard import url_for
from vlora_va.outputs.dashboard.hub import person_label
from vlora_va.outputs.dashboard.server import HttpServer, readiness, start_http
from vlora_va.serving.daemon import Daemon

ROOT = Path(__file__).resolve().parents[2]
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with NO_PROXY.open(url, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class Events:
    """A server-sent event stream read as a browser's EventSource would: (event name, JSON data) pairs."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.conn.request("GET", "/events")
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200 and self.resp.getheader("Content-Type").startswith("text/event-stream")

    def next(self) -> tuple[str, dict]:
        name, data = None, None
        while True:
            line = self.resp.fp.readline()
            assert line, "event stream closed"
            line = line.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif not line and name:
                return name, data

    def close(self) -> None:
        self.conn.close()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True


# ---------------------------------------------------------------- the server with the real daemon (tiny backbone)
def test_health_readiness_metrics_and_events(tmp_path, tiny_backbone_dir, tiny_adapters):
    """Before warm-up /healthz answers and /readyz says 503 (why); once ready 200; /metrics counts what
    happened; /events gives a snapshot listing the streams, then updates with each stream's results and frames."""
    daemon = Daemon(config(tmp_path, tiny_backbone_dir, tiny_adapters))
    server = HttpServer(daemon, "127.0.0.1", 0).start()  # port 0: any free one
    port, base = server.port, server.url
    stop, ready, drained = threading.Event(), threading.Event(), threading.Event()
    thread = threading.Thread(target=run_with_outputs, args=(daemon, stop, ready, drained), daemon=True)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    try:
        status, _, body = get(base + "healthz")
        alive = json.loads(body)
        assert status == 200 and alive["status"] == "alive" and alive["pid"] == os.getpid()
        daemon.heartbeat -= 1000  # a loop that has not gone round for a long time: stalled
        status, _, body = get(base + "healthz")
        assert status == 503 and json.loads(body)["status"] == "stalled"
        daemon.heartbeat += 1000
        status, _, body = get(base + "readyz")
        assert status == 503
        checks = json.loads(body)["checks"]
        assert checks["warmed_up"] is False and checks["adapters"]["ok"] and checks["sinks"]["ok"]

        thread.start()
        assert ready.wait(60)
        status, _, body = get(base + "readyz")
        assert status == 200 and json.loads(body)["ready"] is True

        events = Events(port)
        name, snap = events.next()
        assert name == "snapshot" and [s["id"] for s in snap["streams"]] == ["cam"]  # configured, no result yet
        assert snap["system"]["ready"] is True and snap["system"]["slots"] == {"used": 2, "total": 8}
        push.connect(daemon.config.daemon.endpoint)
        for seq in range(3):
            push.send_multipart(chunk_parts("cam", seq, [("det", "detect"), ("act", "actions")]), copy=False)
        push.send_multipart(chunk_parts("cam", 3, [("det", "detect")], deadline_s=1.0, ready_ago_s=3.0), copy=False)
        points, frame, deadline = {}, None, time.monotonic() + 30
        while (len(points) < 7 or frame is None) and time.monotonic() < deadline:
            name, update = events.next()
            assert name == "update" and "rates" in update["system"] and "images_s" in update["system_point"]
            for s in update["streams"]:
                assert s["id"] == "cam"
                points.update({p[0]: p for p in s["points"]})
                frame = s["frame"] or frame
        events.close()
        statuses = sorted(p[3] for p in points.values())
        assert statuses == ["ok"] * 6 + ["shed"], statuses  # the late chunk was shed, and shows as such
        assert {p[2] for p in points.values()} == {"det", "act"}
        # A frame of what ingest sent, without the letterbox padding (56 x 42 of a 56-px square), as a JPEG.
        jpeg = np.frombuffer(base64.b64decode(frame["jpeg"].split(",", 1)[1]), np.uint8)
        assert cv2.imdecode(jpeg, cv2.IMREAD_COLOR).shape == (42, 56, 3)
        assert (frame["width"], frame["height"]) == (56, 42) and frame["task"] == "det"

        status, headers, body = get(base + "metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert 'vlora_results_total{status="ok",stream="cam",task="det"} 3.0' in body.decode()
    finally:
        stop.set()
        drained.wait(60)
        push.close(linger=0)
        ctx.term()
        thread.join(60)
        server.close()
    assert refused(port)
    assert not daemon.rows.observers  # the server took its observers away


def test_server_from_config_on_loopback_via_metrics_port_alias(tmp_path, tiny_backbone_dir, tiny_adapters):
    """daemon.metrics_port (the older key) starts the same server: page, health, metrics; closed on stop."""
    port = free_port()
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters, metrics_port=port)
    assert (cfg.daemon.http_port, cfg.daemon.http_host) == (port, "127.0.0.1")
    daemon = Daemon(cfg)
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=run_with_outputs, args=(daemon, stop, ready), daemon=True)
    thread.start()
    try:
        assert ready.wait(60)
        status, headers, body = get(f"http://127.0.0.1:{port}/")
        assert status == 200 and b"/static/app.js" in body
        assert "default-src 'self'" in headers["Content-Security-Policy"]  # nothing from elsewhere
        for asset in ("app.js", "style.css"):
            assert get(f"http://127.0.0.1:{port}/static/{asset}")[0] == 200
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        assert b"vlora_queue_images" in get(f"http://127.0.0.1:{port}/metrics")[2]
    finally:
        stop.set()
        thread.join(60)
    assert refused(port)


def test_readyz_says_which_adapter_and_sink_are_not_ready(tmp_path, tiny_backbone_dir, tiny_adapters):
    (tmp_path / "a-file").write_text("not a directory")
    cfg = config(tmp_path, tiny_backbone_dir, {**tiny_adapters, "broken": tmp_path / "no-such-adapter"})
    sink = dataclasses.replace(cfg.sinks[0], path=str(tmp_path / "a-file" / "r.jsonl"))  # under a file
    cfg = dataclasses.replace(cfg, sinks=(sink,))
    body = readiness(Daemon(cfg))
    assert body["ready"] is False
    assert body["checks"]["adapters"]["ok"] is False and "broken" in body["checks"]["adapters"]["failed"]
    assert body["checks"]["adapters"]["loaded"] == ["actions", "detect"]
    (problem,) = body["checks"]["sinks"]["problems"].values()
    assert "not a writable directory" in problem


def test_a_taken_port_is_logged_and_the_daemon_serves_without_http(tmp_path, tiny_backbone_dir, tiny_adapters,
                                                                  caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = Daemon(config(tmp_path, tiny_backbone_dir, tiny_adapters, http_port=port))
        with caplog.at_level(logging.ERROR, logger="vlora_va.outputs.dashboard.server"):
            assert start_http(daemon) is None
    assert f"cannot bind 127.0.0.1:{port}" in caplog.text
    assert not daemon.rows.observers


def test_a_persons_label_shows_the_score_behind_its_activity():
    maps = PersonActivity((10.0, 20.0, 30.0, 60.0), 0.9, "walking_left", 0.7)
    track = PersonActivity((10.0, 20.0, 30.0, 60.0), 0.9, "standing", 0.05, "track")
    assert person_label(maps, 0.5) == {"box": [5.0, 10.0, 15.0, 30.0], "label": "walking_left", "score": 0.7}
    # named by its track: the maps' 0.05 is not the doubt of that call; the person score is shown
    assert person_label(track, 0.5) == {"box": [5.0, 10.0, 15.0, 30.0], "label": "standing (track)", "score": 0.9}


@pytest.mark.parametrize("host,loopback,url", [
    ("127.0.0.1", True, "http://127.0.0.1:8765/"),
    ("localhost", True, "http://localhost:8765/"),
    ("::1", True, "http://[::1]:8765/"),
    ("0.0.0.0", False, "http://127.0.0.1:8765/"),
    ("::", False, "http://[::1]:8765/"),
    ("192.168.1.20", False, "http://192.168.1.20:8765/"),
    ("camera-host", False, "http://camera-host:8765/"),
])
def test_loopback_and_url(host, loopback, url):
    assert is_local_host(host) is loopback and url_for(host, 8765) == url


HTTP_CONFIG = """
daemon:
  {keys}
adapters: {{detect: a}}
streams: [{{id: cam, source: x.mp4, tasks: [{{adapter: detect}}]}}]
"""


@pytest.mark.parametrize("keys,expected", [
    ("{}", ("127.0.0.1", 0, True, 1.0)),
    ("{http_port: 8765}", ("127.0.0.1", 8765, True, 1.0)),
    ("{metrics_port: 9000}", ("127.0.0.1", 9000, True, 1.0)),  # the older key starts the same server
    ("{metrics_port: 9000, http_port: 9000}", ("127.0.0.1", 9000, True, 1.0)),
    ("{http_host: '::1', http_port: 1, dashboard: false, dashboard_frame_s: 0.5}", ("::1", 1, False, 0.5)),
    ("{http_host: 0.0.0.0, http_port: 8765}", ("0.0.0.0", 8765, True, 1.0)),
    ("{metrics_port: 9000, http_port: 9001}", "daemon.metrics_port: is the older name of daemon.http_port"),
    ("{http_port: 70000}", "daemon.http_port: must be a TCP port (at most 65535), got 70000"),
    ("{http_port: -1}", "daemon.http_port: must be >= 0"),
    ("{http_host: 'http://127.0.0.1'}", "daemon.http_host: expected an IP address or a host name"),
    ("{http_host: ''}", "daemon.http_host: expected an IP address or a host name"),
    ("{dashboard_frame_s: 0.01}", "daemon.dashboard_frame_s: must be >= 0.1"),
    ("{dashboard: 1}", "daemon.dashboard: expected bool"),
])
def test_http_config_keys(keys, expected):
    text = HTTP_CONFIG.format(keys=keys).replace("daemon:\n  {", "daemon: {")
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            parse_config(text, "p.yaml")
        return
    d = parse_config(text, "p.yaml").daemon
    assert (d.http_host, d.http_port, d.dashboard, d.dashboard_frame_s) == expected


# ---------------------------------------------------------------- the page, in headless Chromium, on the real pipeline
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"]


def _browser_or_skip():
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem, sync_playwright = "the playwright package is not installed (pip install -e '.[test]')", None
    if problem is None and not os.access(CHROMIUM, os.X_OK):
        problem = f"{CHROMIUM} not found (bash scripts/setup-test-system.sh installs Debian's chromium)"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    return sync_playwright


def _wait_for_line(log: Path, proc: subprocess.Popen, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if needle in line:
                return line
        assert proc.poll() is None, f"vlora-va run exited early ({proc.returncode}): {log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not logged in {timeout} s: {log.read_text()[-3000:]}")


MAX_CHUNKS = 300  # the run ends by itself after this many seconds of video
WAIT_MS = 180_000  # for the page to show a frame / the next frame (a busy machine sheds most requests)
PED = "+document.querySelector('[data-stream=pedestrians] "  # + ".frame').dataset..." in the page's JS
CARDS = """() => [...document.querySelectorAll('[data-stream]')].map(e => ({
  id: e.dataset.stream, version: +e.querySelector('.frame').dataset.version,
  boxes: +e.querySelector('.frame').dataset.boxes, points: +e.querySelector('.latency').dataset.points,
  chart: e.querySelector('.latency').toDataURL(), label: e.querySelector('.activity').textContent}))"""


@pytest.mark.slow
def test_dashboard_in_headless_chromium_on_the_real_pipeline(tmp_path):
    """`vlora-va run` on the sample videos, paced live, with the dashboard on: the page lists each stream, its
    frame and latency chart update, detections or the activity label are drawn, and a screenshot is kept (tmp
    dir; also docs/dashboard.png when VLORA_VA_DOCS_SCREENSHOT=1). Then Ctrl-C ends the run cleanly.

    The videos loop (at most MAX_CHUNKS s) and the run is stopped once the page has shown what is checked: on a
    machine that keeps up that is about 15 s of video; on a busy one overload control sheds most requests and
    the page needs longer to see two served frames."""
    sync_playwright = _browser_or_skip()
    from vlora_va.engine.backbones import DEFAULT_BACKBONE, cache_dir, fetched_ok

    if not fetched_ok(cache_dir() / DEFAULT_BACKBONE):
        pytest.fail("the default backbone is not fetched: run `vlora-va models fetch` (make test does)")
    from tests.test_pipeline_e2e import pipeline

    path = pipeline(tmp_path, loop=True, max_chunks=MAX_CHUNKS)  # paced live
    cfg = yaml.safe_load(path.read_text())
    port = free_port()
    cfg["daemon"].update(http_port=port, http_host="127.0.0.1")
    for stream in cfg["streams"]:  # the page is under test, not this machine's speed: at the default deadlines a
        for task in stream["tasks"]:  # busy machine sheds nearly every request, and the page has little to show
            task["deadline_ms"] = 30_000
    path.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "run.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "vlora_va.cli", "run", str(path)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        # `vlora-va run` says where the page is (a first start here measures the machine: minutes)
        line = _wait_for_line(log, proc, "dashboard: http://", 900)
        url = line.split("dashboard: ", 1)[1].strip()
        assert url == f"http://127.0.0.1:{port}/"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors, elsewhere = [], []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: None if r.url.startswith((url, "data:")) else elsewhere.append(r.url))
            page.goto(url)
            page.wait_for_selector('[data-stream="pedestrians"]', timeout=30_000)
            page.wait_for_selector('[data-stream="bikes"]', timeout=30_000)
            assert page.locator("#conn.on").count() == 1
            # A first frame and some latency points, then newer ones: both the image and the chart move.
            page.wait_for_function(f"() => {PED}.frame').dataset.version > 0 && {PED}.latency').dataset.points > 0",
                                   timeout=WAIT_MS)
            first = {c["id"]: c for c in page.evaluate(CARDS)}
            page.wait_for_function(f"() => {PED}.frame').dataset.version > {first['pedestrians']['version']} && "
                                   f"{PED}.latency').dataset.points > {first['pedestrians']['points']}", timeout=WAIT_MS)
            time.sleep(5)  # a few more seconds of history for the screenshot
            cards = {c["id"]: c for c in page.evaluate(CARDS)}
            assert set(cards) == {"pedestrians", "bikes"}
            ped = cards["pedestrians"]
            assert ped["version"] > first["pedestrians"]["version"] and ped["points"] > first["pedestrians"]["points"]
            assert ped["chart"] != first["pedestrians"]["chart"]
            # People walk through every second of the surveillance video: boxes on its frame, or its activity label.
            assert ped["boxes"] > 0 or ped["label"], ped
            assert page.locator("#sys-mode").inner_text() not in ("", "–")
            assert page.locator("#ready").inner_text() == "ready"
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            browser.close()
        assert not errors, errors
        assert not elsewhere, elsewhere  # no CDN, nothing from outside
        assert shot.stat().st_size > 20_000
        if os.environ.get("VLORA_VA_DOCS_SCREENSHOT") == "1":
            shutil.copy(shot, ROOT / "docs" / "dashboard.png")
        os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C in a terminal
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(30)
    rows = [json.loads(r) for r in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {r["stream"] for r in rows} == {"pedestrians", "bikes"}


def test_a_plug_in_heads_result_is_shown_without_boxes():
    """A result type the page does not know (a plug-in head's: neither detections nor persons) still shows the
    stream's frame and its row; the hub must not fail on it (a failing observer is dropped for good)."""
    from dataclasses import dataclass

    from vlora_va.contracts.geometry import Letterbox
    from vlora_va.contracts.requests import Request
    from vlora_va.contracts.results import ResultRecord
    from vlora_va.outputs.dashboard.hub import Hub

    @dataclass(frozen=True)
    class Brightness:
        mean: float

        def to_json(self) -> dict:
            return {"mean": self.mean}

    frame = np.full((56, 56, 3), 90, np.uint8)
    req = Request("cam", 0, "bright", "bright", [frame], [0.5], Letterbox(1.0, 0.0, 0.0), (56, 56), 10.0, 10.0, 20.0)
    rec = ResultRecord.served(req, Brightness(0.3), compute_start=10.1, compute_end=10.2, batch_images=1,
                              mode="unmerged")
    hub = Hub(["cam"], frame_s=0.1)
    hub.rows([rec])
    hub.frame(req, rec)
    _, version, streams = hub.snapshot(0.0)
    shown = streams["cam"]["frame"]
    assert version == 1 and shown.meta["boxes"] == [] and shown.meta["task"] == "bright"
    assert streams["cam"]["recent"][0]["status"] == "ok"
