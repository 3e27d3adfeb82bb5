"""The pipeline configuration: one typed schema for `pipelines.yaml`.

`load_config(path)` parses the YAML, validates every field and returns a `PipelineConfig`.
Problems raise ONE `ConfigError` that names every problem found, each with its key path and line, e.g.
`pipelines.yaml:14: streams[1].tasks[0].adapter: unknown adapter 'detekt' (known: detect, actions)`;
`.errors` lists them one by one, in file order.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from vlora_va.contracts.cluster import ClusterConfig, parse_cluster, parse_group
from vlora_va.contracts.filtering import FilterConfig, parse_filter
from vlora_va.contracts.plugins import BACKBONE_BACKENDS, POLICIES, SINKS, SOURCES, load_plugins, source_scheme
from vlora_va.contracts.scene import (
    LineConfig,
    SnapshotConfig,
    TrackingConfig,
    ZoneConfig,
    parse_lines,
    parse_snapshots,
    parse_tracking,
    parse_zones,
)
from vlora_va.contracts.security import CurveConfig, KeyFileError, read_authorized, read_public, read_secret
from vlora_va.contracts.wire import MAX_FRAME_SIDE, MAX_FRAMES, MAX_TASKS, NAME, STREAM_ID

DROP_POLICIES = ("drop_oldest", "drop_newest", "block")
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("auto", "float32", "bfloat16", "float16")
HW_DECODE = ("auto", "off", "cuda", "vaapi", "qsv", "drm", "videotoolbox", "d3d11va", "amf")  # FFmpeg device types
# How the backbone computes (vlora_va/engine/precision.py): auto picks per machine what its measured speed and each
# adapter's accuracy gate allow; int8 = dynamic-int8 linear layers (CPU); bf16 = the bfloat16 dtype.
PRECISIONS = ("auto", "fp32", "bf16", "int8")
_PRECISION_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "int8": "float32"}  # what daemon.dtype must then be
# What sustained overload does to the lowest-priority work first (see DaemonConfig.degrade).
DEGRADE_OPTIONS = ("shed", "frames", "stride")
FSYNC_POLICIES = ("batch", "interval", "never")
# A stream is offline after no frame for offline_after_s: at least a frame interval plus this (ingest's heartbeat
# every wire.HEARTBEAT_S and the daemon's loop add to when a frame is known)
OFFLINE_MARGIN_S = 0.5


class ConfigError(ValueError):
    """A configuration problem, located by key path (and line where known); `errors` holds every problem of the
    file, this one first. str() of several is one line per problem, in file order; key_path / line / file are
    the first problem's."""

    def __init__(self, path: str, message: str, line: int | None = None, file: str | None = None):
        self.key_path, self.line, self.file, self.message = path, line, file, message
        self.errors: list[ConfigError] = [self]
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else (f"line {line}: " if line else ""))
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")

    def __str__(self) -> str:
        return "\n".join(ValueError.__str__(e) for e in self.errors)

    @classmethod
    def of(cls, errors: list[ConfigError]) -> ConfigError:
        """One error carrying all of `errors`, sorted by line (unlocated ones last, in the order found)."""
        errors = sorted(errors, key=lambda e: (e.line is None, e.line or 0))
        first = errors[0]
        combined = cls(first.key_path, first.message, first.line, first.file) if len(errors) > 1 else first
        combined.errors = errors
        return combined


@dataclass(frozen=True)
class DaemonConfig:
    endpoint: str = "tcp://127.0.0.1:5555"  # ingest workers PUSH here, the daemon binds PULL
    results_endpoint: str | None = None  # optional ZeroMQ PUB of results
    backbone: str = "dinov2-small"  # model cache name, local path or Hugging Face id
    allow_download: bool = False  # only then may a Hugging Face id be fetched from the hub
    image_size: int = 224  # model input side in pixels, a multiple of the patch size
    device: str = "cpu"
    # Backbone precision: auto = bfloat16 on CUDA (tensor cores; heads stay float32), float32 on a CPU.
    dtype: str = "auto"
    # Backbone compute precision: auto | fp32 | bf16 | int8 (CPU). auto: CUDA bf16; a CPU the fastest precision
    # measured here among those it runs natively and every adapter's accuracy gate passed (else fp32).
    precision: str = "auto"
    threads: int = 0  # torch intra-op threads; 0 = all cores (os.cpu_count())
    max_batch_images: int = 16
    max_wait_ms: float = 20.0  # how long to wait for more requests before running a partial batch
    max_slots: int = 8  # adapters resident at once
    max_rank: int = 64
    # CPU: keep each slot's W + ΔW when that takes at most this many MB (faster than LoRA GEMMs); 0 = off
    premerge_max_mb: int = 1024
    # The daemon's HTTP server (vlora_va/dashboard): live dashboard, /metrics, /healthz, /readyz; 0 = off.
    # Loopback unless http_host says otherwise (it has no authentication).
    http_host: str = "127.0.0.1"
    http_port: int = 0
    metrics_port: int = 0  # older name of http_port (same server); set one of the two
    dashboard: bool = True  # serve the dashboard page and its event stream (false: health and /metrics only)
    dashboard_frame_s: float = 1.0  # at most one frame per stream this often on the dashboard
    log_every_s: float = 10.0
    policy: str = "vlora"  # scheduling policy: a name in contracts.plugins.POLICIES
    # A request that has waited this long is starving: the scheduler serves it in the next batch (mixture
    # mode if another adapter is merged) instead of letting the dominant adapter's requests go first.
    starvation_ms: float = 500.0
    # Under sustained overload, the lowest-priority tasks give way first: "shed" their requests, send fewer
    # "frames" of their clips (never below what the head accepts), or serve every k-th chunk ("stride").
    degrade: str = "shed"
    profile_cache: str = ""  # where measured cost profiles are kept; "" = ~/.cache/vlora-va/profiles
    # REQ/REP socket for `vlora-va adapters load/unload/list`; "" = the endpoint's tcp port + 1 on 127.0.0.1
    # (or its ipc path + ".control")
    control_endpoint: str = ""
    # what runs the backbone forward: a name in contracts.plugins.BACKBONE_BACKENDS, or auto (on a CPU with
    # precision auto: the fastest measured of torch's and openvino's precisions that the accuracy gate allows)
    backend: str = "torch"

@dataclass(frozen=True)
class IngestConfig:
    send_hwm: int = 4  # chunks in flight per worker before the drop policy applies
    drop_policy: str = "drop_oldest"
    streams_per_worker: int = 2
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 10.0
    # ZeroMQ drops messages still in flight to a throttled receiver when the sender disconnects, so a
    # standalone worker stays connected this long after its last chunk (`vlora-va run` waits for the
    # daemon's "drained" signal instead).
    close_grace_s: float = 10.0
    # Do not decode frames nothing refers to when a stream's tasks use at most half of each chunk's frames.
    skip_frames: bool = True
    hw_decode: str = "auto"  # hardware decoding: auto (software; see streams/source.py hw_device), off, or a type


@dataclass(frozen=True)
class TaskConfig:
    name: str
    adapter: str
    frames_per_chunk: int
    deadline_ms: float
    priority: int = 0  # higher is served first under overload
    # link boxes across chunks into tracks (vlora_va/analytics/): frames are taken on an even stride that runs
    # across chunk boundaries, and the stream's lines and zones count this task's confirmed tracks
    track: bool = False
    # skip frames that show nothing new since the task's last sent ones (contracts/filtering.py); None: every frame
    filter: FilterConfig | None = None


@dataclass(frozen=True)
class StreamConfig:
    id: str
    source: str  # a file path or a URL whose scheme names its source kind (contracts.plugins.SOURCES)
    fps: float = 30.0
    chunk_seconds: float = 1.0
    loop: bool = False
    realtime: bool = True  # files are paced like a live camera; False = as fast as possible
    max_chunks: int = 0  # stop after this many chunks; 0 = until the source ends
    priority: int = 0  # default priority of this stream's tasks
    tasks: tuple[TaskConfig, ...] = ()
    lines: tuple[LineConfig, ...] = ()  # counted on the tracked task's confirmed tracks (contracts/scene.py)
    zones: tuple[ZoneConfig, ...] = ()
    offline_after_s: float = 10.0  # a live source that delivers no frame this long is offline (an event)
    snapshots: bool = False  # events of this stream store a JPEG of their frame (ingest attaches them)
    # cluster mode: its ingest worker runs on the Ray nodes labelled with this group (contracts/cluster.py); "" = any
    group: str = ""

    @property
    def tracked_tasks(self) -> tuple[TaskConfig, ...]:
        return tuple(t for t in self.tasks if t.track)

    @property
    def scheme(self) -> str:
        """The source's kind, the key of contracts.plugins.SOURCES: its URI scheme, "file" for a path."""
        return source_scheme(self.source)

    @property
    def frames_per_chunk(self) -> int:
        return max(1, round(self.fps * self.chunk_seconds))


@dataclass(frozen=True)
class SinkConfig:
    """One result sink (vlora_va/outputs/sinks/). Every sink keeps at most queue_max rows waiting for delivery
    (more are dropped and counted) and gets close_timeout_s on exit to deliver them."""

    type: str  # a name in contracts.plugins.SINKS
    path: str = ""  # jsonl: the live file; rotated ones are path.1 (newest) ... path.<keep>
    queue_max: int = 10_000
    close_timeout_s: float = 5.0
    # jsonl
    rotate_mb: float = 0.0  # rotate when the file would grow past this; 0 = off
    rotate_s: float = 0.0  # rotate when the file is this old; 0 = off
    keep: int = 10  # rotated files kept
    fsync: str = "interval"  # one of FSYNC_POLICIES
    fsync_interval_s: float = 1.0
    # webhook
    url: str = ""
    batch_max: int = 100  # rows per POST
    flush_interval_s: float = 1.0  # how long a partial batch waits for more rows
    timeout_s: float = 5.0  # per POST
    retry_max_s: float = 30.0  # backoff cap
    headers: tuple[tuple[str, str], ...] = ()  # extra HTTP headers
    # sign every POST: X-Vlora-Signature: sha256=<HMAC-SHA256 of the body, hex>; "" = unsigned (never printed)
    hmac_secret: str = field(default="", repr=False)
    # mqtt (topics: vlora_va/outputs/sinks/mqtt.py)
    host: str = ""
    port: int = 1883
    topic_prefix: str = "vlora"
    qos: int = 1
    username: str = ""
    password: str = field(default="", repr=False)  # never printed: not in repr, names, logs or errors
    tls_ca: str = ""  # CA file to check the broker's certificate: TLS on; "" = plain TCP
    # a plug-in sink's own keys (those it registered with SINKS.register(..., options=...)), as written
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SecurityConfig:
    """security: in pipelines.yaml. curve: ZeroMQ CURVE on the data, control and results sockets
    (vlora_va/contracts/security.py); None = plain sockets (fine on loopback and ipc)."""

    curve: CurveConfig | None = None


@dataclass(frozen=True)
class PipelineConfig:
    daemon: DaemonConfig
    ingest: IngestConfig
    adapters: dict[str, str]  # adapter name -> directory
    streams: tuple[StreamConfig, ...]
    sinks: tuple[SinkConfig, ...]
    source_file: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # plug-in modules imported before the rest is checked (module names, or .py files made absolute)
    plugins: tuple[str, ...] = ()
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)
    # the daemons `vlora-va run --cluster` starts on Ray (contracts/cluster.py); ignored without --cluster
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def stream(self, stream_id: str) -> StreamConfig:
        for s in self.streams:
            if s.id == stream_id:
                return s
        raise KeyError(stream_id)


# ---------------------------------------------------------------- YAML with line numbers


def _line_index(node: yaml.Node, path: str, out: dict[str, int]) -> None:
    """Record the 1-based line of every key path in a composed YAML node tree."""
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = f"{path}.{key.value}" if path else str(key.value)
            out[child] = key.start_mark.line + 1
            _line_index(value, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, f"{path}[{i}]", out)


def _parse_yaml(text: str, file: str | None) -> tuple[Any, dict[str, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError("", f"invalid YAML: {problem}", line, file) from None
    lines: dict[str, int] = {}
    if node is not None:
        _line_index(node, "", lines)
    return data, lines


class _Checker:
    """Reads typed values out of plain dicts and collects every problem (key path + line) instead of stopping at
    the first: a bad value reads as its default (None for a required key), so checking goes on without reporting
    what only follows from a problem already reported. `raise_if_any` ends the parse with all of them."""

    def __init__(self, lines: dict[str, int], file: str | None):
        self.lines, self.file = lines, file
        self.errors: list[ConfigError] = []

    def error(self, path: str, message: str) -> None:
        """Record a problem at path, with the line of the nearest key that has one."""
        line, probe = None, path
        while line is None and probe:
            line = self.lines.get(probe)
            parent = re.sub(r"(^|\.)[^.\[\]]+$|\[\d+\]$", "", probe)  # a.b[2].c -> a.b[2] -> a.b -> a -> ""
            probe = parent if parent != probe else ""
        self.errors.append(ConfigError(path, message, line, self.file))

    def failed(self, path: str) -> bool:
        """Whether a problem was recorded at path or inside it."""
        return any(e.key_path == path or e.key_path.startswith((f"{path}.", f"{path}[")) for e in self.errors)

    def unique(self, items: list, key: str, path: str, what: str) -> None:
        """Report every item (None: already reported) whose `key` attribute an earlier item has: `what` names it."""
        first: dict[Any, int] = {}
        for i, item in enumerate(items):
            if item is None:
                continue
            value = getattr(item, key)
            if value in first:
                self.error(f"{path}[{i}].{key}", f"duplicate {what} {value!r} (also {path}[{first[value]}])")
            else:
                first[value] = i

    def raise_if_any(self) -> None:
        if self.errors:
            raise ConfigError.of(self.errors)

    def mapping(self, value: Any, path: str, allowed: set[str]) -> dict | None:
        """The allowed keys of a mapping ({} for an empty value); None when it is not a mapping. Unknown keys are
        reported and left out."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"expected a mapping, got {type(value).__name__}")
            return None
        for key in value:
            if key not in allowed:
                self.error(f"{path}.{key}" if path else str(key),
                           f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return {k: v for k, v in value.items() if k in allowed}

    def get(self, d: dict, key: str, path: str, kind: type | tuple, default: Any = ..., *,
            minimum: float | None = None, choices: tuple | None = None) -> Any:
        """d[key] checked; missing: the default (a required key, default ...: reported, None). A bad value is
        reported and reads as the default (None for a required key)."""
        p = f"{path}.{key}" if path else key
        if key not in d or d[key] is None:
            if default is ...:
                self.error(p, "required key is missing")
                return None
            return default
        v, problem = self._read(d[key], kind, minimum, choices)
        if problem:
            self.error(p, problem)
            return None if default is ... else default
        return v

    @staticmethod
    def _read(v: Any, kind: type | tuple, minimum: float | None, choices: tuple | None) -> tuple[Any, str | None]:
        """(the value, an int read as a float where a float is asked; what is wrong with it, or None)."""
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(v, int) and not isinstance(v, bool):
            if abs(v) > 1e15:  # float() of a huge int overflows; no setting here needs such a number
                return v, f"must be a number below 1e15, got an integer of {len(str(abs(v)))} digits"
            v = float(v)
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
            names = "/".join(k.__name__ for k in kinds)
            return v, f"expected {names}, got {type(v).__name__} {repr(v)[:40]}"
        if isinstance(v, float) and not math.isfinite(v):
            return v, f"must be a finite number, got {v}"
        if minimum is not None and v < minimum:
            return v, f"must be >= {minimum}, got {v}"
        if choices is not None and v not in choices:
            return v, f"must be one of {', '.join(choices)}, got {v!r}"
        return v, None


def _daemon(c: _Checker, raw: Any, base_dir: Path) -> DaemonConfig:
    fields = DaemonConfig.__dataclass_fields__
    d = c.mapping(raw, "daemon", set(fields)) or {}  # not a mapping: reported; the defaults stand
    kw: dict[str, Any] = {}
    for name, f in fields.items():
        default = f.default
        kind = {bool: bool, int: int, float: float, str: str}.get(type(default), str)
        choices = {"device": DEVICES, "policy": POLICIES.names(), "degrade": DEGRADE_OPTIONS, "dtype": DTYPES,
                   "precision": PRECISIONS, "backend": ["auto", *BACKBONE_BACKENDS.names()]}.get(name)
        minimum = 1 if name in ("image_size", "max_batch_images", "max_slots", "max_rank") else (
            0 if kind in (int, float) else None)
        kw[name] = c.get(d, name, "daemon", kind, default, minimum=minimum, choices=choices)
    if kw["image_size"] > MAX_FRAME_SIDE:
        c.error("daemon.image_size", f"must be at most {MAX_FRAME_SIDE}, got {kw['image_size']}")
    elif kw["image_size"] % 14:
        c.error("daemon.image_size", f"must be a multiple of the patch size 14, got {kw['image_size']}")
    want = _PRECISION_DTYPE.get(kw["precision"])
    if want and kw["dtype"] not in ("auto", want):
        c.error("daemon.precision", f"{kw['precision']} computes in {want}, but daemon.dtype is {kw['dtype']} "
                                    f"(leave dtype at auto, or set it to {want})")
    if kw["precision"] == "int8" and kw["device"] == "cuda":
        c.error("daemon.precision", "int8 runs on CPU devices only (daemon.device is cuda)")
    if not re.match(r"^(tcp|ipc|inproc)://", kw["endpoint"]):
        c.error("daemon.endpoint", f"expected a ZeroMQ endpoint like tcp://host:port or ipc:///path, got {kw['endpoint']!r}")
    if kw["control_endpoint"] and not re.match(r"^(tcp|ipc|inproc)://", kw["control_endpoint"]):
        c.error("daemon.control_endpoint", f"expected a ZeroMQ endpoint, got {kw['control_endpoint']!r}")
    _http(c, kw)
    if kw["profile_cache"] and not Path(kw["profile_cache"]).is_absolute():
        kw["profile_cache"] = str(base_dir / kw["profile_cache"])
    return DaemonConfig(**kw)


def _http(c: _Checker, kw: dict[str, Any]) -> None:
    """daemon.http_*: a port, a host to bind (an IP address or a host name, no scheme), metrics_port as an alias."""
    for key in ("http_port", "metrics_port"):
        if kw[key] > 65535:
            c.error(f"daemon.{key}", f"must be a TCP port (at most 65535), got {kw[key]}")
            kw[key] = 0  # reported: not compared with the other port below
    if kw["metrics_port"]:
        if kw["http_port"] and kw["http_port"] != kw["metrics_port"]:
            c.error("daemon.metrics_port", f"is the older name of daemon.http_port (one server serves /metrics and the "
                                           f"dashboard): set one of them, not {kw['metrics_port']} and {kw['http_port']}")
        kw["http_port"] = kw["metrics_port"]
    host = kw["http_host"]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})", host):
            c.error("daemon.http_host", f"expected an IP address or a host name to bind, like 127.0.0.1, got {host!r}")
    if kw["dashboard_frame_s"] < 0.1:
        c.error("daemon.dashboard_frame_s", f"must be >= 0.1, got {kw['dashboard_frame_s']}")


def _ingest(c: _Checker, raw: Any) -> IngestConfig:
    fields = IngestConfig.__dataclass_fields__
    d = c.mapping(raw, "ingest", set(fields)) or {}  # not a mapping: reported; the defaults stand
    kw = {
        "send_hwm": c.get(d, "send_hwm", "ingest", int, IngestConfig.send_hwm, minimum=1),
        "drop_policy": c.get(d, "drop_policy", "ingest", str, IngestConfig.drop_policy, choices=DROP_POLICIES),
        "streams_per_worker": c.get(d, "streams_per_worker", "ingest", int, IngestConfig.streams_per_worker, minimum=1),
        "reconnect_initial_s": c.get(d, "reconnect_initial_s", "ingest", float, IngestConfig.reconnect_initial_s, minimum=0.01),
        "reconnect_max_s": c.get(d, "reconnect_max_s", "ingest", float, IngestConfig.reconnect_max_s, minimum=0.01),
        "close_grace_s": c.get(d, "close_grace_s", "ingest", float, IngestConfig.close_grace_s, minimum=0),
        "skip_frames": c.get(d, "skip_frames", "ingest", bool, IngestConfig.skip_frames),
        "hw_decode": c.get(d, "hw_decode", "ingest", str, IngestConfig.hw_decode, choices=HW_DECODE),
    }
    return IngestConfig(**kw)


def _adapters(c: _Checker, raw: Any, base_dir: Path) -> dict[str, str] | None:
    """Adapter name -> directory. None when `adapters:` itself is broken: the tasks' adapters are then not checked
    (every one would read as unknown). An entry with a bad name or directory is reported and still names an
    adapter, so the tasks that use it are not reported as well."""
    if raw is None:
        c.error("adapters", "required key is missing (map adapter name -> directory)")
        return None
    if not isinstance(raw, dict) or not raw:
        c.error("adapters", "expected a non-empty mapping of adapter name -> directory")
        return None
    out = {}
    for name, directory in raw.items():
        if not NAME.fullmatch(str(name)):
            c.error(f"adapters.{name}", "an adapter name is 1-64 characters of letters, digits, '_', '.', '-'")
        if not isinstance(directory, str) or not directory:
            c.error(f"adapters.{name}", f"expected a directory path, got {directory!r}")
            directory = ""
        p = Path(directory)
        out[str(name)] = str(p if p.is_absolute() else base_dir / p)
    return out


def _task(c: _Checker, raw: Any, path: str, adapters: dict[str, str] | None, stream_frames: int | None,
          stream_priority: int) -> TaskConfig | None:
    """One task; None when it cannot be built (reported). adapters / stream_frames None: not checked against them
    (they are broken themselves)."""
    d = c.mapping(raw, path, {"name", "adapter", "frames_per_chunk", "deadline_ms", "priority", "track", "filter"})
    if d is None:
        return None
    adapter = c.get(d, "adapter", path, str)
    if adapter is not None and adapters is not None and adapter not in adapters:
        c.error(f"{path}.adapter", f"unknown adapter {adapter!r} (known: {', '.join(adapters)})")
    n = c.get(d, "frames_per_chunk", path, int, 1, minimum=1)
    if stream_frames is not None and n > stream_frames:
        c.error(f"{path}.frames_per_chunk", f"{n} frames asked but a chunk holds only {stream_frames}")
    name = c.get(d, "name", path, str, None)
    if name is None and not c.failed(f"{path}.name"):
        name = adapter  # an unnamed task is named after its adapter (whose name is checked under adapters:)
    elif name is not None and not NAME.fullmatch(name):
        c.error(f"{path}.name", f"must be 1-64 characters of letters, digits, '_', '.', '-', got {name!r}")
        name = None  # so it is not also reported as a duplicate
    deadline = c.get(d, "deadline_ms", path, float, 1000.0, minimum=1)
    if deadline > 3_600_000:
        c.error(f"{path}.deadline_ms", f"must be at most one hour (3600000), got {deadline:.0f}")
    priority = _priority(c, d, path, stream_priority)
    track = c.get(d, "track", path, bool, False)
    frame_filter = parse_filter(c, d.get("filter"), f"{path}.filter", track)
    if adapter is None or name is None:
        return None
    return TaskConfig(name=name, adapter=adapter, frames_per_chunk=n, deadline_ms=deadline, priority=priority,
                      track=track, filter=frame_filter)


def _priority(c: _Checker, d: dict, path: str, default: int) -> int:
    """The priority at path; out of range: reported and read as the default (a stream's tasks inherit it, and
    must not each be reported again)."""
    p = c.get(d, "priority", path, int, default)
    if not -1000 <= p <= 1000:
        c.error(f"{path}.priority", f"must be in [-1000, 1000], got {p}")
        return default
    return p


def _stream(c: _Checker, raw: Any, path: str, adapters: dict[str, str] | None, base_dir: Path) -> StreamConfig | None:
    """One stream; None when it cannot be built (reported). A broken task is reported and left out."""
    allowed = {"id", "source", "fps", "chunk_seconds", "loop", "realtime", "max_chunks", "priority", "tasks",
               "lines", "zones", "offline_after_s", "snapshots", "group"}
    d = c.mapping(raw, path, allowed)
    if d is None:
        return None
    sid = c.get(d, "id", path, str)
    if sid is not None and not STREAM_ID.fullmatch(sid):
        c.error(f"{path}.id", f"must be 1-64 characters of letters, digits, '_', '.', '-', got {sid!r}")
        sid = None
    source = c.get(d, "source", path, str)
    if source is not None:
        if "://" not in source and not Path(source).is_absolute():
            source = str(base_dir / source)
        if source_scheme(source) not in SOURCES:
            c.error(f"{path}.source", f"unknown source scheme {source_scheme(source)!r} in {source!r} "
                                      f"(known: {', '.join(SOURCES.names())}; a plain path is a file)")
    fps = c.get(d, "fps", path, float, 30.0, minimum=0.1)
    chunk_seconds = c.get(d, "chunk_seconds", path, float, 1.0, minimum=0.05)
    frames = max(1, round(fps * chunk_seconds))
    if frames > MAX_FRAMES:
        c.error(f"{path}.chunk_seconds", f"a chunk of {frames} frames (fps x chunk_seconds) is more than the "
                                         f"{MAX_FRAMES} one message may carry")
    # the tasks' frames_per_chunk are checked against the chunk only where fps and chunk_seconds are right
    chunk = None if c.failed(f"{path}.fps") or c.failed(f"{path}.chunk_seconds") else frames
    tasks_raw = d.get("tasks")
    if not isinstance(tasks_raw, list) or not tasks_raw:
        c.error(f"{path}.tasks", "expected a non-empty list of tasks")
        tasks_raw = []
    elif len(tasks_raw) > MAX_TASKS:
        c.error(f"{path}.tasks", f"{len(tasks_raw)} tasks, at most {MAX_TASKS} per stream")
    priority = _priority(c, d, path, 0)
    tasks = [_task(c, t, f"{path}.tasks[{i}]", adapters, chunk, priority) for i, t in enumerate(tasks_raw)]
    names = [t.name if t is not None else None for t in tasks]
    for i, name in enumerate(names):
        if name is not None and names.index(name) != i:
            c.error(f"{path}.tasks[{i}].name", f"duplicate task name {name!r} in this stream")
    loop = c.get(d, "loop", path, bool, False)
    realtime = c.get(d, "realtime", path, bool, True)
    max_chunks = c.get(d, "max_chunks", path, int, 0, minimum=0)
    lines = parse_lines(c, d.get("lines"), f"{path}.lines")
    zones = parse_zones(c, d.get("zones"), f"{path}.zones")
    # judged on what the file declares, not on what parsed: a broken line or task neither hides nor fakes this problem
    declared = next((key for key in ("lines", "zones") if d.get(key)), None)
    if declared and not any(isinstance(t, dict) and t.get("track") not in (None, False) for t in tasks_raw):
        c.error(f"{path}.{declared}", "lines and zones count tracks: give one of this stream's tasks `track: true`")
    offline_after_s = c.get(d, "offline_after_s", path, float, 10.0, minimum=0.1)
    if not c.failed(f"{path}.fps") and offline_after_s < 1.0 / fps + OFFLINE_MARGIN_S:
        c.error(f"{path}.offline_after_s", f"must be more than a frame interval (1/fps = {1.0 / fps:.2f} s) plus "
                                           f"{OFFLINE_MARGIN_S} s, or a live stream would flap offline between "
                                           f"frames; got {offline_after_s}")
    snapshots = c.get(d, "snapshots", path, bool, False)
    group = parse_group(c, d, path)
    if sid is None or source is None:
        return None
    return StreamConfig(id=sid, source=source, fps=fps, chunk_seconds=chunk_seconds, loop=loop, realtime=realtime,
                        max_chunks=max_chunks, priority=priority, tasks=tuple(t for t in tasks if t is not None),
                        lines=lines, zones=zones, offline_after_s=offline_after_s, snapshots=snapshots,
                        group=group)


_SINK_COMMON = {"type", "queue_max", "close_timeout_s"}
SINK_KEYS = {
    "jsonl": _SINK_COMMON | {"path", "rotate_mb", "rotate_s", "keep", "fsync", "fsync_interval_s"},
    "stdout": set(_SINK_COMMON),
    "webhook": _SINK_COMMON | {"url", "batch_max", "flush_interval_s", "timeout_s", "retry_max_s", "headers",
                               "hmac_secret"},
    "mqtt": _SINK_COMMON | {"host", "port", "topic_prefix", "qos", "username", "password", "tls_ca"},
}
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _sink_keys(kind: str) -> set[str]:
    """The keys a sink of this type takes: a built-in's, or a plug-in's registered options."""
    return SINK_KEYS.get(kind, _SINK_COMMON | SINKS.options.get(kind, frozenset()))


def _sink(c: _Checker, raw: Any, path: str, base_dir: Path) -> SinkConfig | None:
    """One sink; None when it cannot be built (reported). With a bad type only the keys every sink has are read."""
    d = c.mapping(raw, path, set().union(*SINK_KEYS.values(), *SINKS.options.values()))
    if d is None:
        return None
    kind = c.get(d, "type", path, str, choices=SINKS.names())
    for key in d if kind is not None else ():
        if key not in _sink_keys(kind):
            c.error(f"{path}.{key}", f"not an option of a {kind} sink (allowed: {', '.join(sorted(_sink_keys(kind)))})")

    def get(key, kind_, minimum=None, maximum=None, choices=None):
        default = getattr(SinkConfig, key)
        v = c.get(d, key, path, kind_, default, minimum=minimum, choices=choices)
        if maximum is not None and v > maximum:
            c.error(f"{path}.{key}", f"must be at most {maximum}, got {v}")
            return default
        return v

    kw: dict[str, Any] = {"type": kind, "queue_max": get("queue_max", int, 1, 10_000_000),
                          "close_timeout_s": get("close_timeout_s", float, 0, 3600)}
    required = kind
    if kind == "jsonl":
        required = c.get(d, "path", path, str)
        p = Path(required or "")
        kw.update(path=str(p if p.is_absolute() else base_dir / p), rotate_mb=get("rotate_mb", float, 0),
                  rotate_s=get("rotate_s", float, 0), keep=get("keep", int, 1, 100_000),
                  fsync=get("fsync", str, choices=FSYNC_POLICIES),
                  fsync_interval_s=get("fsync_interval_s", float, 0.01, 3600))
    elif kind == "webhook":
        url = required = c.get(d, "url", path, str)
        if url is not None and not _http_url(url):
            c.error(f"{path}.url", f"expected an http:// or https:// URL with a host, got {url!r}")
        kw.update(url=url or "", batch_max=get("batch_max", int, 1),
                  flush_interval_s=get("flush_interval_s", float, 0, 3600),
                  timeout_s=get("timeout_s", float, 0.05, 3600), retry_max_s=get("retry_max_s", float, 0.05, 86400),
                  headers=_headers(c, d.get("headers"), f"{path}.headers"), hmac_secret=get("hmac_secret", str))
        compared = not (c.failed(f"{path}.batch_max") or c.failed(f"{path}.queue_max"))
        if compared and kw["batch_max"] > kw["queue_max"]:
            c.error(f"{path}.batch_max", f"must be at most queue_max ({kw['queue_max']}), got {kw['batch_max']}")
    elif kind == "mqtt":
        required = _mqtt_sink(c, d, path, base_dir, get, kw)
    elif kind is not None and kind not in SINK_KEYS:  # a plug-in: its own keys, as written (the sink checks them)
        kw["options"] = {k: v for k, v in d.items() if k not in _SINK_COMMON}
    return SinkConfig(**kw) if required is not None else None


def _mqtt_sink(c: _Checker, d: dict, path: str, base_dir: Path, get, kw: dict) -> str | None:
    """An mqtt sink's keys into kw; its host (None when missing or bad: reported)."""
    host = c.get(d, "host", path, str)
    if host is not None and (not host.strip() or "/" in host):
        c.error(f"{path}.host", f"expected a host name or address, got {host!r}")
        host = None
    prefix = get("topic_prefix", str)
    if not prefix or prefix.startswith("/") or prefix.endswith("/") or any(ch in prefix for ch in "+#\0"):
        c.error(f"{path}.topic_prefix", f"must be a topic without wildcards (+ #) or a leading/trailing '/', "
                                        f"got {prefix!r}")
    qos = get("qos", int)
    if qos not in (0, 1, 2):
        c.error(f"{path}.qos", f"must be 0, 1 or 2, got {qos}")
    password = "" if d.get("password") is None else d["password"]
    if not isinstance(password, str):  # the value is never repeated: it is a secret
        c.error(f"{path}.password", f"expected str, got {type(password).__name__}")
        password = ""
    tls_ca = get("tls_ca", str)
    if tls_ca:
        tls_ca = str(Path(tls_ca) if Path(tls_ca).is_absolute() else base_dir / tls_ca)
        if not Path(tls_ca).is_file():
            c.error(f"{path}.tls_ca", f"no such file: {tls_ca}")
    kw.update(host=host or "", port=get("port", int, 1, 65535), topic_prefix=prefix, qos=qos,
              username=get("username", str), password=password, tls_ca=tls_ca)
    return host


def _http_url(url: str) -> bool:
    try:
        u = urlsplit(url)
        return u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 1) > 0
    except ValueError:
        return False


def _headers(c: _Checker, raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        c.error(path, f"expected a mapping of header name -> value, got {type(raw).__name__}")
        return ()
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            c.error(f"{path}.{name}", "not a valid HTTP header name")
        elif not isinstance(value, str):
            c.error(f"{path}.{name}", f"expected str, got {type(value).__name__} {repr(value)[:40]}")
        elif "\r" in value or "\n" in value:
            c.error(f"{path}.{name}", "a header value cannot contain line breaks")
        else:
            out.append((name, value))
    return tuple(out)


def _sinks(c: _Checker, raw: Any, base_dir: Path) -> tuple[SinkConfig, ...]:
    raw = raw or [{"type": "jsonl", "path": "results/results.jsonl"}]
    if not isinstance(raw, list):
        c.error("sinks", "expected a list of sinks")
        return ()
    sinks = [_sink(c, s, f"sinks[{i}]", base_dir) for i, s in enumerate(raw)]
    seen: dict[tuple[str, str], int] = {}
    for i, s in enumerate(sinks):
        if s is None:
            continue
        key = (s.type, s.path or s.url)
        if key in seen:  # two writers of one file would interleave and rotate each other's lines
            what = {"jsonl": ("path", "the same file"), "webhook": ("url", "the same URL"),
                    "stdout": ("type", "a second stdout sink, like")}.get(s.type)
            if what is None:  # a plug-in sink: two of one type are its own business
                continue
            c.error(f"sinks[{i}].{what[0]}", f"{what[1]} as sinks[{seen[key]}]")
        seen[key] = i
    return tuple(s for s in sinks if s is not None)


_CURVE_READERS = {"server_secret": read_secret, "server_public": read_public, "client_secret": read_secret,
                  "client_public": read_authorized}


def _security(c: _Checker, raw: Any, base_dir: Path) -> SecurityConfig:
    d = c.mapping(raw, "security", {"curve"})
    if d is None or d.get("curve") is None:
        return SecurityConfig()
    cv = c.mapping(d["curve"], "security.curve", set(_CURVE_READERS))
    if cv is None:
        return SecurityConfig()
    kw = {}
    for key, read in _CURVE_READERS.items():
        value = c.get(cv, key, "security.curve", str, "")
        if value:
            p = Path(value)
            value = str(p if p.is_absolute() else base_dir / p)
            try:
                read(value)
            except KeyFileError as e:
                c.error(f"security.curve.{key}", str(e))
        kw[key] = value
    # a key written but wrong (reported above) still counts as given: its partner is not missing
    given = {key: bool(kw[key]) or c.failed(f"security.curve.{key}") for key in _CURVE_READERS}
    for a, b, host in (("server_secret", "client_public", "the daemon's host"),
                       ("client_secret", "server_public", "a client's host")):
        if given[a] != given[b]:
            missing = b if given[a] else a
            c.error(f"security.curve.{missing}", f"required beside {a if given[a] else b} ({host} needs both)")
    if not any(given.values()) and not c.failed("security.curve"):  # e.g. a misspelt key, reported as unknown
        c.error("security.curve", "needs server_secret + client_public (the daemon's host) and/or client_secret + "
                                  "server_public (a client's host); `vlora-va keys DIR` makes all four")
    return SecurityConfig(curve=CurveConfig(**kw))


_TOP_KEYS = {"version", "plugins", "daemon", "ingest", "adapters", "streams", "sinks", "security", "tracking",
             "snapshots", "cluster"}


def _plugins(c: _Checker, raw: Any, base_dir: Path) -> tuple[str, ...]:
    """plugins: modules that register heads, sources, sinks or policies, imported now, before anything names them."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.error("plugins", "expected a list of module names or .py files")
        return ()
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, str) or not item:
            c.error(f"plugins[{i}]", f"expected a module name or a .py file, got {item!r}")
            continue
        plugin = str(base_dir / item) if item.endswith(".py") and not Path(item).is_absolute() else item
        try:
            load_plugins([plugin])
        except Exception as e:  # noqa: BLE001 - whatever the module raised, said with its key path
            c.error(f"plugins[{i}]", f"cannot import {item!r}: {type(e).__name__}: {e}")
            continue
        out.append(plugin)
    return tuple(out)


def parse_config(text: str, file: str | None = None, base_dir: str | os.PathLike = ".") -> PipelineConfig:
    """Validate YAML text; relative paths are resolved against base_dir. Raises one ConfigError naming every
    problem found."""
    data, lines = _parse_yaml(text, file)
    c = _Checker(lines, file)
    if isinstance(data, dict) and data.get("version", 1) != 1:
        c.error("version", f"unsupported config version {data.get('version')!r} (this build reads version 1)")
        c.raise_if_any()  # another version's file follows another schema: checking the rest here would be noise
    top = c.mapping(data, "", _TOP_KEYS)
    if top is None:
        c.raise_if_any()  # not a mapping: there is nothing more to read
    base = Path(base_dir)
    plugins = _plugins(c, top.get("plugins"), base)  # first: what they register may be named below
    adapters = _adapters(c, top.get("adapters"), base)
    streams_raw = top.get("streams")
    if not isinstance(streams_raw, list) or not streams_raw:
        c.error("streams", "expected a non-empty list of streams")
        streams_raw = []
    streams = [_stream(c, s, f"streams[{i}]", adapters, base) for i, s in enumerate(streams_raw)]
    c.unique(streams, "id", "streams", "stream id")
    sinks = _sinks(c, top.get("sinks"), base)
    daemon = _daemon(c, top.get("daemon"), base)
    ingest = _ingest(c, top.get("ingest"))
    security = _security(c, top.get("security"), base)
    tracking = parse_tracking(c, top.get("tracking"))
    snapshots = parse_snapshots(c, top.get("snapshots"), base)
    cluster = parse_cluster(c, top.get("cluster"))
    c.raise_if_any()
    return PipelineConfig(daemon=daemon, ingest=ingest, adapters=adapters, streams=tuple(streams), sinks=sinks,
                          source_file=file, security=security, plugins=plugins, tracking=tracking,
                          snapshots=snapshots, cluster=cluster)


def load_config(path: str | os.PathLike) -> PipelineConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror}", file=str(p)) from None
    except UnicodeDecodeError:
        raise ConfigError("", "cannot read config file: not UTF-8 text (a pipelines.yaml is expected)",
                          file=str(p)) from None
    return parse_config(text, file=str(p), base_dir=p.resolve().parent)
