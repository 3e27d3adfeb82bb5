"""A cluster daemon's own availability on MQTT: `<prefix>/daemons/<name>/available` (paho-mqtt 2.x).

    <prefix>/daemons/<name>/available   retained "online" on every (re)connect; "offline" on a clean exit, and the
                                        connection's last will, so the broker says it when the daemon's process
                                        or node dies

Why a connection of its own: in cluster mode the collector is the run's MQTT sink, so `<prefix>/available` says
whether the collector is connected, not whether a daemon lives, and the daemons have no sinks of their own (their
rows go to the collector). Each daemon holds this small connection to the broker of every `mqtt` sink, for this
one topic only.

Nothing is queued or retried but the retained "online", which paho's own loop publishes again on each reconnect
(loop_start, reconnect with backoff): a broker that is down never blocks or fails the daemon, and each outage is
logged once.

The client id is fixed per (topic prefix, daemon name): a daemon restarted (Ray starts it again under its name)
while the broker still holds the dead one's connection (a silent node is noticed only after the keepalive) takes
that connection over, and the broker sends the old connection's will before the new "online", never after it.
Two live holders of one name on one broker would therefore take the connection from each other: daemon names are
unique in a run, and runs sharing a broker need different topic prefixes anyway (their topics would mix).
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading

import paho.mqtt.client as mqtt

from vlora_va.contracts.sinks import SinkConfig
from vlora_va.outputs.sinks.mqtt import KEEPALIVE_S, broker_name, end_client, new_client, topic_name
from vlora_va.outputs.sinks.mqtt_options import MqttOptions

log = logging.getLogger(__name__)


class DaemonAvailability:
    """A context manager: while entered, `<prefix>/daemons/<daemon>/available` on the broker of `sink_config` (an
    `mqtt` sink) says "online"; after a clean exit, or when the process dies, "offline". Entering never waits for
    the broker and never fails because of it. `failures`: connection attempts that failed so far."""

    def __init__(self, sink_config: SinkConfig, daemon: str, *, timeout_s: float = 5.0, retry_initial_s: float = 0.5,
                 retry_max_s: float = 10.0):
        if sink_config.type != "mqtt":
            raise ValueError(f"daemon availability needs an mqtt sink, got a {sink_config.type!r} sink")
        if not daemon:
            raise ValueError("daemon availability needs the daemon's name, got an empty one")
        self.broker: MqttOptions = sink_config.options  # the mqtt sink's host, credentials, topic prefix...
        self.daemon = daemon
        self.topic = topic_name(self.broker.topic_prefix, "daemons", daemon, "available")
        self.name = f"{broker_name(self.broker.host, self.broker.port, self.broker.tls_ca)}/{self.topic}"
        self.timeout_s, self.retry_initial_s, self.retry_max_s = timeout_s, retry_initial_s, retry_max_s
        self.failures = 0
        key = hashlib.sha256(f"{self.broker.topic_prefix}\0{daemon}".encode()).hexdigest()[:12]
        self._client_id = f"vlora-va-d-{key}"  # 23 characters: what every MQTT 3.1.1 broker must accept
        self._client: mqtt.Client | None = None
        self._closed = threading.Event()  # the current connection ended (end_client waits for it)
        self._closing = False
        self._warned = False  # this outage was logged

    def __enter__(self) -> "DaemonAvailability":
        c = self.broker
        client = new_client(self._client_id, username=c.username, password=c.password, tls_ca=c.tls_ca,
                            will_topic=self.topic, qos=c.qos, timeout_s=self.timeout_s, reconnect_on_failure=True)
        client.reconnect_delay_set(self.retry_initial_s, self.retry_max_s)
        client.on_connect, client.on_disconnect = self._on_connect, self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.connect_async(c.host, c.port, keepalive=KEEPALIVE_S)  # connects in paho's thread: never raises here
        client.loop_start()
        self._client = client
        return self

    def __exit__(self, *exc) -> None:
        """Say "offline", then a clean DISCONNECT (after which the broker sends no will). The PUBLISH goes before
        the DISCONNECT on the same connection, and a connection that breaks first makes the broker send the will:
        either way the topic ends "offline"."""
        client, self._client = self._client, None
        if client is None:
            return
        self._closing = True
        if client.is_connected():
            client.publish(self.topic, "offline", qos=self.broker.qos, retain=True)
        end_client(client, self._closed)
        log.info("%s: offline", self.name)

    # ------------------------------------------------------------------ paho's thread
    def _on_connect(self, client, _userdata, _flags, reason, _props) -> None:
        if reason.is_failure:
            self.failures += 1
            self._warn(f"the broker refused the connection: {reason}")
            return
        self._closed.clear()
        if self._closing:  # a connection that completed as the holder exited: it must not say online again
            return
        self._warned = False
        log.info("%s: online", self.name)
        client.publish(self.topic, "online", qos=self.broker.qos, retain=True)

    def _on_disconnect(self, _client, _userdata, _flags, reason, _props) -> None:
        self._closed.set()
        if not self._closing:
            self._warn(f"lost the connection to the broker ({reason}); reconnecting")

    def _on_connect_fail(self, _client, _userdata) -> None:
        self.failures += 1
        error = sys.exc_info()[1]  # paho calls this inside its `except OSError`: the error is the current one
        self._warn(f"cannot connect to the broker ({error or 'no answer'}); retrying every {self.retry_max_s:g} s "
                   f"at most")

    def _warn(self, message: str) -> None:
        """Once per outage: paho retries every few seconds, for as long as the broker is away."""
        if not self._warned:
            self._warned = True
            log.warning("%s: %s", self.name, message)
