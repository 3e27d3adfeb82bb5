"""The plug-in points: one registry each, mapping a name to where its implementation lives.

    HEADS              head_config.json "task"          -> a `vlora_va.engine.heads.base.Head` subclass
    SOURCES            a stream source's URI scheme     -> a `vlora_va.ingest.source.Source` subclass
    SINKS              sinks[].type                     -> a `vlora_va.outputs.sinks.Sink` subclass
    POLICIES           daemon.policy                    -> a `vlora_va.serving.scheduling.Scheduler` subclass
    ATMM_BACKENDS      how unmerged LoRA rows compute   -> a `vlora_va.kernels.backend.AtmmBackend` subclass
    BACKBONE_BACKENDS  daemon.backend                   -> a `vlora_va.engine.backends.BackboneBackend` subclass

Entries are import paths ("package.module:Name"), imported on first use, so this module imports nothing of the
project: the config schema (contracts) and ingest check names here without loading the engine, and a name that is
not registered is refused with the list of known ones. A plug-in registers itself, from any module, with
`SINKS.register("name", "my.module:MySink")` (or the class itself; a sink adds `options=`, its config keys:
contracts/sinks.py) before the pipeline is loaded; a pipeline file
names such modules under `plugins:` (`load_plugins`), so every process of `vlora-va run` imports them too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class UnknownPlugin(LookupError):
    """A name no registry entry has; the message lists the known ones."""


@dataclass
class Registry:
    kind: str  # what its entries are, for messages: "sink type", "scheduling policy", ...
    entries: dict[str, Any] = field(default_factory=dict)  # name -> "module:attr" or the object
    # name -> the config keys it takes (sinks: contracts/sinks.py): a SinkOptions class, "package.module:Name" of
    # one (imported on first use), or a frozenset of key names whose values arrive as written
    options: dict[str, Any] = field(default_factory=dict)

    def register(self, name: str, target: Any, *, options: Any = ()) -> None:
        """Add (or replace) an entry. target: "package.module:Name", or the object itself. options: what its config
        keys are, as above (a tuple or set of names is kept as a frozenset)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        for what in (target, options):
            if isinstance(what, str) and ":" not in what:
                raise ValueError(f"{self.kind} {name!r}: expected 'package.module:Name', got {what!r}")
        self.entries[name] = target
        self.options[name] = frozenset(options) if isinstance(options, (tuple, list, set, frozenset)) else options

    def unregister(self, name: str) -> None:
        self.entries.pop(name, None)
        self.options.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def __iter__(self):
        return iter(tuple(self.entries))

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def unknown(self, name: object) -> str | None:
        """None for a registered name, else the message saying so, with the known names."""
        if name in self.entries:
            return None
        return f"unknown {self.kind} {name!r} (known: {', '.join(self.entries)})"

    def load(self, name: str) -> Any:
        """The registered object (imported on first use)."""
        problem = self.unknown(name)
        if problem:
            raise UnknownPlugin(problem)
        self.entries[name] = _imported(self.entries[name])
        return self.entries[name]

    def load_options(self, name: str) -> Any:
        """What the entry registered as its config keys (imported on first use); frozenset() when nothing."""
        self.options[name] = _imported(self.options.get(name, frozenset()))
        return self.options[name]


def _imported(target: Any) -> Any:
    """The object a "package.module:Name" string names (imported now); anything else as it is."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


HEADS = Registry("task", {
    "detection": "vlora_va.engine.heads.detection:DetectionHead",
    "action": "vlora_va.engine.heads.action:ActionHead",
})
# Keyed by the URI scheme of `streams[].source` ("file" for a path without one).
SOURCES = Registry("source scheme", {
    "file": "vlora_va.ingest.file_source:FileSource",
    "rtsp": "vlora_va.ingest.rtsp_source:RtspSource",
    "rtsps": "vlora_va.ingest.rtsp_source:RtspSource",
})
# A sink type's own keys are its options class's (registered beside it, the way a plug-in registers its own):
# checking a pipeline imports those, not the sinks (mqtt's lives apart from paho-mqtt, which an ingest host lacks).
SINKS = Registry("sink type")
SINKS.register("jsonl", "vlora_va.outputs.sinks.jsonl:JsonlSink", options="vlora_va.outputs.sinks.jsonl:JsonlOptions")
SINKS.register("mqtt", "vlora_va.outputs.sinks.mqtt:MqttSink",
               options="vlora_va.outputs.sinks.mqtt_options:MqttOptions")
SINKS.register("stdout", "vlora_va.outputs.sinks.stdout:StdoutSink",
               options="vlora_va.outputs.sinks.stdout:StdoutOptions")
SINKS.register("webhook", "vlora_va.outputs.sinks.webhook:WebhookSink",
               options="vlora_va.outputs.sinks.webhook:WebhookOptions")
POLICIES = Registry("scheduling policy", {
    "vlora": "vlora_va.serving.scheduling.policies:VLoRAScheduler",
    "edf": "vlora_va.serving.scheduling.policies:EdfScheduler",
    "merge-only": "vlora_va.serving.scheduling.policies:MergeOnlyScheduler",
    "unmerge-only": "vlora_va.serving.scheduling.policies:UnmergeOnlyScheduler",
    "dlora": "vlora_va.serving.scheduling.policies:DLoRAScheduler",
})
ATMM_BACKENDS = Registry("ATMM backend", {
    "reference": "vlora_va.kernels.reference:ReferenceBackend",
    "einsum": "vlora_va.kernels.einsum:EinsumBackend",
    "cpu": "vlora_va.kernels.cpu:CpuBackend",
    "triton": "vlora_va.kernels.triton_atmm:TritonBackend",
})
BACKBONE_BACKENDS = Registry("backbone backend", {
    "torch": "vlora_va.engine.backends.torch_eager:TorchBackbone",
    "openvino": "vlora_va.engine.backends.openvino:OpenVINOBackbone",
})


def source_scheme(uri: str) -> str:
    """The SOURCES key of a stream source: its URI scheme, or "file" for a plain path."""
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def load_plugins(plugins: tuple[str, ...] | list[str]) -> None:
    """Import each plug-in module (it registers what it brings): a module name (`my_org.vlora_plugins`), or the
    path of a .py file. Importing one twice does nothing. Raises ImportError (or what the module raised) naming it."""
    for plugin in plugins:
        if not plugin.endswith(".py"):
            importlib.import_module(plugin)
            continue
        path = Path(plugin).resolve()
        # One module name per file, the same in every process (a spawned child imports it again under it).
        name = f"vlora_va_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ImportError(f"no such plug-in file: {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
