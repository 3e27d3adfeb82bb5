"""The MQTT sink (`type: mqtt`): event rows published to a broker (paho-mqtt 2.x), Frigate-style topics.

    <prefix>/<stream>/events               every event row, JSON (not retained)
    <prefix>/<stream>/lines/<name>/count   retained: {"counts", "counts_since", "ts"} of the line's last event
    <prefix>/<stream>/zones/<name>/count   retained: the same for a zone
    <prefix>/<stream>/status               retained "online" | "offline" (stream_offline / stream_online events;
                                           "online" when the stream's first row of any type arrives)
    <prefix>/available                     retained "online" on every connect; "offline" on a clean close, and the
                                           connection's last will, so the broker says it when the daemon dies

Result rows are not published (only their stream's first "online"), and are not rows this sink was offered:
its stats count event rows only (written + dropped + queue = event rows offered).

Delivery is QueuedSink's (bounded queue, retry with backoff, counted drops, bounded close). A row is delivered
when the broker acknowledged every message it makes (at qos >= 1; at qos 0, when they were handed to the
socket). A failure drops the paho client with everything paho still holds and raises, so the rows stay queued
and the retry publishes them again on a new connection: at least once at qos 1 (a message whose PUBACK was lost
arrives twice), nothing lost up to the queue bound. The sink never uses paho's own reconnect or offline queue.

The client set-up (credentials, TLS, the retained "offline" last will), the clean end of a connection and the
topic levels are functions here, shared with a cluster daemon's own availability topic (outputs/availability.py).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import uuid

import paho.mqtt.client as mqtt

from vlora_va.contracts.results import ResultRecord
from vlora_va.contracts.sinks import SinkConfig
from vlora_va.outputs.sinks.mqtt_options import MqttOptions
from vlora_va.outputs.sinks.queued import CLOSE_TIMEOUT_S, QueuedSink

log = logging.getLogger(__name__)

MQTT_BATCH_MAX = 100  # rows published before waiting for their acknowledgements
KEEPALIVE_S = 30  # a silent broker is noticed after about 1.5x this (paho's PINGREQ)
DISCONNECT_WAIT_S = 1.0  # a clean DISCONNECT that cannot be sent in this time: the socket is cut instead
_UNSAFE_LEVEL = re.compile(r"[/+#\x00]")  # would add topic levels or wildcards (MQTT refuses wildcards in a publish)


def topic_name(prefix: str, *levels: str) -> str:
    """prefix/level/...: each level's "/", "+", "#" and NUL become "_", so a name is one level, never a wildcard."""
    return "/".join([prefix, *(_UNSAFE_LEVEL.sub("_", str(v)) or "_" for v in levels)])


def broker_name(host: str, port: int, tls_ca: str) -> str:
    """mqtt://host:port (mqtts:// with TLS) for names and logs: never the credentials."""
    where = f"[{host}]" if ":" in host else host
    return f"{'mqtts' if tls_ca else 'mqtt'}://{where}:{port}"


def new_client(client_id: str, *, username: str, password: str, tls_ca: str, will_topic: str, qos: int,
               timeout_s: float, reconnect_on_failure: bool) -> mqtt.Client:
    """A paho client (clean session) with the credentials, TLS and a retained "offline" last will on will_topic:
    the broker publishes it when the connection dies without a DISCONNECT."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True,
                         reconnect_on_failure=reconnect_on_failure)
    if username or password:
        client.username_pw_set(username or None, password or None)
    if tls_ca:
        client.tls_set(ca_certs=tls_ca)
    client.will_set(will_topic, "offline", qos=qos, retain=True)
    client.connect_timeout = timeout_s
    return client


def end_client(client: mqtt.Client, closed: threading.Event) -> None:
    """End the connection and paho's thread; paho's queue of unacknowledged messages goes with it. `closed` is set
    by the client's on_disconnect."""
    # a clean DISCONNECT: no last will (a new connection follows, or the owner already said offline)
    if client.disconnect() != mqtt.MQTT_ERR_NO_CONN and not closed.wait(DISCONNECT_WAIT_S):
        sock = client.socket()  # a stuck socket: loop_stop would wait for the keepalive
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    client.loop_stop()


class MqttSink(QueuedSink):
    """Publishes event rows to an MQTT broker (topics: module docstring). Connects in its own thread, never in
    write(); while the broker is unreachable it retries with backoff and keeps rows queued up to queue_max."""

    def __init__(self, host: str, *, port: int = 1883, topic_prefix: str = "vlora", qos: int = 1,
                 username: str = "", password: str = "", tls_ca: str = "", queue_max: int = 10_000,
                 timeout_s: float = 5.0, retry_initial_s: float = 0.5, retry_max_s: float = 10.0,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, name: str | None = None):
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")
        super().__init__(name or f"{broker_name(host, port, tls_ca)}/{topic_prefix}",
                         queue_max=queue_max, batch_max=MQTT_BATCH_MAX, retry_initial_s=retry_initial_s,
                         retry_max_s=retry_max_s, close_timeout_s=close_timeout_s)
        self.host, self.port, self.prefix, self.qos = host, port, topic_prefix, qos
        self.tls_ca, self.timeout_s = tls_ca, timeout_s
        self._username, self._password = username, password  # never in name, logs or errors
        self._client_id = f"vlora-va-{uuid.uuid4().hex[:12]}"
        self._client: mqtt.Client | None = None
        self._closed = threading.Event()  # the current client's connection ended
        self._new_streams: list[str] = []  # streams seen by write() whose "online" is not published yet (under _cv)
        self._seen_streams: set[str] = set()  # write() side
        self._retained: dict[str, str] = {}  # topic -> the last retained payload the broker acknowledged
        self._connect_backoff, self._connect_at = retry_initial_s, 0.0  # reconnects while idle

    @classmethod
    def from_config(cls, cfg: SinkConfig) -> "MqttSink":
        o: MqttOptions = cfg.options
        return cls(o.host, port=o.port, topic_prefix=o.topic_prefix, qos=o.qos, username=o.username,
                   password=o.password, tls_ca=o.tls_ca, queue_max=cfg.queue_max, close_timeout_s=cfg.close_timeout_s)

    # ------------------------------------------------------------------ daemon side
    def write(self, records) -> None:
        """Queue the event rows; a result row only makes its stream known (its "online" status)."""
        events = []
        new = []
        for r in records:
            if getattr(r, "type", None) == "event":
                events.append(r)
            if r.stream not in self._seen_streams:
                self._seen_streams.add(r.stream)
                new.append(r.stream)
        if new:
            with self._cv:
                self._new_streams.extend(new)
                self._cv.notify_all()
        super().write(events)

    # ------------------------------------------------------------------ sink thread
    def _start(self) -> None:
        log.info("sink %s: publishing events at qos %d", self.name, self.qos)
        self._idle()

    def _idle(self) -> None:
        """Keep the connection up while no rows are due (so `available` says online), and announce new streams."""
        if not self._connected():
            if time.monotonic() < self._connect_at:
                return
            self._connect_or_back_off()
            self._delivered(0)  # a working connection ends a failing spell even with no rows waiting
        self._announce_streams()

    def _deliver(self, rows: list[ResultRecord]) -> None:
        if not self._connected():
            self._connect_or_back_off()
        self._announce_streams()  # before the rows: a stream's first row may be its stream_offline
        done = 0
        try:
            sent = [[(m, self._publish(*m)) for m in self._messages(r.to_json())] for r in rows]
            for row_messages in sent:
                for (topic, payload, retain), info in row_messages:
                    self._confirm(info)
                    if retain:
                        self._retained[topic] = payload
                done += 1
        except Exception:
            self._delivered(done)  # acknowledged rows are not published again by the retry
            self._drop_client()
            raise

    def _teardown(self) -> None:
        """A clean close says "offline" itself: the broker sends the last will only for a connection that died."""
        if self._connected():
            try:
                self._confirm(self._publish(self._topic("available"), "offline", True))
            except Exception as e:  # noqa: BLE001 - the close goes on; the rows are already accounted for
                log.warning("sink %s: could not say offline on close: %s", self.name, e)
        self._drop_client()

    # ------------------------------------------------------------------ messages
    def _messages(self, row: dict) -> list[tuple[str, str, bool]]:
        """(topic, payload, retain) for one event row, in publish order."""
        stream = row["stream"]
        out = [(self._topic(stream, "events"), json.dumps(row, separators=(",", ":")), False)]
        rule = ("lines", row["line"]) if row.get("line") else ("zones", row["zone"]) if row.get("zone") else None
        if rule and row.get("counts") is not None:
            count = {"counts": row["counts"], "counts_since": row.get("counts_since"), "ts": row.get("ts")}
            out.append((self._topic(stream, rule[0], rule[1], "count"), json.dumps(count, separators=(",", ":")),
                        True))
        status = {"stream_offline": "offline", "stream_online": "online"}.get(row.get("event"))
        if status:
            out.append((self._topic(stream, "status"), status, True))
        return out

    def _topic(self, *levels: str) -> str:
        return topic_name(self.prefix, *levels)

    def _announce_streams(self) -> None:
        with self._cv:
            streams = list(self._new_streams)
        if not streams:
            return
        messages = [(self._topic(s, "status"), "online", True) for s in streams]
        self._publish_confirmed(messages)
        with self._cv:
            del self._new_streams[:len(streams)]

    # ------------------------------------------------------------------ connection
    def _connected(self) -> bool:
        return self._client is not None and self._client.is_connected()

    def _connect_or_back_off(self) -> None:
        try:
            self._connect()
        except Exception:
            self._connect_at = time.monotonic() + self._connect_backoff
            self._connect_backoff = min(self._connect_backoff * 2, self.retry_max_s)
            raise
        self._connect_backoff = self.retry_initial_s

    def _connect(self) -> None:
        """A new connection (any old client and what it held is dropped first), then `available` = online and
        the retained state again, for a broker that restarted without its retained messages."""
        self._drop_client()
        timeout = self._timeout()
        client = new_client(self._client_id, username=self._username, password=self._password, tls_ca=self.tls_ca,
                            will_topic=self._topic("available"), qos=self.qos, timeout_s=timeout,
                            reconnect_on_failure=False)  # reconnecting is ours: paho would resend what we retry
        answered, closed = threading.Event(), threading.Event()
        answer: dict = {}

        def on_connect(_c, _u, _flags, reason, _props):
            answer["reason"] = reason
            answered.set()

        def on_disconnect(_c, _u, _flags, reason, _props):
            answer.setdefault("lost", reason)
            answered.set()
            closed.set()

        client.on_connect, client.on_disconnect = on_connect, on_disconnect
        client.connect(self.host, self.port, keepalive=KEEPALIVE_S)
        self._client, self._closed = client, closed
        client.loop_start()
        if not answered.wait(timeout):
            self._drop_client()
            raise TimeoutError(f"the broker did not answer the connection within {timeout:.1f} s")
        reason = answer.get("reason")
        if reason is None or reason.is_failure:
            self._drop_client()
            if reason is None:  # e.g. plain MQTT to a TLS port
                raise ConnectionError(f"the broker closed the connection before answering ({answer.get('lost')})")
            raise ConnectionError(f"the broker refused the connection: {reason}")
        log.info("sink %s: connected", self.name)
        self._publish_confirmed([(self._topic("available"), "online", True),
                                 *((t, p, True) for t, p in self._retained.items())])

    def _drop_client(self) -> None:
        """End the connection and paho's thread; paho's queue of unacknowledged messages goes with it."""
        client, self._client = self._client, None
        if client is not None:
            end_client(client, self._closed)

    # ------------------------------------------------------------------ publishing
    def _publish(self, topic: str, payload: str, retain: bool) -> mqtt.MQTTMessageInfo:
        if self._client is None:
            raise ConnectionError("not connected to the broker")
        info = self._client.publish(topic, payload, qos=self.qos, retain=retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            raise ConnectionError(f"publishing failed: {mqtt.error_string(info.rc)}")
        return info

    def _confirm(self, info: mqtt.MQTTMessageInfo, timeout: float | None = None) -> None:
        """Wait until the broker acknowledged the message; raise when the connection drops or time runs out."""
        timeout = self._timeout() if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not info.is_published():
            if not self._connected():
                raise ConnectionError("the connection to the broker was lost")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the broker did not acknowledge a message within {timeout:.1f} s")
            info.wait_for_publish(min(0.1, left))  # short slices: a lost connection is seen at once

    def _publish_confirmed(self, messages: list[tuple[str, str, bool]]) -> None:
        try:
            infos = [self._publish(*m) for m in messages]
            for (topic, payload, retain), info in zip(messages, infos, strict=True):
                self._confirm(info)
                if retain:
                    self._retained[topic] = payload
        except Exception:
            self._drop_client()
            raise

    def _timeout(self) -> float:
        """timeout_s, cut to what is left of the close deadline while closing."""
        left = self._remaining_close_s()
        return self.timeout_s if left is None else max(0.05, min(self.timeout_s, left))
