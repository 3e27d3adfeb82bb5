"""The pipeline configuration: one typed schema for `pipelines.yaml`.

`load_config(path)` parses the YAML, validates every field and returns a `PipelineConfig`.
Problems raise ONE `ConfigError` that names every problem found, each with its key path and line, e.g.
`pipelines.yaml:14: streams[1].tasks[0].adapter: unknown adapter 'detekt' (known: detect, actions)`;
`.errors` lists them one by one, in file order.

This module holds the schema's top and its daemon, ingest, adapters and streams sections; the YAML is read by
yaml_lines.py, checked through config_checker.py's Checker, and the other sections are parsed beside their types:
sinks.py (each sink type checks its own keys), scene.py, filtering.py, cluster.py, security.py.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlora_va.contracts.cluster import ClusterConfig, parse_cluster, parse_group
from vlora_va.contracts.config_checker import Checker, ConfigError
from vlora_va.contracts.filtering import FilterConfig, parse_filter
from vlora_va.contracts.plugins import BACKBONE_BACKENDS, POLICIES, SOURCES, load_plugins, source_scheme
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
from vlora_va.contracts.security import SecurityConfig, parse_security
from vlora_va.contracts.sinks import SinkConfig, parse_sinks
from vlora_va.contracts.wire import MAX_FRAME_SIDE, MAX_FRAMES, MAX_TASKS, NAME, STREAM_ID
from vlora_va.contracts.yaml_lines import parse_yaml

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
# A stream is offline after no frame for offline_after_s: at least a frame interval plus this (ingest's heartbeat
# every wire.HEARTBEAT_S and the daemon's loop add to when a frame is known)
OFFLINE_MARGIN_S = 0.5


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
    hw_decode: str = "auto"  # hardware decoding: auto (software; see ingest/source.py hw_device), off, or a type


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


def _daemon(c: Checker, raw: Any, base_dir: Path) -> DaemonConfig:
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


def _http(c: Checker, kw: dict[str, Any]) -> None:
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


def _ingest(c: Checker, raw: Any) -> IngestConfig:
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


def _adapters(c: Checker, raw: Any, base_dir: Path) -> dict[str, str] | None:
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


def _task(c: Checker, raw: Any, path: str, adapters: dict[str, str] | None, stream_frames: int | None,
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


def _priority(c: Checker, d: dict, path: str, default: int) -> int:
    """The priority at path; out of range: reported and read as the default (a stream's tasks inherit it, and
    must not each be reported again)."""
    p = c.get(d, "priority", path, int, default)
    if not -1000 <= p <= 1000:
        c.error(f"{path}.priority", f"must be in [-1000, 1000], got {p}")
        return default
    return p


def _stream(c: Checker, raw: Any, path: str, adapters: dict[str, str] | None, base_dir: Path) -> StreamConfig | None:
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


_TOP_KEYS = {"version", "plugins", "daemon", "ingest", "adapters", "streams", "sinks", "security", "tracking",
             "snapshots", "cluster"}


def _plugins(c: Checker, raw: Any, base_dir: Path) -> tuple[str, ...]:
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
    data, lines = parse_yaml(text, file)
    c = Checker(lines, file)
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
    sinks = parse_sinks(c, top.get("sinks"), base)
    daemon = _daemon(c, top.get("daemon"), base)
    ingest = _ingest(c, top.get("ingest"))
    security = parse_security(c, top.get("security"), base)
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
