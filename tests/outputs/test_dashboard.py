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

from tests.conftest import unavailable
from tests.serving.test_daemon import chunk_parts, config
from vlora_va.contracts.config import ConfigError, parse_config
from vlora_va.contracts.events import EventRecord
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections, PersonActivity, ResultRecord
from vlora_va.contracts.scene import LineConfig, SnapshotConfig, ZoneConfig
from vlora_va.contracts.security import is_local_host
from vlora_va.outputs.attach import run_with_outputs
from vlora_va.outputs.dashboard import url_for
from vlora_va.outputs.dashboard.hub import RECENT_EVENTS, Hub, person_label
from vlora_va.outputs.dashboard.server import HttpServer, readiness, snapshot_file, start_http
from vlora_va.serving.daemon import Daemon
from vlora_va.testing.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
    assert not daemon.row_writer.observers  # the server took its observers away


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
    under_a_file = dataclasses.replace(cfg.sinks[0].options, path=str(tmp_path / "a-file" / "r.jsonl"))
    sink = dataclasses.replace(cfg.sinks[0], options=under_a_file)
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
    assert not daemon.row_writer.observers


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
        unavailable(problem)
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
# + ".frame')?.dataset..." in the page's JS: `?.` because a wait's predicate that throws fails the wait at once,
# and the page draws a stream's card only when its first row arrives
PED = "+document.querySelector('[data-stream=pedestrians] "
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
            page.wait_for_function(f"() => {PED}.frame')?.dataset.version > 0 && {PED}.latency')?.dataset.points > 0",
                                   timeout=WAIT_MS)
            first = {c["id"]: c for c in page.evaluate(CARDS)}
            page.wait_for_function(f"() => {PED}.frame')?.dataset.version > {first['pedestrians']['version']} && "
                                   f"{PED}.latency')?.dataset.points > {first['pedestrians']['points']}",
                                   timeout=WAIT_MS)
            time.sleep(5)  # a few more seconds of history for the screenshot
            if os.environ.get("VLORA_VA_DOCS_SCREENSHOT") == "1":  # the docs' picture shows some events too
                page.wait_for_function("() => document.querySelectorAll('#event-list tbody tr').length >= 4",
                                       timeout=120_000)
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


# ---------------------------------------------------------------- lines, zones, tracks, events (issue 29)
GATE = LineConfig("gate", ((320.0, 40.0), (320.0, 440.0)))  # top to bottom: `in` is to the screen's left
LAWN = ZoneConfig("lawn", ((400.0, 300.0), (600.0, 300.0), (600.0, 460.0), (400.0, 460.0)))
T0 = 1_800_000_000.0


def scene_daemon(tmp_path, tiny_backbone_dir, tiny_adapters) -> Daemon:
    """The tiny daemon, its stream `cam` declaring a line and a zone, its snapshots under tmp_path/snaps."""
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters)
    cam = dataclasses.replace(cfg.streams[0], lines=(GATE,), zones=(LAWN,))
    return Daemon(dataclasses.replace(cfg, streams=(cam,), snapshots=SnapshotConfig(dir=str(tmp_path / "snaps"))))


def served_frame(seq: int = 0) -> tuple[Request, ResultRecord]:
    """A detection result on a 640 x 480 frame sent as 320 px letterboxed: a tracked person and an untracked car."""
    frame = np.full((320, 320, 3), 70, np.uint8)
    req = Request("cam", seq, "det", "detect", [frame], [seq + 0.5], Letterbox(0.5, 0.0, 40.0), (640, 480),
                  T0, T0, T0 + 10)
    dets = (Detection((100.0, 100.0, 160.0, 260.0), "person", 0.9, track_id="r1-4"),
            Detection((440.0, 60.0, 600.0, 180.0), "car", 0.8))
    rec = ResultRecord.served(req, DetectionResult((FrameDetections(seq + 0.5, dets),)), compute_start=T0 + 0.1,
                              compute_end=T0 + 0.2, batch_images=1, mode="unmerged")
    return req, rec


def crossing(n: int, people_in: int, snapshot: str | None = None) -> EventRecord:
    return EventRecord(id=f"r1-{n}", event="line_crossed", stream="cam", ts=float(n), captured_at=T0 + n, task="det",
                       chunk=n, line="gate", direction="in", track_id="r1-4", cls="person", box=(100, 100, 160, 260),
                       counts={"in": {"person": people_in}, "out": {"person": 1}}, counts_since=T0,
                       snapshot=snapshot)


def zone_entry(n: int) -> EventRecord:
    return EventRecord(id=f"r1-{n}", event="zone_entered", phase="start", stream="cam", ts=float(n),
                       captured_at=T0 + n, task="det", zone="lawn", track_id="r1-9", cls="person",
                       counts={"inside": {"person": 2}, "entered": {"person": 2, "dog": 1}, "left": {"dog": 1}},
                       counts_since=T0)


def jpeg(path: Path, colour) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((60, 80, 3), colour, np.uint8))
    return path.read_bytes()


def raw_get(port: int, path: str) -> tuple[int, bytes]:
    """A GET with the path exactly as given (urllib would resolve `..` itself)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_hub_keeps_the_last_events_and_each_rules_totals_beside_the_results():
    """Result and event rows in one write: the results' accounting is what it was, each event takes the next seq,
    the event list keeps the last RECENT_EVENTS, a rule's totals are the latest event's (copied: the analytics
    may change its dict afterwards), and boxes of confirmed tracks carry their track id."""
    hub = Hub(["cam"])
    req, rec = served_frame()
    moved = EventRecord(id="r1-2", event="stream_moved", stream="cam", ts=2.0, captured_at=T0 + 2)  # unknown name
    first = crossing(1, 3)
    hub.rows([rec, first, moved])
    first.counts["in"]["person"] = 99  # what the hub shows must not change with it
    hub.frame(req, rec)
    seq, _, streams = hub.snapshot(0.0)
    cam = streams["cam"]
    assert seq == 3 and cam["counts"]["ok"] == 1 and [p[0] for p in cam["points"]] == [1]
    assert [(e["seq"], e["event"], e["rule"]) for e in hub.events(0, seq)] == [(2, "line_crossed", "gate"),
                                                                              (3, "stream_moved", None)]
    assert cam["line_counts"]["gate"]["counts"] == {"in": {"person": 3}, "out": {"person": 1}}
    assert [b.get("track") for b in cam["frame"].meta["boxes"]] == ["r1-4", None]
    assert cam["frame"].meta["scale"] == 0.5
    hub.rows([zone_entry(n) for n in range(RECENT_EVENTS + 5)])
    seq2, _, changed = hub.changes(seq, 1)
    assert changed["cam"]["zone_counts"]["lawn"]["counts"]["inside"] == {"person": 2}  # the stream changed: sent
    assert len(hub.events(0, seq2)) == RECENT_EVENTS and hub.events(seq2, seq2) == []
    assert [e["seq"] for e in hub.events(seq2 - 2, seq2 - 1)] == [seq2 - 1]


def test_snapshots_are_served_from_their_directory_only(tmp_path, tiny_backbone_dir, tiny_adapters):
    """/snapshots/ serves the JPEGs under snapshots.dir; `..`, absolute paths (plain or percent-encoded), a
    symlink pointing out and files of other kinds are refused. The event stream names each snapshot by that URL
    (none for a path outside the directory)."""
    daemon = scene_daemon(tmp_path, tiny_backbone_dir, tiny_adapters)
    snaps = tmp_path / "snaps"
    inside = jpeg(snaps / "cam" / "r1-1.jpg", (0, 0, 255))
    secret = jpeg(tmp_path / "secret.jpg", (255, 0, 0))  # a JPEG, outside the directory
    (snaps / "cam" / "notes.txt").write_text("not a snapshot")
    (snaps / "out.jpg").symlink_to(tmp_path / "secret.jpg")
    for rel in ("../secret.jpg", str(tmp_path / "secret.jpg"), "cam/../../secret.jpg", "out.jpg", "cam/notes.txt",
                "cam/missing.jpg", ""):
        assert snapshot_file(snaps, rel) is None, rel
    assert snapshot_file(snaps, "cam/r1-1.jpg") == (snaps / "cam" / "r1-1.jpg").resolve()

    server = HttpServer(daemon, "127.0.0.1", 0).start()
    try:
        status, body = raw_get(server.port, "/snapshots/cam/r1-1.jpg")
        assert status == 200 and body == inside
        for path in ("/snapshots/../secret.jpg", "/snapshots/%2e%2e/secret.jpg", "/snapshots/cam/..%2F..%2Fsecret.jpg",
                     f"/snapshots/{tmp_path}/secret.jpg", f"/snapshots//{tmp_path}/secret.jpg",
                     f"/snapshots/%2F{str(tmp_path)[1:]}/secret.jpg", "/snapshots/out.jpg", "/snapshots/cam/notes.txt"):
            status, body = raw_get(server.port, path)
            assert status == 404 and secret not in body and b"not a snapshot" not in body, (path, status)
        server.hub.rows([crossing(1, 1, str(snaps / "cam" / "r1-1.jpg")),
                         crossing(2, 2, str(tmp_path / "secret.jpg"))])
        events = Events(server.port)
        name, snap = events.next()
        events.close()
        assert name == "snapshot"
        assert [e["snapshot"] for e in snap["events"]] == ["/snapshots/cam/r1-1.jpg", None]
        (cam,) = snap["streams"]
        assert cam["lines"] == [{"name": "gate", "points": [[320.0, 40.0], [320.0, 440.0]]}]
        assert cam["zones"][0]["name"] == "lawn" and cam["line_counts"]["gate"]["counts"]["in"] == {"person": 2}
    finally:
        server.close()


LINE_PIXEL = """() => {  // the reddest pixel across the gate line a quarter of the way down, on the page's canvas
  const c = document.querySelector('[data-stream=cam] .frame'), w = c.clientWidth, h = c.clientHeight;
  const k = Math.min(w / 320, h / 240), ox = (w - 320 * k) / 2, oy = (h - 240 * k) / 2, m = 0.5 * k;
  const dpr = window.devicePixelRatio || 1, x = (ox + 320 * m) * dpr, y = (oy + 140 * m) * dpr;
  const d = c.getContext('2d').getImageData(Math.round(x) - 3, Math.round(y), 7, 1).data;  // the line is 2 px wide
  let best = [0, 0, 0];
  for (let i = 0; i < d.length; i += 4) if (d[i] > best[0]) best = [d[i], d[i + 1], d[i + 2]];
  return best;
}"""


def test_the_page_draws_lines_zones_and_tracks_and_lists_counts_and_events(tmp_path, tiny_backbone_dir,
                                                                          tiny_adapters):
    """In headless Chromium: the frame shows the stream's line and zone and the track id; the line's and the
    zone's totals are listed; the events are listed newest first with their snapshot, and new ones arrive live
    (the list keeps the last 20). Rows go through the hub as the daemon hands them over (results and events in
    one list; the served request to the frame tap)."""
    sync_playwright = _browser_or_skip()
    daemon = scene_daemon(tmp_path, tiny_backbone_dir, tiny_adapters)
    snapshot = tmp_path / "snaps" / "cam" / "r1-1.jpg"
    jpeg(snapshot, (0, 0, 255))
    server = HttpServer(daemon, "127.0.0.1", 0).start()
    try:
        req, rec = served_frame()
        server.hub.rows([rec, crossing(1, 3, str(snapshot)), zone_entry(2),
                         EventRecord(id="r1-3", event="stream_moved", stream="cam", ts=3.0, captured_at=T0 + 3)])
        server.hub.frame(req, rec)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(server.url)
            frame = "document.querySelector('[data-stream=cam] .frame')?.dataset"  # ?.: the card comes with the rows
            page.wait_for_function(f"() => {frame}?.version > 0", timeout=30_000)
            assert page.evaluate(f"() => [{frame}.lines, {frame}.zones, {frame}.tracks, {frame}.boxes]") == \
                ["1", "1", "1", "2"]
            r, g, b = page.evaluate(LINE_PIXEL)
            assert r > 200 and g > 170 and b < 120, (r, g, b)  # the line's yellow, over a grey frame
            gate = page.locator("[data-stream=cam] [data-line=gate]").inner_text()
            lawn = page.locator("[data-stream=cam] [data-zone=lawn]").inner_text()
            assert "in person 3" in gate and "out person 1" in gate, gate
            assert "inside 2 (person 2)" in lawn and "entered 3 (person 2, dog 1)" in lawn and "left 1" in lawn, lawn
            rows = page.locator("#event-list tbody tr")
            assert [rows.nth(i).get_attribute("data-event") for i in range(3)] == \
                ["stream_moved", "zone_entered", "line_crossed"]  # newest first; an unknown name is listed too
            cells = rows.nth(2).locator("td").all_inner_texts()
            assert cells[1:7] == ["cam", "line_crossed", "line gate", "in", "#4", "person"], cells
            assert rows.nth(1).locator("td").nth(2).inner_text() == "zone_entered (start)"
            page.wait_for_function("() => { const i = document.querySelector('#event-list img');"
                                   " return i && i.complete && i.naturalWidth === 80; }", timeout=10_000)
            assert page.locator("#no-events").is_hidden()

            server.hub.rows([crossing(n, 3 + n) for n in range(10, 30)])  # live: 20 more
            page.wait_for_function("() => document.querySelector('#event-list tbody tr')?.dataset.seq === "
                                   f"'{server.hub.seq}'", timeout=10_000)
            assert rows.count() == 20
            assert "in person 32" in page.locator("[data-stream=cam] [data-line=gate]").inner_text()
            page.screenshot(path=str(tmp_path / "scene.png"), full_page=True)
            browser.close()
        assert not errors, errors
    finally:
        server.close()
