"""Result sinks: where result records go. The interface and its contract are in base.py (`Sink`); the built-in
types are registered in contracts.plugins.SINKS (jsonl, mqtt, stdout, webhook), and `make_sink` builds the sink a
`sinks[]` entry describes from that registry, so a plug-in sink is built exactly like a built-in one.

    base.py     Sink (the interface), close_all
    queued.py   QueuedSink: bounded queue, delivery thread, retry, bounded close (what every slow sink shares)
    jsonl.py    JsonlSink      stdout.py  StdoutSink      webhook.py  WebhookSink   (each with its keys: *Options)
    mqtt.py     MqttSink (imported on first use, from the registry: only it needs paho-mqtt)
    mqtt_options.py  MqttOptions: the mqtt sink's keys, which checking a pipeline imports (no paho-mqtt)
    zmq_pub.py  ZmqPubSink (daemon.results_endpoint; not a sinks[] type)
"""

from __future__ import annotations

from vlora_va.contracts.sinks import SinkConfig
from vlora_va.contracts.plugins import SINKS
from vlora_va.outputs.sinks.base import Sink, close_all
from vlora_va.outputs.sinks.jsonl import JsonlSink
from vlora_va.outputs.sinks.queued import QueuedSink, Rejected
from vlora_va.outputs.sinks.stdout import StdoutSink
from vlora_va.outputs.sinks.webhook import WebhookSink
from vlora_va.outputs.sinks.zmq_pub import ZmqPubSink

__all__ = ["Sink", "QueuedSink", "JsonlSink", "StdoutSink", "WebhookSink", "ZmqPubSink", "Rejected", "close_all",
           "make_sink"]


def make_sink(cfg: SinkConfig) -> Sink:
    """The sink a `sinks[]` entry describes: the class registered for its type builds itself from the entry."""
    cls = SINKS.load(cfg.type)
    if not (isinstance(cls, type) and issubclass(cls, Sink)):  # a plug-in registered something else
        raise TypeError(f"sink type {cfg.type!r} is registered as {cls!r}, which is not a "
                        f"vlora_va.outputs.sinks.Sink subclass")
    return cls.from_config(cfg)
