"""The MQTT sink against a real Mosquitto broker (Debian `mosquitto`), started by the tests on a free loopback port
with its own config in tmp_path: every event arrives at QoS 1, also across a broker restart; the retained count
and status topics hold the last values; drops are counted while the broker stays down; the daemon's last will
says "offline" when its process dies; bad config names the key. Subscribers are real paho clients.
A cluster daemon's own `vlora/daemons/<name>/available` (outputs/availability.py) is tested here too: it shares
the sink's broker, connection code and will."""

from __future__ import annotations

import getpass
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.conftest import free_port, unavailable
from vlora_va.contracts.config import ConfigError, SinkConfig, parse_config
from vlora_va.contracts.events import EventRecord
from vlora_va.contracts.results import Latency, ResultRecord
from vlora_va.outputs.availability import DaemonAvailability
from vlora_va.outputs.sinks import make_sink
from vlora_va.outputs.sinks.mqtt import DISCONNECT_WAIT_S, MqttSink
from vlora_va.outputs.sinks.mqtt_options import MqttOptions

ROOT = Path(__file__).resolve().parents[2]
MOSQUITTO = "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = "/usr/bin/mosquitto_passwd"
OPENSSL = "/usr/bin/openssl"


# ---------------------------------------------------------------- the broker
class Broker:
    """A Mosquitto process on 127.0.0.1:port, its config, persistence and log in `home`. stop() and start()
    again reuse the port and the persistence file (subscriptions of persistent sessions, queued and retained
    messages survive a stop, as on a real broker)."""

    def __init__(self, home: Path, port: int, extra_conf: str = "", anonymous: bool = True):
        self.home, self.port = home, port
        home.mkdir(parents=True, exist_ok=True)
        self.conf = home / "mosquitto.conf"
        self.log = home / "mosquitto.log"
        self.conf.write_text(textwrap.dedent(f"""\
            listener {port} 127.0.0.1
            allow_anonymous {"true" if anonymous else "false"}
            persistence true
            persistence_location {home}/
            max_queued_messages 0
            log_dest file {self.log}
            log_type error
            log_type warning
            log_type notice
            log_type information
            user {getpass.getuser()}
            """) + extra_conf)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> None:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"mosquitto did not listen on port {self.port} in {timeout} s: {self._log_tail()}")

    def stop(self) -> None:
        """A clean stop (SIGTERM): the broker saves its persistence file."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def _log_tail(self) -> str:
        return self.log.read_text()[-2000:] if self.log.exists() else "(no log)"


def _require_mosquitto() -> None:
    """Skips where Mosquitto is missing, except under CI (env CI set), where that is a failure: CI installs it
    (scripts/setup-test-system.sh)."""
    if not os.access(MOSQUITTO, os.X_OK):
        message = f"MQTT test broker unavailable ({MOSQUITTO} not found); install: apt-get install -y mosquitto"
        unavailable(message)


@pytest.fixture
def broker_for(tmp_path):
    """start(extra_conf="", anonymous=True) -> a started Broker on a free loopback port; all are killed at the end."""
    _require_mosquitto()
    brokers: list[Broker] = []

    def start(extra_conf: str = "", anonymous: bool = True) -> Broker:
        b = Broker(tmp_path / f"broker{len(brokers)}", free_port(), extra_conf, anonymous)
        brokers.append(b)
        b.start()
        return b

    try:
        yield start
    finally:
        for b in brokers:
            b.kill()


@pytest.fixture
def broker(broker_for) -> Broker:
    return broker_for()


# ---------------------------------------------------------------- a subscriber
class Subscriber:
    """A paho client subscribed to `vlora/#` at QoS 1 that records every message (topic, payload, retain flag).
    persistent=True: a fixed client id and a persistent session (clean_session=False), so the broker keeps the
    subscription and queues messages for it while it is away, including across a broker restart; it reconnects
    by itself."""

    def __init__(self, port: int, persistent: bool = False, topic: str = "vlora/#"):
        self.messages: list[tuple[str, str, bool]] = []
        self.sessions: list[bool] = []  # session_present of every CONNACK
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._topic = topic
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"test-sub-{uuid.uuid4().hex[:8]}",
                                  clean_session=not persistent)
        self.client.reconnect_delay_set(min_delay=0.05, max_delay=0.2)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()
        assert self._subscribed.wait(10), "no SUBACK"

    def _on_connect(self, client, _u, flags, reason, _p):
        with self._lock:
            self.sessions.append(flags.session_present)
        client.subscribe(self._topic, qos=1)  # idempotent; a persistent session already has it

    def _on_message(self, _c, _u, msg):
        with self._lock:
            self.messages.append((msg.topic, msg.payload.decode(), msg.retain))

    def on(self, topic: str) -> list[str]:
        with self._lock:
            return [p for t, p, _ in self.messages if t == topic]

    def event_ids(self) -> list[str]:
        with self._lock:
            return [json.loads(p)["id"] for t, p, _ in self.messages if t.endswith("/events")]

    def barrier(self, timeout: float = 10.0) -> None:
        """Publish a marker and wait for it to come back: the broker routes what it took before the marker to
        this subscriber first, so everything published (and acknowledged) before this call has arrived."""
        marker = f"vlora/_barrier/{uuid.uuid4().hex}"
        self.client.publish(marker, "x", qos=1)
        assert wait_for(lambda: self.on(marker), timeout), "the barrier message never came back"

    def retained(self) -> dict[str, str]:
        """Topic -> payload of the retained messages the broker sent at subscribe time (subscribe, then a
        barrier: retained messages are queued to a subscriber before anything published after its SUBACK)."""
        self.barrier()
        with self._lock:
            return {t: p for t, p, retain in self.messages if retain}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def subscribers():
    made: list[Subscriber] = []

    def make(port: int, **kw) -> Subscriber:
        s = Subscriber(port, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


# What a busy 2-core machine may add to a timed step under `make test` (another test's daemon, a compile): bounds
# below are the configured timeout plus this. Measured: 20 runs of each timed test under two spinning processes
# (docs/benchmarks.md, "Timed tests under load").
LOAD_SLACK_S = 1.0


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


# ---------------------------------------------------------------- rows
T0 = 1_790_000_000.0


def events(start: int, n: int, streams=("cam1", "cam2")) -> list[EventRecord]:
    """Line crossings and zone entries on alternating streams, each carrying its rule's running counts."""
    out = []
    for i in range(start, start + n):
        stream = streams[i % len(streams)]
        common = dict(id=f"run-{i}", stream=stream, ts=i * 0.5, captured_at=T0 + i, task="detect", chunk=i,
                      track_id=f"run-t{i}", cls="person", box=(10.0, 20.0, 30.0, 40.0 + i), counts_since=T0)
        if i % 3:
            out.append(EventRecord(event="line_crossed", line="path", direction="in" if i % 2 else "out",
                                   counts={"in": {"person": i}, "out": {"person": i // 2}}, **common))
        else:
            out.append(EventRecord(event="zone_entered", phase="start", zone="lawn",
                                   counts={"inside": {"person": 1}, "entered": {"person": i}, "left": {}}, **common))
    return out


def stream_event(i: int, stream: str, event: str) -> EventRecord:
    return EventRecord(id=f"run-{i}", event=event, stream=stream, ts=i * 0.5, captured_at=T0 + i,
                       phase="start" if event == "stream_offline" else "end")


def result_row(i: int, stream: str) -> ResultRecord:
    return ResultRecord(stream=stream, chunk=i, task="detect", adapter="detect", status="ok", frame_ts=(i + 0.5,),
                        latency=Latency(0.01, 0.2, 0.4), deadline_ms=2000.0, deadline_met=True)


def expected_retained(rows: list, prefix: str = "vlora") -> dict[str, str]:
    """The test's books: what the retained topics must hold after these rows, from the rows alone."""
    out = {f"{prefix}/available": "online"}
    for r in rows:
        row = r.to_json()
        s = row["stream"]
        out.setdefault(f"{prefix}/{s}/status", "online")
        if row["type"] != "event":
            continue
        for kind, key in (("lines", "line"), ("zones", "zone")):
            if key in row and "counts" in row:
                out[f"{prefix}/{s}/{kind}/{row[key]}/count"] = json.dumps(
                    {"counts": row["counts"], "counts_since": row["counts_since"], "ts": row["ts"]})
        if row["event"] in ("stream_offline", "stream_online"):
            out[f"{prefix}/{s}/status"] = "offline" if row["event"] == "stream_offline" else "online"
    return out


def sink(port: int, **kw) -> MqttSink:
    opts = dict(timeout_s=2.0, retry_initial_s=0.05, retry_max_s=0.2, close_timeout_s=3.0)
    return MqttSink("127.0.0.1", port=port, **{**opts, **kw})


def as_json(payloads: dict[str, str]) -> dict:
    """Payloads compared as values, not byte strings ("online" stays a string)."""
    out = {}
    for t, p in payloads.items():
        try:
            out[t] = json.loads(p)
        except ValueError:
            out[t] = p
    return out


# ---------------------------------------------------------------- tests
def test_every_event_arrives_at_qos1_and_retained_topics_hold_the_last_values(broker, subscribers):
    live = subscribers(broker.port)
    rows = events(0, 46) + [stream_event(46, "cam1", "stream_offline"), stream_event(47, "cam2", "stream_offline"),
                            stream_event(48, "cam1", "stream_online")]
    rows.append(events(49, 1)[0])
    offered = rows[:20] + [result_row(0, "cam3"), result_row(1, "cam1")] + rows[20:]  # results: only cam3's status
    with sink(broker.port) as s:
        for i in range(0, len(offered), 7):
            s.write(offered[i:i + 7])
        assert s.flush(10)
        live.barrier()
        # every event once, in order, as its row; nothing of the result rows
        assert live.event_ids() == [r.id for r in rows]
        for r in rows:
            assert [json.loads(p) for p in live.on(f"vlora/{r.stream}/events") if json.loads(p)["id"] == r.id] == [
                r.to_json()]
        assert live.on("vlora/cam3/events") == []
        assert s.stats() == {"written": 50, "dropped": 0, "errors": 0, "queue": 0}  # result rows are not offered
        # a fresh subscriber gets the last values of every retained topic, and nothing else retained
        fresh = subscribers(broker.port)
        books = expected_retained(offered)
        assert as_json(fresh.retained()) == as_json(books)
        assert books["vlora/cam1/status"] == "online" and books["vlora/cam2/status"] == "offline"
        assert books["vlora/cam3/status"] == "online"
    # a clean close says offline itself (the broker sends the will only when a connection dies)
    after = subscribers(broker.port)
    assert after.retained()["vlora/available"] == "offline"


def test_every_event_arrives_at_least_once_across_a_broker_restart(broker, subscribers):
    """At least once (QoS 1): a message the broker took but whose PUBACK was lost as it stopped is published
    again. The books: the set of ids received equals the set written, and every one arrived."""
    live = subscribers(broker.port, persistent=True)  # the broker keeps its subscription across the restart
    rows = events(0, 50)
    with sink(broker.port, queue_max=1000) as s:
        s.write(rows[:25])
        assert wait_for(lambda: len(set(live.event_ids())) >= 10)
        s.write(rows[25:30])  # some of these may be in flight as the broker stops
        broker.stop()
        errors = s.stats()["errors"]
        s.write(rows[30:45])  # the broker is down: these wait in the queue
        assert wait_for(lambda: s.stats()["errors"] > errors)
        assert s.stats()["queue"] >= 15 and s.stats()["dropped"] == 0
        broker.start()
        s.write(rows[45:])
        assert s.flush(20)
        assert wait_for(lambda: set(live.event_ids()) == {r.id for r in rows}, 20)
        live.barrier()
        assert s.stats()["written"] == 50 and s.stats()["dropped"] == 0 and s.stats()["queue"] == 0
    received = live.event_ids()
    assert set(received) == {r.id for r in rows} and len(received) >= len(rows)
    assert live.sessions[0] is False and all(live.sessions[1:]) and len(live.sessions) >= 2  # the session survived
    fresh = subscribers(broker.port)
    assert as_json(fresh.retained()) == as_json({**expected_retained(rows), "vlora/available": "offline"})


def test_a_broker_that_lost_its_retained_messages_gets_them_again_on_reconnect(broker, subscribers):
    rows = events(0, 12) + [stream_event(12, "cam2", "stream_offline")]
    with sink(broker.port) as s:
        s.write(rows)
        assert s.flush(10)
        broker.kill()  # SIGKILL: its persistence file is never written, the retained messages are gone
        broker.start()
        assert subscribers(broker.port).retained() == {}
        last = events(13, 1)  # the sink reconnects to deliver it, and first says again what it had retained
        s.write(last)
        assert s.flush(10)
        assert as_json(subscribers(broker.port).retained()) == as_json(expected_retained(rows + last))


def test_broker_down_counts_drops_and_close_ends_within_its_timeout(caplog):
    port = free_port()  # nothing listens there
    caplog.set_level(logging.INFO, logger="vlora_va")
    close_timeout = 1.0
    s = sink(port, queue_max=10, close_timeout_s=close_timeout, username="alice", password="s3cret-pw")
    with s:
        s.write(events(0, 12) + [result_row(0, "cam1")])
        s.write(events(12, 18))
        assert wait_for(lambda: s.stats()["errors"] >= 2)
        st = s.stats()
        assert (st["written"], st["dropped"], st["queue"]) == (0, 20, 10)
        assert st["written"] + st["dropped"] + st["queue"] == 30  # the event rows offered; the result row is not
        t0 = time.monotonic()
    assert time.monotonic() - t0 < close_timeout + LOAD_SLACK_S
    assert s.stats() == {"written": 0, "dropped": 30, "errors": s.stats()["errors"], "queue": 0}
    assert "Connection refused" in caplog.text
    assert "s3cret-pw" not in caplog.text + s.name and "alice" not in s.name


def test_a_hung_broker_never_stalls_write_and_close_ends_in_time():
    with socket.socket() as hung:  # the kernel completes the TCP handshake; nothing ever answers the CONNECT
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        network_timeout, close_timeout = 0.3, 1.0
        s = sink(hung.getsockname()[1], timeout_s=network_timeout, close_timeout_s=close_timeout)
        with s:
            times = []
            for i in range(0, 40, 4):
                t0 = time.perf_counter()
                s.write(events(i, 4))
                times.append(time.perf_counter() - t0)
            assert wait_for(lambda: s.stats()["errors"] >= 1)
            t0 = time.monotonic()
        assert time.monotonic() - t0 < close_timeout + LOAD_SLACK_S
    # a deque append: a write that waited for the network would take the network timeout at least
    assert max(times) < network_timeout / 2
    assert s.stats() == {"written": 0, "dropped": 40, "errors": s.stats()["errors"], "queue": 0}


def test_credentials_are_sent_and_a_wrong_password_is_reported_without_it(broker_for, tmp_path, caplog):
    passwords = tmp_path / "passwd"
    subprocess.run([MOSQUITTO_PASSWD, "-b", "-c", str(passwords), "cam-daemon", "right-pw"], check=True,
                   capture_output=True)
    b = broker_for(f"password_file {passwords}\n", anonymous=False)
    caplog.set_level(logging.INFO, logger="vlora_va")
    with sink(b.port, username="cam-daemon", password="wrong-pw", close_timeout_s=0.5) as bad:
        bad.write(events(0, 3))
        assert wait_for(lambda: bad.stats()["errors"] >= 1)
    assert bad.stats()["written"] == 0 and bad.stats()["dropped"] == 3
    assert "refused the connection" in caplog.text and "wrong-pw" not in caplog.text
    with sink(b.port, username="cam-daemon", password="right-pw") as good:
        good.write(events(0, 3))
        assert good.flush(10)
    assert good.stats() == {"written": 3, "dropped": 0, "errors": 0, "queue": 0}


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    """A throwaway certificate authority: (cert, key)."""
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
            "-subj", f"/CN={name}", "-keyout", key, "-out", cert)
    return cert, key


def openssl(*args) -> None:
    if not os.access(OPENSSL, os.X_OK):
        message = f"{OPENSSL} not found; install: apt-get install -y openssl"
        unavailable(message)
    subprocess.run([OPENSSL, *map(str, args)], check=True, capture_output=True)


def test_tls_with_the_brokers_ca_delivers_and_another_ca_is_refused(broker_for, tmp_path, caplog):
    ca, ca_key = make_ca(tmp_path, "test-ca")
    other_ca, _ = make_ca(tmp_path, "other-ca")
    key, csr, cert, ext = (tmp_path / n for n in ("server.key", "server.csr", "server.pem", "san.ext"))
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", key, "-out", csr)
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1", "-extfile", ext,
            "-out", cert)
    b = broker_for(f"cafile {ca}\ncertfile {cert}\nkeyfile {key}\n")  # the listener speaks TLS only
    with sink(b.port, tls_ca=str(ca)) as good:
        assert good.name.startswith("mqtts://")
        good.write(events(0, 5))
        assert good.flush(10)
    assert good.stats() == {"written": 5, "dropped": 0, "errors": 0, "queue": 0}
    with sink(b.port, tls_ca=str(other_ca), close_timeout_s=0.5) as bad:
        bad.write(events(0, 5))
        assert wait_for(lambda: bad.stats()["errors"] >= 1)
    assert bad.stats()["written"] == 0 and bad.stats()["dropped"] == 5
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


SINK_PROCESS = """\
import sys, time
from vlora_va.contracts.events import EventRecord
from vlora_va.outputs.sinks.mqtt import MqttSink
sink = MqttSink("127.0.0.1", port=int(sys.argv[1]), retry_initial_s=0.05).__enter__()
sink.write([EventRecord(id="run-0", event="line_crossed", stream="cam1", ts=0.0, captured_at=None, line="path")])
assert sink.flush(10)
print("READY", flush=True)
time.sleep(600)
"""


def test_the_last_will_says_offline_when_the_sink_process_dies(broker, subscribers):
    live = subscribers(broker.port)
    proc = subprocess.Popen([sys.executable, "-c", SINK_PROCESS, str(broker.port)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().startswith("READY"), "the sink process did not start"
        live.barrier()
        assert live.on("vlora/available") == ["online"] and len(live.event_ids()) == 1
        proc.send_signal(signal.SIGKILL)  # no clean close: only the broker can say it
        proc.wait(10)
        assert wait_for(lambda: live.on("vlora/available") == ["online", "offline"])
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
    assert subscribers(broker.port).retained()["vlora/available"] == "offline"


# ---------------------------------------------------------------- a cluster daemon's availability
def availability(port: int, daemon: str = "d1", **kw) -> DaemonAvailability:
    return DaemonAvailability(SinkConfig(type="mqtt", options=MqttOptions(host="127.0.0.1", port=port, **kw)), daemon,
                              retry_initial_s=0.05, retry_max_s=0.2)


HOLDER_PROCESS = """\
import sys, time
from vlora_va.contracts.config import SinkConfig
from vlora_va.outputs.availability import DaemonAvailability
from vlora_va.outputs.sinks.mqtt_options import MqttOptions
broker = MqttOptions(host="127.0.0.1", port=int(sys.argv[1]))
DaemonAvailability(SinkConfig(type="mqtt", options=broker), sys.argv[2]).__enter__()
print("HOLDING", flush=True)
time.sleep(600)
"""


def start_holder(port: int, daemon: str) -> subprocess.Popen:
    """A process holding daemon's availability (its "online" is awaited at the broker by the caller)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_PROCESS, str(port), daemon], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    assert ready and proc.stdout.readline().startswith("HOLDING"), "the holder process did not start"
    return proc


def end_holder(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(10)
    proc.stdout.close()


def test_daemon_availability_is_retained_online_while_held_again_after_a_broker_restart_and_offline_after(
        broker, subscribers):
    live = subscribers(broker.port)
    with availability(broker.port) as a:
        assert a.topic == "vlora/daemons/d1/available"
        assert wait_for(lambda: live.on(a.topic) == ["online"])
        assert subscribers(broker.port).retained() == {a.topic: "online"}  # retained; the collector's topic untouched
        broker.kill()  # SIGKILL: the broker forgets its retained messages; paho's loop reconnects by itself
        broker.start()
        again = subscribers(broker.port)
        assert wait_for(lambda: again.on(a.topic) == ["online"])  # said again on the new connection
    assert wait_for(lambda: again.on(a.topic) == ["online", "offline"])  # a clean exit says it
    assert subscribers(broker.port).retained() == {a.topic: "offline"}


def test_daemon_availability_last_will_says_offline_when_its_process_dies(broker, subscribers):
    live = subscribers(broker.port)
    proc = start_holder(broker.port, "d1")
    try:
        assert wait_for(lambda: live.on("vlora/daemons/d1/available") == ["online"], 30)
        proc.send_signal(signal.SIGKILL)  # no clean exit: only the broker can say it
        proc.wait(10)
        assert wait_for(lambda: live.on("vlora/daemons/d1/available") == ["online", "offline"])
    finally:
        end_holder(proc)
    assert subscribers(broker.port).retained() == {"vlora/daemons/d1/available": "offline"}


def test_a_restarted_daemon_takes_over_a_silent_ones_connection_and_its_will_comes_before_online(broker, subscribers):
    """A daemon whose node went silent (SIGSTOP: its connection stays open, the broker would notice only after the
    keepalive) is started again under its name: the broker sends the old connection's will at once, then the new
    one says online, so the topic ends "online" and no late will overwrites it."""
    live = subscribers(broker.port)
    proc = start_holder(broker.port, "d1")
    try:
        assert wait_for(lambda: live.on("vlora/daemons/d1/available") == ["online"], 30)
        proc.send_signal(signal.SIGSTOP)
        with availability(broker.port, "d1"):
            assert wait_for(lambda: live.on("vlora/daemons/d1/available") == ["online", "offline", "online"])
            assert subscribers(broker.port).retained() == {"vlora/daemons/d1/available": "online"}
    finally:
        end_holder(proc)


def test_daemon_availability_with_the_broker_down_never_raises_logs_once_and_exits_promptly(caplog):
    caplog.set_level(logging.INFO, logger="vlora_va")
    t0 = time.monotonic()
    with availability(free_port(), password="s3cret-pw", username="alice") as a:  # nothing listens there
        assert time.monotonic() - t0 < a.timeout_s / 2  # entering never waits for the broker (that takes timeout_s)
        assert wait_for(lambda: a.failures >= 4)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < DISCONNECT_WAIT_S + LOAD_SLACK_S  # at worst the DISCONNECT wait, then cut
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "Connection refused" in warnings[0], warnings
    assert "s3cret-pw" not in caplog.text


def test_daemon_availability_says_online_when_a_broker_that_was_down_comes(tmp_path, subscribers):
    _require_mosquitto()
    port = free_port()
    late = Broker(tmp_path / "late", port)
    with availability(port) as a:
        assert wait_for(lambda: a.failures >= 1)
        late.start()
        try:
            live = subscribers(port)
            assert wait_for(lambda: live.on(a.topic) == ["online"])
        finally:
            late.kill()


def test_daemon_availability_names_one_topic_level_and_needs_an_mqtt_sink():
    assert availability(1883, "gpu/0+#").topic == "vlora/daemons/gpu_0__/available"
    with pytest.raises(ValueError, match="needs an mqtt sink, got a 'jsonl' sink"):
        DaemonAvailability(SinkConfig(type="jsonl"), "d1")
    with pytest.raises(ValueError, match="daemon's name"):
        availability(1883, "")


# ---------------------------------------------------------------- config
CONFIG = """\
adapters: {detect: a/detect}
streams:
  - id: cam
    source: v.mp4
    tasks: [{adapter: detect}]
sinks:
  - type: mqtt
    host: broker.local
    port: 8883
    topic_prefix: site1/vlora
    qos: 2
    username: alice
    password: hunter2-secret
    tls_ca: ca.pem
    queue_max: 500
  - type: mqtt
    host: 127.0.0.1
"""


def test_mqtt_sink_config_parses_and_builds_a_sink_without_credentials_in_its_name(tmp_path):
    (tmp_path / "ca.pem").write_text("not checked until the sink connects")
    full, plain = parse_config(CONFIG, "p.yaml", tmp_path).sinks
    assert full == SinkConfig(type="mqtt", queue_max=500, options=MqttOptions(
        host="broker.local", port=8883, topic_prefix="site1/vlora", qos=2, username="alice", password="hunter2-secret",
        tls_ca=str(tmp_path / "ca.pem")))
    p = plain.options
    assert (p.port, p.topic_prefix, p.qos, p.username, p.password, p.tls_ca) == (1883, "vlora", 1, "", "", "")
    built = make_sink(full)
    assert isinstance(built, MqttSink) and built.name == "mqtts://broker.local:8883/site1/vlora"
    assert "hunter2" not in repr(full) + built.name and "alice" not in built.name


def test_checking_a_pipeline_with_an_mqtt_sink_imports_no_paho(tmp_path):
    """The mqtt sink's keys are checked by MqttOptions, apart from the sink: an ingest host, which has no paho-mqtt,
    loads the same pipelines.yaml."""
    (tmp_path / "ca.pem").write_text("x")
    code = (f"import sys\nfrom vlora_va.contracts.config import parse_config\n"
            f"parse_config({CONFIG!r}, 'p.yaml', {str(tmp_path)!r})\nprint('paho' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]


@pytest.mark.parametrize("old, new, message", [
    ("qos: 2", "qos: 3", "sinks[0].qos: must be 0, 1 or 2, got 3"),
    ("port: 8883", "port: 0", "sinks[0].port: must be >= 1"),
    ("port: 8883", "port: 70000", "sinks[0].port: must be at most 65535"),
    ("host: broker.local", "hostname: broker.local", "sinks[0].host: required key is missing"),
    ("tls_ca: ca.pem", "tls_ca: missing.pem", "sinks[0].tls_ca: no such file"),
    ("topic_prefix: site1/vlora", "topic_prefix: site1/#", "sinks[0].topic_prefix: must be a topic without wildcards"),
    ("password: hunter2-secret", "password: 12345678", "sinks[0].password: expected str, got int"),
    ("queue_max: 500", "url: http://x", "sinks[0].url: not an option of a mqtt sink"),
])
def test_mqtt_sink_config_errors_name_the_key(tmp_path, old, new, message):
    (tmp_path / "ca.pem").write_text("x")
    assert old in CONFIG
    with pytest.raises(ConfigError) as err:
        parse_config(CONFIG.replace(old, new, 1), "p.yaml", tmp_path)
    assert message in str(err.value), str(err.value)
    assert "hunter2" not in str(err.value) and "12345678" not in str(err.value)
