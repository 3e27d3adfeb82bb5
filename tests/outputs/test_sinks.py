"""Result sinks with real files, threads, sockets and a local HTTP server: every sink writes the one row
schema; JSONL rotation keeps every line exactly once; a failing, hung or full sink never stalls `write`,
loses nothing up to its queue bound, and counts what it drops; a sink type registered in contracts.plugins.SINKS
is configured, built and fed exactly like a built-in one."""

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vlora_va.contracts.config import ConfigError, SinkConfig, parse_config
from vlora_va.contracts.plugins import SINKS
from vlora_va.contracts.results import Detection, DetectionResult, FrameDetections, Latency, ResultRecord
from vlora_va.contracts.sinks import SinkEntry, SinkOptions
from vlora_va.outputs.sinks import JsonlSink, QueuedSink, Sink, WebhookSink, ZmqPubSink, make_sink
from vlora_va.outputs.sinks.jsonl import JsonlOptions
from vlora_va.serving.prometheus import DaemonMetrics
from vlora_va.testing.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def record(i: int, stream: str = "cam") -> ResultRecord:
    """A served detection row; `chunk` is its id."""
    det = Detection((10.0 + i % 7, 20.0, 30.0, 40.5), "person", 0.5 + (i % 10) / 100)
    return ResultRecord(stream=stream, chunk=i, task="detect", adapter="detect", status="ok", frame_ts=(i + 0.5,),
                        latency=Latency(0.01, 0.2, 0.4), deadline_ms=2000.0, deadline_met=True,
                        result=DetectionResult((FrameDetections(i + 0.5, (det,)),)), batch_images=4,
                        mode="premerged")


def records(start: int, n: int) -> list[ResultRecord]:
    return [record(i) for i in range(start, start + n)]


def rotated_files(path: Path) -> list[Path]:
    """The live file and its rotated ones, oldest first (path.N ... path.1, path)."""
    rotated = sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:]))
    return rotated + ([path] if path.exists() else [])


def read_lines(files: list[Path]) -> list[dict]:
    out = []
    for f in files:
        data = f.read_bytes()
        assert not data or data.endswith(b"\n"), f"{f} ends with a partial line"
        out += [json.loads(line) for line in data.decode().splitlines()]
    return out


def assert_never_blocked(times: list[float]) -> None:
    """write() is a deque append: microseconds, plus at worst a GIL hand-over from a sink thread (~5 ms) or a
    scheduling hiccup on a busy machine; a write that waited on a delivery would take the 1-2 s timeouts."""
    times = sorted(times)
    p99 = times[int(0.99 * (len(times) - 1))]
    assert p99 < 0.01 and times[-1] < 0.5, f"write(): p99 {p99 * 1000:.2f} ms, max {times[-1] * 1000:.1f} ms"


def timed_writes(sinks, batches) -> list[float]:
    """Offer each batch to every sink the way the daemon does; the time each write() call took."""
    times = []
    for batch in batches:
        for s in sinks:
            t0 = time.perf_counter()
            s.write(batch)
            times.append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------- JSONL
@pytest.mark.parametrize("rotation", [
    {"rotate_mb": 0.004},  # ~4 KB files: a rotation every ~20 rows
    {"rotate_s": 0.03},
    {"rotate_mb": 0.01, "rotate_s": 0.05},
])
def test_jsonl_rotation_keeps_every_line_exactly_once(tmp_path, rotation):
    path = tmp_path / "out" / "results.jsonl"
    n, size = 1500, rotation.get("rotate_mb", 0) * 1024 * 1024
    with JsonlSink(path, keep=100_000, fsync="never", **rotation) as sink:
        for start in range(0, n, 15):
            sink.write(records(start, 15))
            if "rotate_s" in rotation:
                time.sleep(0.01)  # ~1 s in all: dozens of rotations by age
        assert sink.flush(30)
    files = rotated_files(path)
    rows = read_lines(files)
    assert [r["chunk"] for r in rows] == list(range(n))  # each line once, in order across the files
    assert rows[0] == record(0).to_json()
    assert sink.rotations >= 10 and len(files) == sink.rotations + 1
    assert sink.stats() == {"written": n, "dropped": 0, "errors": 0, "queue": 0}
    if size:
        assert all(f.stat().st_size <= size for f in files)


def test_jsonl_keeps_only_the_newest_rotated_files(tmp_path):
    path = tmp_path / "results.jsonl"
    with JsonlSink(path, rotate_mb=0.002, keep=3, fsync="never") as sink:
        for start in range(0, 600, 10):
            sink.write(records(start, 10))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "results.jsonl.1", "results.jsonl.2",
                                                          "results.jsonl.3"]
    ids = [r["chunk"] for r in read_lines(rotated_files(path))]
    assert ids == list(range(600 - len(ids), 600)) and sink.rotations > 10


@pytest.mark.parametrize("fsync", ["batch", "interval", "never"])
def test_jsonl_fsync_policies_write_every_row_and_append_to_an_existing_file(tmp_path, fsync):
    path = tmp_path / "results.jsonl"
    path.write_text('{"earlier": 1}\n{"cut": ')  # an earlier writer died mid-line
    with JsonlSink(path, fsync=fsync, fsync_interval_s=0.02) as sink:
        for start in range(0, 200, 4):
            sink.write(records(start, 4))
            time.sleep(0.001)
    lines = path.read_text().splitlines()
    assert lines[:2] == ['{"earlier": 1}', '{"cut": ']  # the partial line stays alone on its line
    assert [json.loads(x)["chunk"] for x in lines[2:]] == list(range(200))


def test_jsonl_unwritable_path_is_reported_counted_and_never_blocks(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the sink wants a directory")
    path = blocker / "results.jsonl"
    caplog.set_level(logging.INFO, logger="vlora_va.outputs.sinks")
    with JsonlSink(path, queue_max=50) as sink:
        times = timed_writes([sink], [records(i, 5) for i in range(0, 100, 5)])
        assert wait_for(lambda: sink.stats()["errors"] >= 1)  # it tried to open the file, and failed
        s = sink.stats()
        t0 = time.monotonic()
    close_s = time.monotonic() - t0
    assert s["written"] == 0 and s["errors"] >= 1 and s["queue"] == 50 and s["dropped"] == 50
    assert sink.stats() == {"written": 0, "dropped": 100, "errors": sink.stats()["errors"], "queue": 0}
    assert close_s < 2.0
    assert_never_blocked(times)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and f"jsonl:{path}" in errors[0] and "Not a directory" in errors[0]


def test_jsonl_survives_its_directory_vanishing_mid_run(tmp_path):
    """Rotation finds the directory replaced by a file (rename and reopen fail): rows wait in the queue,
    nothing is lost or doubled, and writing resumes once the directory is back."""
    d = tmp_path / "out"
    path = d / "results.jsonl"
    with JsonlSink(path, rotate_mb=0.002, keep=1000, fsync="never") as sink:
        sink.write(records(0, 50))
        assert sink.flush(10)
        d.rename(tmp_path / "moved")
        d.write_text("in the way")
        sink.write(records(50, 50))
        deadline = time.monotonic() + 10
        while sink.stats()["errors"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        stuck = sink.stats()
        d.unlink()
        (tmp_path / "moved").rename(d)
        assert sink.flush(30)
    assert stuck["errors"] >= 2 and stuck["queue"] > 0
    assert [r["chunk"] for r in read_lines(rotated_files(path))] == list(range(100))
    assert sink.stats() == {"written": 100, "dropped": 0, "errors": sink.stats()["errors"], "queue": 0}


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB filesystem (tmpfs) that fills up; skipped where mounting is not permitted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path, leave: int) -> None:
    """Fill the filesystem of path until only about `leave` bytes are free."""
    with open(path, "wb") as f:
        try:
            while True:
                st = os.statvfs(path.parent)
                free = st.f_bavail * st.f_frsize
                if free <= leave:
                    break
                f.write(b"\0" * min(65536, free - leave))
                f.flush()
        except OSError:
            pass


def test_jsonl_full_disk_keeps_lines_whole_and_resumes(tiny_disk):
    path, filler = tiny_disk / "results.jsonl", tiny_disk / "filler"
    fill(filler, leave=8192)
    with JsonlSink(path, queue_max=400, fsync="batch") as sink:
        sink.write(records(0, 20))  # fits in the 8 KiB left
        assert sink.flush(10)
        times = timed_writes([sink], [records(i, 10) for i in range(20, 1000, 10)])  # the disk fills up
        deadline = time.monotonic() + 10
        while sink.stats()["errors"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        full, rows_when_full = sink.stats(), read_lines([path])  # before the first retry (0.5 s later)
        filler.unlink()
        assert sink.flush(30)
    s = sink.stats()
    ids = [r["chunk"] for r in read_lines([path])]
    assert full["errors"] >= 1 and 20 <= full["written"] < 60 and full["dropped"] > 0
    assert len(rows_when_full) == full["written"]  # the failed write was cut back to the last whole line
    assert ids == sorted(set(ids)) and len(ids) == s["written"]  # whole lines, each once, in order
    assert s["written"] + s["dropped"] == 1000 and s["queue"] == 0 and s["written"] >= 400
    assert_never_blocked(times)


# ---------------------------------------------------------------- stdout
def test_stdout_sink_rows_parse_back(tmp_path):
    script = textwrap.dedent("""
        import logging, sys
        sys.path.insert(0, sys.argv[1])
        from tests.outputs.test_sinks import records
        from vlora_va.outputs.sinks import StdoutSink
        logging.basicConfig(level=logging.INFO)  # logs go to stderr, rows to stdout
        with StdoutSink() as sink:
            for start in range(0, 30, 3):
                sink.write(records(start, 3))
    """)
    r = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [rec.to_json() for rec in records(0, 30)]
    assert "sink stdout closed: 30 rows written" in r.stderr


# ---------------------------------------------------------------- webhook
class Receiver:
    """A local HTTP server that answers `status` (200: the batch is received) and can stop listening (connection
    refused) and come back on the same port."""

    def __init__(self):
        self.status, self.batches, self.keys, self.attempts = 200, [], [], 0
        self.signed: list[tuple[str | None, bytes]] = []  # (X-Vlora-Signature, body) of each POST
        self.lock = threading.Lock()
        self.port = 0
        self.server = None
        self.start()

    def start(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.attempts += 1
                    receiver.keys.append(self.headers["Idempotency-Key"])
                    receiver.signed.append((self.headers.get("X-Vlora-Signature"), body))
                    status = receiver.status
                    if status == 200:
                        assert self.headers["Content-Type"] == "application/json"
                        receiver.batches.append(json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/results"

    @property
    def ids(self):
        with self.lock:
            return [row["chunk"] for batch in self.batches for row in batch]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


def webhook(url, **kw):
    opts = dict(batch_max=10, flush_interval_s=0.05, timeout_s=2.0, retry_initial_s=0.05, retry_max_s=0.2,
                close_timeout_s=3.0)
    return WebhookSink(url, **{**opts, **kw})


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_webhook_fails_then_recovers_losing_nothing_up_to_the_queue_bound(receiver):
    receiver.status = 500
    with webhook(receiver.url, queue_max=50) as sink:
        # Phase 1: the server answers 500. 50 rows wait, the other 30 are dropped and counted.
        times = timed_writes([sink], [records(i, 4) for i in range(0, 80, 4)])
        assert wait_for(lambda: receiver.attempts >= 3)
        assert sink.stats() == {"written": 0, "dropped": 30, "errors": sink.stats()["errors"], "queue": 50}
        assert len(set(receiver.keys)) == 1  # the same batch, retried under the same key
        receiver.status = 200
        assert sink.flush(10)
        assert receiver.ids == list(range(50))
        # Phase 2: nothing listens (connection refused), then the server comes back on the same port.
        receiver.stop()
        errors_before = sink.stats()["errors"]
        sink.write(records(100, 20))
        assert wait_for(lambda: sink.stats()["errors"] > errors_before)
        assert sink.stats()["queue"] == 20
        receiver.start()
        assert sink.flush(10)
        assert receiver.ids == list(range(50)) + list(range(100, 120))
        # Phase 3: rows still queued at shutdown are delivered by the close.
        sink.flush_interval_s = 60.0
        sink.write(records(200, 5))
    assert receiver.ids == list(range(50)) + list(range(100, 120)) + list(range(200, 205))
    assert all(len(b) <= 10 for b in receiver.batches)
    assert sink.stats() == {"written": 75, "dropped": 30, "errors": sink.stats()["errors"], "queue": 0}
    assert_never_blocked(times)


def test_webhook_refused_batch_is_dropped_and_counted_the_rest_still_delivered(receiver):
    receiver.status = 400
    with webhook(receiver.url, flush_interval_s=0.0) as sink:
        sink.write(records(0, 10))
        assert sink.flush(10)
        receiver.status = 200
        sink.write(records(10, 10))
        assert sink.flush(10)
    assert receiver.ids == list(range(10, 20))
    assert sink.stats() == {"written": 10, "dropped": 10, "errors": 1, "queue": 0}


def test_webhook_down_at_shutdown_gives_up_quickly_and_counts_the_rest(receiver):
    receiver.stop()
    with webhook(receiver.url, close_timeout_s=10.0) as sink:
        sink.write(records(0, 30))
        assert wait_for(lambda: sink.stats()["errors"] >= 1)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2.0  # one more try, not the whole close_timeout_s
    assert sink.stats()["dropped"] == 30 and sink.stats()["written"] == 0
    receiver.start()  # the fixture stops it again


@pytest.fixture
def hung_server():
    """Accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/hook"
    stop.set()
    for c in held:
        c.close()
    srv.close()


def test_hung_webhook_never_stalls_write_or_the_other_sinks(hung_server, tmp_path):
    path = tmp_path / "results.jsonl"
    with JsonlSink(path, fsync="never") as jsonl:
        with webhook(hung_server, queue_max=100, timeout_s=1.0, close_timeout_s=1.0) as hook:
            times = timed_writes([hook, jsonl], [records(i, 5) for i in range(0, 1000, 5)])
            assert jsonl.flush(10)
            assert wait_for(lambda: hook.stats()["errors"] >= 1)  # at least one POST timed out
            s = hook.stats()
            t0 = time.monotonic()
        close_s = time.monotonic() - t0
    assert s["written"] == 0 and s["queue"] == 100 and s["dropped"] == 900 and s["errors"] >= 1
    assert hook.stats() == {"written": 0, "dropped": 1000, "errors": hook.stats()["errors"], "queue": 0}
    assert close_s < 2.0
    assert [r["chunk"] for r in read_lines([path])] == list(range(1000))
    assert_never_blocked(times)


# ---------------------------------------------------------------- ZeroMQ PUB
def test_zmq_pub_publishes_and_an_endpoint_in_use_is_counted_not_fatal(tmp_path, caplog):
    import zmq

    endpoint = f"ipc://{tmp_path}/results.sock"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    with ZmqPubSink(endpoint) as pub:
        # a TCP port already bound (ipc binds replace each other)
        with ZmqPubSink(f"tcp://127.0.0.1:{free_port()}") as other, ZmqPubSink(other.endpoint) as clash:
            clash.write(records(0, 3))
            assert clash.stats() == {"written": 0, "dropped": 3, "errors": 1, "queue": 0}
        sub.connect(endpoint)
        probes = subscribed(pub, sub)  # PUB/SUB: a late subscriber misses what was sent before it joined
        pub.write(records(0, 5))
        got = []
        while len(got) < 5:
            topic, message = sub.recv_multipart()
            if json.loads(message)["chunk"] != PROBE_CHUNK:  # probes sent before the first one arrived
                got.append((topic, message))
    sub.close(linger=0)
    ctx.term()
    assert [(t, json.loads(m)) for t, m in got] == [(b"cam", r.to_json()) for r in records(0, 5)]
    assert pub.stats()["written"] == 5 + probes
    assert any("cannot bind" in r.getMessage() for r in caplog.records)


PROBE_CHUNK = 10**6


def subscribed(pub, sub, timeout: float = 10.0) -> int:
    """Publish probe rows until the subscriber receives one: from then on it gets everything published (a fixed
    sleep would guess how long joining takes). Returns how many probes were published."""
    deadline, sent = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        pub.write(records(PROBE_CHUNK, 1))
        sent += 1
        if sub.poll(20):
            assert json.loads(sub.recv_multipart()[1])["chunk"] == PROBE_CHUNK
            return sent
    raise AssertionError(f"the subscriber received none of {sent} probes in {timeout} s")


# ---------------------------------------------------------------- config and metrics
CONFIG = """\
adapters: {detect: a/detect}
streams:
  - id: cam
    source: v.mp4
    tasks: [{adapter: detect}]
sinks:
  - type: jsonl
    path: out/results.jsonl
  - type: jsonl
    path: /var/log/r.jsonl
    rotate_mb: 64
    rotate_s: 3600
    keep: 24
    fsync: batch
  - type: stdout
    queue_max: 500
  - type: webhook
    url: https://user:secret@example.com:8443/hook?token=abc
    batch_max: 50
    flush_interval_s: 0.5
    queue_max: 2000
    timeout_s: 3
    retry_max_s: 60
    headers: {Authorization: Bearer xyz}
"""


def test_sink_config_parses_every_type_and_old_configs_stay_valid(tmp_path):
    cfg = parse_config(CONFIG, "p.yaml", tmp_path)
    plain, rotating, out, hook = cfg.sinks
    assert plain == SinkConfig(type="jsonl", options=JsonlOptions(path=str(tmp_path / "out/results.jsonl")))
    assert plain.options.fsync == "interval" and plain.options.rotate_mb == 0 and plain.queue_max == 10_000
    r = rotating.options
    assert (r.rotate_mb, r.rotate_s, r.keep, r.fsync) == (64.0, 3600.0, 24, "batch")
    assert out.type == "stdout" and out.queue_max == 500
    h = hook.options
    assert (h.batch_max, h.flush_interval_s, hook.queue_max, h.timeout_s, h.retry_max_s) == (50, 0.5, 2000, 3.0, 60.0)
    assert h.headers == (("Authorization", "Bearer xyz"),)
    names = [make_sink(s).name for s in cfg.sinks]
    assert names[2:] == ["stdout", "webhook:https://example.com:8443/hook"]  # no credentials in logs or labels
    default = parse_config(CONFIG.split("sinks:")[0], "p.yaml", tmp_path)
    default_file = JsonlOptions(path=str(tmp_path / "results/results.jsonl"))
    assert default.sinks == (SinkConfig(type="jsonl", options=default_file),)


@pytest.mark.parametrize("old, new, line, message", [
    ("fsync: batch", "fsync: always", 14, "sinks[1].fsync: must be one of batch, interval, never"),
    ("keep: 24", "keep: 0", 13, "sinks[1].keep: must be >= 1"),
    ("rotate_mb: 64", "rotate_mb: -1", 11, "sinks[1].rotate_mb: must be >= 0"),
    ("queue_max: 500", "path: x.jsonl", 16, "sinks[2].path: not an option of a stdout sink"),
    ("url: https://user", "url: ftp://user", 18, "sinks[3].url: expected an http:// or https:// URL"),
    ("batch_max: 50", "batch_max: 5000", 19, "sinks[3].batch_max: must be at most queue_max (2000)"),
    ("timeout_s: 3", "timeout_s: 0", 22, "sinks[3].timeout_s: must be >= 0.05"),
    ("Bearer xyz}", "5}", 24, "sinks[3].headers.Authorization: expected str"),
    ("{Authorization: Bearer xyz}", '{"Bad Name": x}', 24, "sinks[3].headers.Bad Name: not a valid HTTP header"),
    ("{Authorization: Bearer xyz}", '{X-A: "a\\r\\nHost: evil"}', 24, "cannot contain line breaks"),
    ("/var/log/r.jsonl", "out/results.jsonl", 10, "sinks[1].path: the same file as sinks[0]"),
    ("type: stdout", "type: kafka", 15, "sinks[2].type: must be one of jsonl, mqtt, stdout, webhook"),
])
def test_sink_config_errors_name_key_path_and_line(old, new, line, message):
    assert old in CONFIG
    with pytest.raises(ConfigError) as err:
        parse_config(CONFIG.replace(old, new, 1), "p.yaml")
    assert message in str(err.value) and err.value.line == line, str(err.value)


# ---------------------------------------------------------------- plug-in sinks
class MemorySink(QueuedSink):
    """A plug-in sink as a user would write one: it keeps the rows delivered to it, under its `label`."""

    def __init__(self, label: str, *, queue_max: int, close_timeout_s: float):
        super().__init__(f"memory:{label}", queue_max=queue_max, batch_max=16, close_timeout_s=close_timeout_s)
        self.rows: list[dict] = []

    @classmethod
    def from_config(cls, cfg: SinkConfig) -> "MemorySink":
        return cls(cfg.options["label"], queue_max=cfg.queue_max, close_timeout_s=cfg.close_timeout_s)

    def _deliver(self, rows):
        self.rows += [r.to_json() for r in rows]


@pytest.fixture
def memory_sink_type():
    SINKS.register("memory", MemorySink, options=("label",))
    try:
        yield
    finally:
        SINKS.unregister("memory")


PLUGIN_CONFIG = CONFIG.split("sinks:")[0] + """\
sinks:
  - type: memory
    label: lab
    queue_max: 40
"""


def test_a_registered_plugin_sink_is_configured_built_and_fed_like_a_built_in_one(tmp_path, memory_sink_type):
    (entry,) = parse_config(PLUGIN_CONFIG, "p.yaml", tmp_path).sinks
    assert entry == SinkConfig(type="memory", queue_max=40, options={"label": "lab"})
    sink = make_sink(entry)
    assert type(sink) is MemorySink and sink.name == "memory:lab"
    with sink:
        sink.write(records(0, 50))  # one write of 50 into a queue of 40: 10 dropped, whatever the thread does
        assert sink.flush(10)
        sink.write(records(50, 5))
    assert sink.rows == [r.to_json() for r in records(0, 40) + records(50, 5)]
    assert sink.stats() == {"written": 45, "dropped": 10, "errors": 0, "queue": 0}


@pytest.mark.parametrize("old, new, message", [
    ("label: lab", "path: x.jsonl",
     "sinks[0].path: not an option of a memory sink (allowed: close_timeout_s, label, queue_max, type)"),
    ("label: lab", "colour: red", "sinks[0].colour: unknown key (allowed: "),
    ("type: memory", "type: kafka", "sinks[0].type: must be one of jsonl, mqtt, stdout, webhook, memory, got 'kafka'"),
])
def test_plugin_sink_config_errors_name_the_allowed_keys_and_known_types(memory_sink_type, old, new, message):
    assert old in PLUGIN_CONFIG
    with pytest.raises(ConfigError) as err:
        parse_config(PLUGIN_CONFIG.replace(old, new, 1), "p.yaml")
    assert message in str(err.value), str(err.value)
    if "colour" in new:
        assert "label" in str(err.value)  # the plug-in's key is among the allowed ones


@dataclass(frozen=True)
class LabelOptions(SinkOptions):
    """A plug-in sink's own keys, declared and checked in the shape the built-in sinks' are (JsonlOptions...)."""

    label: str
    every: int = 1

    @classmethod
    def read(cls, entry: SinkEntry) -> "LabelOptions | None":
        label = entry.get("label", str)
        every = entry.get("every", int, cls.every, minimum=1)
        return cls(label=label, every=every) if label is not None else None


class LabelledSink(MemorySink):
    @classmethod
    def from_config(cls, cfg: SinkConfig) -> "LabelledSink":
        return cls(cfg.options.label, queue_max=cfg.queue_max, close_timeout_s=cfg.close_timeout_s)


@pytest.fixture
def labelled_sink_type():
    SINKS.register("labelled", LabelledSink, options=LabelOptions)
    try:
        yield
    finally:
        SINKS.unregister("labelled")


def one_sink(*keys: str) -> str:
    """CONFIG with one sink of these keys (one per line) instead of its sinks."""
    return CONFIG.split("sinks:")[0] + "sinks:\n" + "".join(f"  {'-' if i == 0 else ' '} {k}\n"
                                                               for i, k in enumerate(keys))


@pytest.mark.parametrize("keys, bad, message", [
    (("type: jsonl", "path: r.jsonl"), "keep: 0", "sinks[0].keep: must be >= 1, got 0"),
    (("type: labelled", "label: lab"), "every: 0", "sinks[0].every: must be >= 1, got 0"),
    (("type: jsonl", "path: r.jsonl"), "label: lab", "sinks[0].label: not an option of a jsonl sink (allowed: "),
    (("type: labelled", "label: lab"), "path: r.jsonl",
     "sinks[0].path: not an option of a labelled sink (allowed: close_timeout_s, every, label, queue_max, type)"),
    (("type: jsonl", "keep: 3"), "fsync: never", "sinks[0].path: required key is missing"),
    (("type: labelled", "every: 3"), "queue_max: 9", "sinks[0].label: required key is missing"),
], ids=["built-in-value", "plug-in-value", "built-in-key", "plug-in-key", "built-in-missing", "plug-in-missing"])
def test_a_built_in_and_a_plug_in_sink_check_their_own_keys_at_load_alike(labelled_sink_type, keys, bad, message):
    """Each sink type declares and checks its keys (a SinkOptions), built-in or plug-in: a bad value, a key of
    another type or a missing one fails parse_config, before anything starts, naming the key and its line (a
    missing key: the line its entry starts on)."""
    text = one_sink(*keys, bad)
    lines = text.splitlines()
    entry_line, bad_line = lines.index(f"  - {keys[0]}") + 1, lines.index(f"    {bad}") + 1
    with pytest.raises(ConfigError) as err:
        parse_config(text, "p.yaml")
    line = entry_line if "missing" in message else bad_line
    assert err.value.errors == [err.value] and str(err.value).startswith(f"p.yaml:{line}: {message}"), str(err.value)


def test_a_plug_in_sinks_checked_options_reach_it_typed(tmp_path, labelled_sink_type):
    (entry,) = parse_config(one_sink("type: labelled", "label: lab", "every: 3"), "p.yaml", tmp_path).sinks
    assert entry == SinkConfig(type="labelled", options=LabelOptions(label="lab", every=3))
    sink = make_sink(entry)
    assert type(sink) is LabelledSink and sink.name == "memory:lab"


def test_every_registered_sink_type_is_a_sink_that_builds_itself_from_its_config():
    assert {"jsonl", "stdout", "webhook"} <= set(SINKS.names())
    for name in SINKS.names():
        cls = SINKS.load(name)
        assert isinstance(cls, type) and issubclass(cls, Sink), name
        assert cls.from_config.__func__ is not Sink.from_config.__func__, f"{name}: {cls.__name__} has no from_config"
    assert issubclass(ZmqPubSink, Sink)  # not a sinks[] type, but the daemon treats it as one


def test_a_registration_that_cannot_build_a_sink_is_refused_by_name():
    class NoConfig(MemorySink):
        from_config = Sink.__dict__["from_config"]  # as if it never defined one

    for target, error, text in [(dict, TypeError, "sink type 'bad' is registered as <class 'dict'>, which is not"),
                                (NoConfig, NotImplementedError, "NoConfig cannot be built from a sinks[] entry")]:
        SINKS.register("bad", target)
        try:
            with pytest.raises(error) as err:
                make_sink(SinkConfig(type="bad"))
            assert text in str(err.value), str(err.value)
        finally:
            SINKS.unregister("bad")


def test_sink_stats_become_prometheus_series():
    m = DaemonMetrics()
    m.sink_stats("jsonl:/r.jsonl", {"written": 10, "dropped": 0, "errors": 0, "queue": 3})
    m.sink_stats("jsonl:/r.jsonl", {"written": 25, "dropped": 4, "errors": 2, "queue": 0})
    get = lambda name, **labels: m.registry.get_sample_value(name, {"sink": "jsonl:/r.jsonl", **labels})
    assert get("vlora_sink_rows_total", outcome="written") == 25
    assert get("vlora_sink_rows_total", outcome="dropped") == 4
    assert get("vlora_sink_errors_total") == 2 and get("vlora_sink_queue_rows") == 0


# ---------------------------------------------------------------- in the daemon
def test_daemon_with_an_unwritable_sink_serves_everything_to_the_working_one(tmp_path, tiny_backbone_dir,
                                                                             tiny_adapters, caplog):
    from tests.serving.test_daemon import RunningDaemon, chunk_parts, config

    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    bad = str(blocker / "results.jsonl")
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters)
    cfg = dataclasses.replace(cfg, sinks=(cfg.sinks[0], SinkConfig(type="jsonl", options=JsonlOptions(path=bad))))
    caplog.set_level(logging.INFO, logger="vlora_va.outputs.sinks")
    d = RunningDaemon(cfg)
    try:
        for seq in range(6):
            for stream in ("a", "b"):
                d.send(chunk_parts(stream, seq, [("det", "detect"), ("act", "actions")]))
        t0 = time.monotonic()
        rows = d.finish()  # rows of the working sink (sinks[0])
        finish_s = time.monotonic() - t0
    finally:
        d.stop.set()
    assert len(rows) == 24 and all(r["status"] == "ok" for r in rows)
    assert sorted((r["stream"], r["task"], r["chunk"]) for r in rows) == sorted(
        (s, t, q) for s in ("a", "b") for t in ("det", "act") for q in range(6))
    good, failing = d.daemon.row_writer.sinks
    assert good.stats() == {"written": 24, "dropped": 0, "errors": 0, "queue": 0}
    assert failing.stats()["written"] == 0 and failing.stats()["dropped"] == 24 and failing.stats()["errors"] >= 1
    assert d.daemon.metrics.sinks[f"jsonl:{bad}"]["written"] == 0
    assert any(f"jsonl:{bad}" in r.getMessage() and r.levelno >= logging.ERROR for r in caplog.records)
    assert finish_s < 30


def test_a_row_that_cannot_be_serialised_is_dropped_and_counted_not_retried_forever(tmp_path):
    """One bad row (a bug: to_json raises) must not stop the rows after it."""
    from vlora_va.outputs.sinks import JsonlSink

    class Broken:
        stream, chunk = "cam", 99

        def to_json(self):
            raise ValueError("year -1086 is out of range")

    path = tmp_path / "rows.jsonl"
    rows = records(0, 3)
    sink = JsonlSink(path)
    with sink:
        sink.write([rows[0], Broken(), *rows[1:]])
        assert sink.flush(10)
    lines = path.read_text().splitlines()
    st = sink.stats()
    assert st["dropped"] == 1 and st["errors"] >= 1 and len(lines) == 3


def test_a_signed_webhook_lets_the_receiver_check_every_body(receiver, tmp_path):
    """hmac_secret: every POST carries X-Vlora-Signature = sha256=HMAC-SHA256(secret, body); the receiver's own
    computation over the body it got matches, a changed body or another secret does not; unsigned sinks add no
    header."""
    import hashlib
    import hmac

    cfg = parse_config(CONFIG.replace("headers: {Authorization: Bearer xyz}",
                                      "headers: {Authorization: Bearer xyz}\n    hmac_secret: s3cret"),
                       "p.yaml", tmp_path)
    assert cfg.sinks[3].options.hmac_secret == "s3cret"
    assert parse_config(CONFIG, "p.yaml", tmp_path).sinks[3].options.hmac_secret == ""  # unsigned by default
    with webhook(receiver.url, hmac_secret="s3cret") as sink:
        sink.write(records(0, 25))
        assert wait_for(lambda: len(receiver.ids) == 25)
    with webhook(receiver.url) as plain:
        plain.write(records(100, 1))
        assert wait_for(lambda: len(receiver.ids) == 26)
    *signed, (unsigned_header, _) = receiver.signed
    assert len(signed) == 3 and unsigned_header is None
    for header, body in signed:
        want = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(header, want)
        assert header != "sha256=" + hmac.new(b"other", body, hashlib.sha256).hexdigest()
        assert header != "sha256=" + hmac.new(b"s3cret", body + b" ", hashlib.sha256).hexdigest()
