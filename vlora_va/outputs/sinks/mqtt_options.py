"""The mqtt sink's keys in pipelines.yaml (`MqttOptions`), apart from the sink itself (mqtt.py): checking a pipeline
must not need paho-mqtt, which an ingest host does not install."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vlora_va.contracts.sinks import SinkEntry, SinkOptions


@dataclass(frozen=True)
class MqttOptions(SinkOptions):
    """An mqtt sink's keys (its topics: vlora_va/outputs/sinks/mqtt.py)."""

    host: str  # the broker: a host name or address
    port: int = 1883
    topic_prefix: str = "vlora"
    qos: int = 1
    username: str = ""
    password: str = field(default="", repr=False)  # never printed: not in repr, names, logs or errors
    tls_ca: str = ""  # CA file to check the broker's certificate (absolute): TLS on; "" = plain TCP

    @classmethod
    def read(cls, entry: SinkEntry) -> MqttOptions | None:
        host = entry.get("host", str)
        if host is not None and (not host.strip() or "/" in host):
            entry.error("host", f"expected a host name or address, got {host!r}")
            host = None
        prefix = entry.get("topic_prefix", str, cls.topic_prefix)
        if not prefix or prefix.startswith("/") or prefix.endswith("/") or any(ch in prefix for ch in "+#\0"):
            entry.error("topic_prefix", f"must be a topic without wildcards (+ #) or a leading/trailing '/', "
                                        f"got {prefix!r}")
        qos = entry.get("qos", int, cls.qos)
        if qos not in (0, 1, 2):
            entry.error("qos", f"must be 0, 1 or 2, got {qos}")
        rest = dict(port=entry.get("port", int, cls.port, minimum=1, maximum=65535), topic_prefix=prefix, qos=qos,
                    username=entry.get("username", str, cls.username), password=_password(entry),
                    tls_ca=_tls_ca(entry))
        return cls(host=host, **rest) if host is not None else None


def _password(entry: SinkEntry) -> str:
    """The password as written; a wrong type is reported without repeating the value: it is a secret."""
    password = entry.written.get("password")
    if password is None:
        return ""
    if not isinstance(password, str):
        entry.error("password", f"expected str, got {type(password).__name__}")
        return ""
    return password


def _tls_ca(entry: SinkEntry) -> str:
    """The CA file, absolute; one that is not there is reported now, not when the sink first connects."""
    tls_ca = entry.get("tls_ca", str, "")
    if not tls_ca:
        return ""
    tls_ca = entry.file(tls_ca)
    if not Path(tls_ca).is_file():
        entry.error("tls_ca", f"no such file: {tls_ca}")
    return tls_ca
