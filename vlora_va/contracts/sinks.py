"""The `sinks:` section of pipelines.yaml: the keys every sink has, and the one shape in which a sink type declares
and checks its own.

A sinks[] entry is `SinkConfig`: its type, the keys every sink has (queue_max, close_timeout_s) and `options`, what
the sink type's own keys read as. A type registers its keys beside itself, built-in and plug-in alike:

    SINKS.register("memory", "my_pkg.memory:MemorySink", options="my_pkg.memory:MemoryOptions")   # or the class

`MemoryOptions` is a `SinkOptions`: a frozen dataclass whose fields are the keys (defaults included) and whose
`read(entry)` checks an entry's values through `SinkEntry`, which reports each problem at its key path and line.
So a bad value, an unknown key or a missing one fails when the pipeline is loaded, before anything starts, the
same way for every sink. `options=("label", ...)` (names only) is the short form: those keys, their values as
written in a dict, for the sink to check itself when it is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlora_va.contracts.config_checker import Checker
from vlora_va.contracts.plugins import SINKS

COMMON_KEYS = frozenset({"type", "queue_max", "close_timeout_s"})
DEFAULT_SINKS = [{"type": "jsonl", "path": "results/results.jsonl"}]  # when a pipeline names none


@dataclass(frozen=True)
class SinkConfig:
    """One result sink (vlora_va/outputs/sinks/). Every sink keeps at most queue_max rows waiting for delivery
    (more are dropped and counted) and gets close_timeout_s on exit to deliver them."""

    type: str  # a name in contracts.plugins.SINKS
    queue_max: int = 10_000
    close_timeout_s: float = 5.0
    # the type's own keys: its SinkOptions as read (a dict as written, for options registered as names only)
    options: Any = field(default_factory=dict)


class SinkEntry:
    """One sinks[] entry's own keys, as a sink type's options read them: each value checked where it is read, each
    problem reported at its key path and line, relative files resolved against the pipeline file's folder."""

    def __init__(self, checker: Checker, written: dict, path: str, base_dir: Path, queue_max: int | None):
        self._c, self._path, self._base_dir = checker, path, base_dir
        self.written = written  # the type's own keys, as written
        self.queue_max = queue_max  # the entry's queue_max; None when it is wrong (reported)

    def get(self, key: str, kind: type | tuple, default: Any = ..., *, minimum: float | None = None,
            maximum: float | None = None, choices: tuple | None = None) -> Any:
        """written[key] checked; missing: the default (no default: required, reported, None). A bad value is
        reported and reads as the default (None when required)."""
        v = self._c.get(self.written, key, self._path, kind, default, minimum=minimum, choices=choices)
        if maximum is not None and v is not None and v > maximum:
            self.error(key, f"must be at most {maximum}, got {v}")
            return None if default is ... else default
        return v

    def error(self, key: str, message: str) -> None:
        self._c.error(f"{self._path}.{key}", message)

    def failed(self, key: str) -> bool:
        """Whether a problem was reported at this key (or inside it)."""
        return self._c.failed(f"{self._path}.{key}")

    def file(self, value: str) -> str:
        """A file the entry names: absolute, relative ones taken from the pipeline file's folder."""
        p = Path(value)
        return str(p if p.is_absolute() else self._base_dir / p)


class SinkOptions:
    """The base of a sink type's own keys: subclass it as a frozen dataclass whose fields are the keys, and write
    `read`, which checks an entry's values into one (None when it cannot be built: reported)."""

    @classmethod
    def keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def read(cls, entry: SinkEntry) -> SinkOptions | None:
        raise NotImplementedError(f"{cls.__name__} declares sink keys but no read() to check them")

    def destination(self) -> tuple[str, Any, str] | None:
        """Where this sink delivers, when two sinks of its type must not share it (two writers of one file would
        interleave and rotate each other's lines): (the key naming it, its value, what a clash is called, e.g.
        "the same file as"). None: any number may deliver there."""
        return None


@dataclass(frozen=True)
class KeysAsWritten:
    """options=("label", ...): these keys, their values as written, in a dict the sink checks when it is built."""

    names: frozenset[str]

    def keys(self) -> frozenset[str]:
        return self.names

    def read(self, entry: SinkEntry) -> dict[str, Any]:
        return dict(entry.written)


def options_of(kind: str) -> Any:
    """What sink type `kind` registered as its keys: a SinkOptions class, or KeysAsWritten for a set of names."""
    declared = SINKS.load_options(kind)
    return KeysAsWritten(declared) if isinstance(declared, frozenset) else declared


def parse_sinks(c: Checker, raw: Any, base_dir: Path) -> tuple[SinkConfig, ...]:
    """sinks: in pipelines.yaml (none: one jsonl file); each entry checked by its type's options."""
    raw = raw or DEFAULT_SINKS
    if not isinstance(raw, list):
        c.error("sinks", "expected a list of sinks")
        return ()
    every_key = COMMON_KEYS.union(*(options_of(kind).keys() for kind in SINKS))
    sinks = [_sink(c, s, f"sinks[{i}]", base_dir, every_key) for i, s in enumerate(raw)]
    _no_shared_destinations(c, sinks)
    return tuple(s for s in sinks if s is not None)


def _sink(c: Checker, raw: Any, path: str, base_dir: Path, every_key: frozenset[str]) -> SinkConfig | None:
    """One sink; None when it cannot be built (reported). With a bad type only the keys every sink has are read."""
    d = c.mapping(raw, path, set(every_key))  # a key no sink type has is unknown, whatever the type
    if d is None:
        return None
    kind = c.get(d, "type", path, str, choices=SINKS.names())
    options = options_of(kind) if kind is not None else None
    allowed = COMMON_KEYS | options.keys() if options is not None else every_key
    for key in d:
        if key not in allowed:
            c.error(f"{path}.{key}", f"not an option of a {kind} sink (allowed: {', '.join(sorted(allowed))})")
    common = SinkEntry(c, d, path, base_dir, queue_max=None)  # the keys every sink has, checked here
    queue_max = common.get("queue_max", int, SinkConfig.queue_max, minimum=1, maximum=10_000_000)
    close_timeout_s = common.get("close_timeout_s", float, SinkConfig.close_timeout_s, minimum=0, maximum=3600)
    if options is None:
        return None
    own = SinkEntry(c, {k: v for k, v in d.items() if k not in COMMON_KEYS}, path, base_dir,
                    queue_max=None if common.failed("queue_max") else queue_max)
    read = options.read(own)  # the type's own keys, checked by the type
    if read is None:
        return None
    return SinkConfig(type=kind, queue_max=queue_max, close_timeout_s=close_timeout_s, options=read)


def _no_shared_destinations(c: Checker, sinks: list[SinkConfig | None]) -> None:
    """Report each sink that delivers where an earlier sink of its type does (see SinkOptions.destination)."""
    seen: dict[tuple[str, Any], int] = {}
    for i, s in enumerate(sinks):
        where = s.options.destination() if s is not None and isinstance(s.options, SinkOptions) else None
        if where is None:  # a plug-in sink with keys as written: two of one type are its own business
            continue
        key, value, clash = where
        if (s.type, value) in seen:
            c.error(f"sinks[{i}].{key}", f"{clash} sinks[{seen[s.type, value]}]")
        seen[s.type, value] = i
