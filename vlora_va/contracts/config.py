"""The pipeline configuration: one typed schema for `pipelines.yaml`.

`load_config(path)` parses the YAML, validates every field and returns a `PipelineConfig`.
Any problem raises `ConfigError` whose message names the key path and the line, e.g.
`pipelines.yaml:14: streams[1].tasks[0].adapter: unknown adapter 'detekt' (known: detect, actions)`.
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

from vlora_va.contracts.security import CurveConfig, KeyFileError, read_authorized, read_public, read_secret
from vlora_va.contracts.wire import MAX_FRAME_SIDE, MAX_FRAMES, MAX_TASKS, NAME, STREAM_ID

DROP_POLICIES = ("drop_oldest", "drop_newest", "block")
DEVICES = ("cpu", "cuda", "auto")
# Scheduling policies (vlora_va/scheduling): the V-LoRA policy and the baselines it is measured against.
POLICIES = ("vlora", "edf", "merge-only", "unmerge-only", "dlora")
DTYPES = ("auto", "float32", "bfloat16", "float16")
HW_DECODE = ("auto", "off", "cuda", "vaapi", "qsv", "drm", "videotoolbox", "d3d11va", "amf")  # FFmpeg device types
# How the backbone computes (vlora_va/precision.py): auto picks per machine what its measured speed and each
# adapter's accuracy gate allow; int8 = dynamic-int8 linear layers (CPU); bf16 = the bfloat16 dtype.
PRECISIONS = ("auto", "fp32", "bf16", "int8")
_PRECISION_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "int8": "float32"}  # what daemon.dtype must then be
# What sustained overload does to the lowest-priority work first (see DaemonConfig.degrade).
DEGRADE_OPTIONS = ("shed", "frames", "stride")
SINK_TYPES = ("jsonl", "stdout", "webhook")
FSYNC_POLICIES = ("batch", "interval", "never")


class ConfigError(ValueError):
    """A configuration problem, located by key path (and line where known)."""

    def __init__(self, path: str, message: str, line: int | None = None, file: str | None = None):
        self.key_path, self.line, self.file = path, line, file
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else (f"line {line}: " if line else ""))
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")


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
    threads: int = 0  # torch intra-op threads; 0 = all cores minus one per local ingest worker
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
    policy: str = "vlora"  # scheduling policy: one of POLICIES
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
    hw_decode: str = "auto"  # hardware decoding: auto (NVDEC where an NVIDIA GPU is visible), off, or a type


@dataclass(frozen=True)
class TaskConfig:
    name: str
    adapter: str
    frames_per_chunk: int
    deadline_ms: float
    priority: int = 0  # higher is served first under overload


@dataclass(frozen=True)
class StreamConfig:
    id: str
    source: str  # a file path or an rtsp:// URL
    fps: float = 30.0
    chunk_seconds: float = 1.0
    loop: bool = False
    realtime: bool = True  # files are paced like a live camera; False = as fast as possible
    max_chunks: int = 0  # stop after this many chunks; 0 = until the source ends
    priority: int = 0  # default priority of this stream's tasks
    tasks: tuple[TaskConfig, ...] = ()

    @property
    def is_rtsp(self) -> bool:
        return self.source.startswith(("rtsp://", "rtsps://"))

    @property
    def frames_per_chunk(self) -> int:
        return max(1, round(self.fps * self.chunk_seconds))


@dataclass(frozen=True)
class SinkConfig:
    """One result sink (vlora_va/sinks.py). Every sink keeps at most queue_max rows waiting for delivery
    (more are dropped and counted) and gets close_timeout_s on exit to deliver them."""

    type: str  # one of SINK_TYPES
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


@dataclass(frozen=True)
class SecurityConfig:
    """security: in pipelines.yaml. curve: ZeroMQ CURVE on the data, control and results sockets
    (contracts/security.py); None = plain sockets (fine on loopback and ipc)."""

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
    """Reads typed values out of plain dicts, raising ConfigError with key path + line."""

    def __init__(self, lines: dict[str, int], file: str | None):
        self.lines, self.file = lines, file

    def error(self, path: str, message: str) -> None:
        """Raise ConfigError for path, with the line of the nearest key that has one."""
        line, probe = None, path
        while line is None and probe:
            line = self.lines.get(probe)
            probe = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", probe) if line is None else probe
        raise ConfigError(path, message, line, self.file)

    def mapping(self, value: Any, path: str, allowed: set[str]) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"expected a mapping, got {type(value).__name__}")
        for key in value:
            if key not in allowed:
                self.error(f"{path}.{key}" if path else str(key),
                           f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def get(self, d: dict, key: str, path: str, kind: type | tuple, default: Any = ..., *,
            minimum: float | None = None, choices: tuple | None = None) -> Any:
        p = f"{path}.{key}" if path else key
        if key not in d or d[key] is None:
            if default is ...:
                self.error(p, "required key is missing")
            return default
        v = d[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(v, int) and not isinstance(v, bool):
            if abs(v) > 1e15:  # float() of a huge int overflows; no setting here needs such a number
                self.error(p, f"must be a number below 1e15, got an integer of {len(str(abs(v)))} digits")
            v = float(v)
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
            names = "/".join(k.__name__ for k in kinds)
            self.error(p, f"expected {names}, got {type(v).__name__} {repr(v)[:40]}")
        if isinstance(v, float) and not math.isfinite(v):
            self.error(p, f"must be a finite number, got {v}")
        if minimum is not None and v < minimum:
            self.error(p, f"must be >= {minimum}, got {v}")
        if choices is not None and v not in choices:
            self.error(p, f"must be one of {', '.join(choices)}, got {v!r}")
        return v


def _daemon(c: _Checker, raw: Any, base_dir: Path) -> DaemonConfig:
    fields = DaemonConfig.__dataclass_fields__
    d = c.mapping(raw, "daemon", set(fields))
    kw: dict[str, Any] = {}
    for name, f in fields.items():
        default = f.default
        kind = {bool: bool, int: int, float: float, str: str}.get(type(default), str)
        choices = {"device": DEVICES, "policy": POLICIES, "degrade": DEGRADE_OPTIONS, "dtype": DTYPES,
                   "precision": PRECISIONS}.get(name)
        minimum = 1 if name in ("image_size", "max_batch_images", "max_slots", "max_rank") else (
            0 if kind in (int, float) else None)
        kw[name] = c.get(d, name, "daemon", kind, default, minimum=minimum, choices=choices)
    if kw["image_size"] > MAX_FRAME_SIDE:
        c.error("daemon.image_size", f"must be at most {MAX_FRAME_SIDE}, got {kw['image_size']}")
    if kw["image_size"] % 14:
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
    d = c.mapping(raw, "ingest", set(fields))
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


def _adapters(c: _Checker, raw: Any, base_dir: Path) -> dict[str, str]:
    if raw is None:
        c.error("adapters", "required key is missing (map adapter name -> directory)")
    if not isinstance(raw, dict) or not raw:
        c.error("adapters", "expected a non-empty mapping of adapter name -> directory")
    out = {}
    for name, directory in raw.items():
        if not NAME.fullmatch(str(name)):
            c.error(f"adapters.{name}", "an adapter name is 1-64 characters of letters, digits, '_', '.', '-'")
        if not isinstance(directory, str) or not directory:
            c.error(f"adapters.{name}", f"expected a directory path, got {directory!r}")
        p = Path(directory)
        out[str(name)] = str(p if p.is_absolute() else base_dir / p)
    return out


def _task(c: _Checker, raw: Any, path: str, adapters: dict[str, str], stream_frames: int,
          stream_priority: int) -> TaskConfig:
    d = c.mapping(raw, path, {"name", "adapter", "frames_per_chunk", "deadline_ms", "priority"})
    adapter = c.get(d, "adapter", path, str)
    if adapter not in adapters:
        c.error(f"{path}.adapter", f"unknown adapter {adapter!r} (known: {', '.join(adapters)})")
    n = c.get(d, "frames_per_chunk", path, int, 1, minimum=1)
    if n > stream_frames:
        c.error(f"{path}.frames_per_chunk", f"{n} frames asked but a chunk holds only {stream_frames}")
    name = c.get(d, "name", path, str, adapter)
    if not NAME.fullmatch(name):
        c.error(f"{path}.name", f"must be 1-64 characters of letters, digits, '_', '.', '-', got {name!r}")
    deadline = c.get(d, "deadline_ms", path, float, 1000.0, minimum=1)
    if deadline > 3_600_000:
        c.error(f"{path}.deadline_ms", f"must be at most one hour (3600000), got {deadline:.0f}")
    return TaskConfig(name=name, adapter=adapter, frames_per_chunk=n, deadline_ms=deadline,
                      priority=_priority(c, d, path, stream_priority))


def _priority(c: _Checker, d: dict, path: str, default: int) -> int:
    p = c.get(d, "priority", path, int, default)
    if not -1000 <= p <= 1000:
        c.error(f"{path}.priority", f"must be in [-1000, 1000], got {p}")
    return p


def _stream(c: _Checker, raw: Any, path: str, adapters: dict[str, str], base_dir: Path) -> StreamConfig:
    allowed = {"id", "source", "fps", "chunk_seconds", "loop", "realtime", "max_chunks", "priority", "tasks"}
    d = c.mapping(raw, path, allowed)
    sid = c.get(d, "id", path, str)
    if not STREAM_ID.fullmatch(sid):
        c.error(f"{path}.id", f"must be 1-64 characters of letters, digits, '_', '.', '-', got {sid!r}")
    source = c.get(d, "source", path, str)
    if "://" not in source and not Path(source).is_absolute():
        source = str(base_dir / source)
    fps = c.get(d, "fps", path, float, 30.0, minimum=0.1)
    chunk_seconds = c.get(d, "chunk_seconds", path, float, 1.0, minimum=0.05)
    tasks_raw = d.get("tasks")
    if not isinstance(tasks_raw, list) or not tasks_raw:
        c.error(f"{path}.tasks", "expected a non-empty list of tasks")
    frames = max(1, round(fps * chunk_seconds))
    if frames > MAX_FRAMES:
        c.error(f"{path}.chunk_seconds", f"a chunk of {frames} frames (fps x chunk_seconds) is more than the "
                                         f"{MAX_FRAMES} one message may carry")
    if len(tasks_raw) > MAX_TASKS:
        c.error(f"{path}.tasks", f"{len(tasks_raw)} tasks, at most {MAX_TASKS} per stream")
    priority = _priority(c, d, path, 0)
    tasks = tuple(_task(c, t, f"{path}.tasks[{i}]", adapters, frames, priority) for i, t in enumerate(tasks_raw))
    names = [t.name for t in tasks]
    for i, name in enumerate(names):
        if names.index(name) != i:
            c.error(f"{path}.tasks[{i}].name", f"duplicate task name {name!r} in this stream")
    return StreamConfig(
        id=sid, source=source, fps=fps, chunk_seconds=chunk_seconds,
        loop=c.get(d, "loop", path, bool, False),
        realtime=c.get(d, "realtime", path, bool, True),
        max_chunks=c.get(d, "max_chunks", path, int, 0, minimum=0),
        priority=priority, tasks=tasks,
    )


_SINK_COMMON = {"type", "queue_max", "close_timeout_s"}
SINK_KEYS = {
    "jsonl": _SINK_COMMON | {"path", "rotate_mb", "rotate_s", "keep", "fsync", "fsync_interval_s"},
    "stdout": set(_SINK_COMMON),
    "webhook": _SINK_COMMON | {"url", "batch_max", "flush_interval_s", "timeout_s", "retry_max_s", "headers"},
}
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _sink(c: _Checker, raw: Any, path: str, base_dir: Path) -> SinkConfig:
    d = c.mapping(raw, path, set().union(*SINK_KEYS.values()))
    kind = c.get(d, "type", path, str, choices=SINK_TYPES)
    for key in d:
        if key not in SINK_KEYS[kind]:
            c.error(f"{path}.{key}", f"not an option of a {kind} sink (allowed: {', '.join(sorted(SINK_KEYS[kind]))})")

    def get(key, kind_, minimum=None, maximum=None, choices=None):
        v = c.get(d, key, path, kind_, getattr(SinkConfig, key), minimum=minimum, choices=choices)
        if maximum is not None and v > maximum:
            c.error(f"{path}.{key}", f"must be at most {maximum}, got {v}")
        return v

    kw: dict[str, Any] = {"type": kind, "queue_max": get("queue_max", int, 1, 10_000_000),
                          "close_timeout_s": get("close_timeout_s", float, 0, 3600)}
    if kind == "jsonl":
        p = Path(c.get(d, "path", path, str))
        kw.update(path=str(p if p.is_absolute() else base_dir / p), rotate_mb=get("rotate_mb", float, 0),
                  rotate_s=get("rotate_s", float, 0), keep=get("keep", int, 1, 100_000),
                  fsync=get("fsync", str, choices=FSYNC_POLICIES),
                  fsync_interval_s=get("fsync_interval_s", float, 0.01, 3600))
    elif kind == "webhook":
        url = c.get(d, "url", path, str)
        try:
            u = urlsplit(url)
            ok = u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 1) > 0
        except ValueError:
            ok = False
        if not ok:
            c.error(f"{path}.url", f"expected an http:// or https:// URL with a host, got {url!r}")
        kw.update(url=url, batch_max=get("batch_max", int, 1), flush_interval_s=get("flush_interval_s", float, 0, 3600),
                  timeout_s=get("timeout_s", float, 0.05, 3600), retry_max_s=get("retry_max_s", float, 0.05, 86400),
                  headers=_headers(c, d.get("headers"), f"{path}.headers"))
        if kw["batch_max"] > kw["queue_max"]:
            c.error(f"{path}.batch_max", f"must be at most queue_max ({kw['queue_max']}), got {kw['batch_max']}")
    return SinkConfig(**kw)


def _headers(c: _Checker, raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        c.error(path, f"expected a mapping of header name -> value, got {type(raw).__name__}")
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            c.error(f"{path}.{name}", "not a valid HTTP header name")
        if not isinstance(value, str):
            c.error(f"{path}.{name}", f"expected str, got {type(value).__name__} {repr(value)[:40]}")
        if "\r" in value or "\n" in value:
            c.error(f"{path}.{name}", "a header value cannot contain line breaks")
        out.append((name, value))
    return tuple(out)


def _sinks(c: _Checker, raw: Any, base_dir: Path) -> tuple[SinkConfig, ...]:
    raw = raw or [{"type": "jsonl", "path": "results/results.jsonl"}]
    if not isinstance(raw, list):
        c.error("sinks", "expected a list of sinks")
    sinks = tuple(_sink(c, s, f"sinks[{i}]", base_dir) for i, s in enumerate(raw))
    seen: dict[tuple[str, str], int] = {}
    for i, s in enumerate(sinks):
        key = (s.type, s.path or s.url)
        if key in seen:  # two writers of one file would interleave and rotate each other's lines
            what = {"jsonl": ("path", "the same file"), "webhook": ("url", "the same URL"),
                    "stdout": ("type", "a second stdout sink, like")}[s.type]
            c.error(f"sinks[{i}].{what[0]}", f"{what[1]} as sinks[{seen[key]}]")
        seen[key] = i
    return sinks


_CURVE_READERS = {"server_secret": read_secret, "server_public": read_public, "client_secret": read_secret,
                  "client_public": read_authorized}


def _security(c: _Checker, raw: Any, base_dir: Path) -> SecurityConfig:
    d = c.mapping(raw, "security", {"curve"})
    if d.get("curve") is None:
        return SecurityConfig()
    cv = c.mapping(d["curve"], "security.curve", set(_CURVE_READERS))
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
    curve = CurveConfig(**kw)
    for a, b, host in (("server_secret", "client_public", "the daemon's host"),
                       ("client_secret", "server_public", "a client's host")):
        if bool(kw[a]) != bool(kw[b]):
            missing = b if kw[a] else a
            c.error(f"security.curve.{missing}", f"required beside {a if kw[a] else b} ({host} needs both)")
    if not (curve.server_side or curve.client_side):
        c.error("security.curve", "needs server_secret + client_public (the daemon's host) and/or client_secret + "
                                  "server_public (a client's host); `vlora-va keys DIR` makes all four")
    return SecurityConfig(curve=curve)


def parse_config(text: str, file: str | None = None, base_dir: str | os.PathLike = ".") -> PipelineConfig:
    """Validate YAML text; relative paths are resolved against base_dir."""
    data, lines = _parse_yaml(text, file)
    c = _Checker(lines, file)
    top = c.mapping(data, "", {"version", "daemon", "ingest", "adapters", "streams", "sinks", "security"})
    if top.get("version", 1) != 1:
        c.error("version", f"unsupported config version {top.get('version')!r} (this build reads version 1)")
    base = Path(base_dir)
    adapters = _adapters(c, top.get("adapters"), base)
    streams_raw = top.get("streams")
    if not isinstance(streams_raw, list) or not streams_raw:
        c.error("streams", "expected a non-empty list of streams")
    streams = tuple(_stream(c, s, f"streams[{i}]", adapters, base) for i, s in enumerate(streams_raw))
    ids = [s.id for s in streams]
    for i, sid in enumerate(ids):
        if ids.index(sid) != i:
            c.error(f"streams[{i}].id", f"duplicate stream id {sid!r}")
    sinks = _sinks(c, top.get("sinks"), base)
    return PipelineConfig(
        daemon=_daemon(c, top.get("daemon"), base),
        ingest=_ingest(c, top.get("ingest")),
        adapters=adapters, streams=streams, sinks=sinks, source_file=file,
        security=_security(c, top.get("security"), base),
    )


def load_config(path: str | os.PathLike) -> PipelineConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror}", file=str(p)) from None
    return parse_config(text, file=str(p), base_dir=p.resolve().parent)
