"""Hosts on one machine (scripts/hosts.sh: network namespaces, a Ray node each) and a `vlora-va run --cluster` on
them, read from outside: what tests/cluster/test_hosts.py and `bench/cluster.py --part hosts` share.

The layout both use: h0 runs the Ray head and the run (controller, collector), h1 the ingest actors (`group: h1`),
h2 and h3 one daemon each (`node_label`: a on h2, b on h3); four streams of the bikes video over two adapters on the
tiny backbone (`pipeline`), or four cameras on the real backbone and the shipped detect adapter, two priorities
(`overload_pipeline`). Every figure is read from outside the run: its JSONL file (each row stamped with the wall
time it was read), its log, and this process's clock.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import yaml

from vlora_va.contracts.security import create_keys
from vlora_va.testing.tiny import TINY_IMAGE

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ROOT / "scripts" / "hosts.sh"
BIKES = ROOT / "sample_videos" / "bikes.mp4"
PEDESTRIANS = ROOT / "sample_videos" / "pedestrians.mp4"
DETECT = ROOT / "adapters" / "detect"
N_HOSTS = 4
WAIT_S = 240.0


def hosts(*args: str, timeout: float = 180) -> str:
    """scripts/hosts.sh with these arguments; its output (a failure raises, with what it said)."""
    out = subprocess.run([str(HOSTS), *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"hosts.sh {' '.join(args)}: {out.stderr[-2000:]}")
    return out.stdout


def pipeline(tmp_path: Path, backbone: Path, adapters: dict, chunks: int, curve: bool = False,
             cameras: dict[str, str] | None = None) -> Path:
    """Four streams ingested on h1 (s0, s1 on adapter a1; s2, s3 on a2), daemons a on h2 and b on h3. curve: every
    ZeroMQ link between the hosts authenticated and encrypted (security.curve; the hosts share this machine's files,
    so the keys are where docs/cluster.md says every host must have them). cameras: stream id -> an RTSP URL that
    stream reads instead of the bikes file."""
    cameras = cameras or {}
    streams = [{"id": f"s{i}", "max_chunks": chunks, "group": "h1",
                **({"source": cameras[f"s{i}"]} if f"s{i}" in cameras else {"loop": True}),
                "tasks": [{"name": "det", "adapter": "a1" if i < 2 else "a2", "frames_per_chunk": 1,
                           "deadline_ms": 30000}]} for i in range(4)]
    cluster = {"daemons": [{"name": "a", "node_label": "h2"}, {"name": "b", "node_label": "h3"}], "ping_s": 0.5}
    cfg = {"daemon": {"backbone": str(backbone), "image_size": TINY_IMAGE, "threads": 1, "max_wait_ms": 5,
                      "profile_cache": str(tmp_path / "profiles"), "log_every_s": 2},
           "ingest": {"streams_per_worker": 1, "drop_policy": "block", "close_grace_s": 2},  # block: all sent
           "adapters": {n: str(p) for n, p in adapters.items()},
           "streams": [{"source": str(BIKES), "fps": 4, "chunk_seconds": 0.5, "realtime": True, **s}
                       for s in streams],
           "sinks": [{"type": "jsonl", "path": str(tmp_path / "results.jsonl"), "fsync": "never"}],
           "cluster": cluster}
    if curve:
        keys = create_keys(tmp_path / "keys")
        cfg["security"] = {"curve": {"server_secret": str(keys["server.key_secret"]),
                                     "server_public": str(keys["server.key"]),
                                     "client_secret": str(keys["client.key_secret"]),
                                     "client_public": str(keys["client.key"])}}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def live_camera(sid: str, video: Path, fps: float, frames_per_chunk: int, chunks: int, deadline_ms: int,
                priority: int = 0, chunk_seconds: float = 1.0) -> dict:
    """A stream that acts as a live camera (the file paced in real time, looped; 1-s chunks by default), ingested
    on h1, through the shipped detect adapter."""
    return {"id": sid, "source": str(video), "fps": fps, "chunk_seconds": chunk_seconds, "loop": True, "realtime": True,
            "max_chunks": chunks, "group": "h1",
            "tasks": [{"name": "detect", "adapter": "detect", "frames_per_chunk": frames_per_chunk,
                       "deadline_ms": deadline_ms, "priority": priority}]}


def camera_pipeline(tmp_path: Path, cameras: list[dict], daemons: int, ingest: dict, **cluster) -> Path:
    """`cameras` (live_camera) on `daemons` daemons (a on h2, b on h3), on the real backbone and the shipped detect
    adapter (OpenVINO int8, as `make run` on most CPUs; one thread: a daemon per core); `ingest` and `cluster`:
    those sections' own keys."""
    cfg = {"daemon": {"backbone": "dinov2-small", "image_size": 336, "backend": "openvino", "precision": "int8",
                      "threads": 1, "max_wait_ms": 20, "profile_cache": str(tmp_path / "profiles"), "log_every_s": 2},
           "ingest": ingest, "adapters": {"detect": str(DETECT)}, "streams": cameras,
           "sinks": [{"type": "jsonl", "path": str(tmp_path / "results.jsonl"), "fsync": "never"}],
           "cluster": {"daemons": [{"name": n, "node_label": f"h{2 + i}"} for i, n in enumerate("ab"[:daemons])],
                       "ping_s": 0.5, **cluster}}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def overload_pipeline(tmp_path: Path, frames_per_chunk: int, chunks: int, deadline_ms: int = 5000,
                      chunk_seconds: float = 1.0) -> Path:
    """Four live cameras (pedestrians s0, s1; bikes s2, s3) on daemons a and b; s0 and s2 priority 2, s1 and s3
    priority 0. Placement gives each daemon two streams of equal cost, one of each priority (a: s0, s1). Overload
    relief moves a daemon's streams after 5 s over `rebalance_high` (10 s by default). A camera sends one chunk
    every `chunk_seconds`: what sizes its load to the machine (camera_load_on)."""
    cameras = [live_camera(f"s{i}", PEDESTRIANS if i < 2 else BIKES, 2 * frames_per_chunk, frames_per_chunk, chunks,
                           deadline_ms, priority=2 if i % 2 == 0 else 0, chunk_seconds=chunk_seconds)
               for i in range(4)]
    return camera_pipeline(tmp_path, cameras, 2, {"streams_per_worker": 1, "drop_policy": "block",
                                                  "close_grace_s": 2}, rebalance_after_s=5.0)


def camera_load_on(host: int, cpus: str, path: Path, cameras: int) -> float:
    """Seconds of compute per second one of the pipeline's `cameras` (all alike) needs on `host` pinned to `cpus`,
    as `vlora-va validate --profile` measures it there: the daemon's own estimate, from the cost profile it caches
    where the run's daemon on that host reads it."""
    cli = ROOT / ".venv" / "bin" / "vlora-va"
    out = subprocess.run([str(HOSTS), "exec", str(host), "taskset", "-c", cpus, str(cli), "validate", "--profile",
                          str(path)], capture_output=True, text=True, timeout=600)
    found = re.search(r"needs (\d+\.\d+) s of compute per second", out.stdout + out.stderr)
    if not found:
        raise RuntimeError(f"vlora-va validate --profile on h{host} said no load:\n{(out.stdout + out.stderr)[-3000:]}")
    return float(found.group(1)) / cameras


class Camera:
    """An RTSP camera on a host (tests/rtsp_server.py on Debian's Python with GStreamer, listening on the host's own
    address): `url` once started."""

    def __init__(self, host: int, video: Path, port: int = 8554, timeout: float = 30.0):
        address = hosts("address", str(host)).strip()
        self.proc = subprocess.Popen([str(HOSTS), "exec", str(host), "/usr/bin/python3",
                                      str(ROOT / "tests" / "rtsp_server.py"), "--address", address, "--port",
                                      str(port), "--file", str(video)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + timeout
        line = ""
        while not line.startswith("READY") and self.proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                break
            line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"the RTSP camera on h{host} did not start ({line!r})")
        self.url = line.split()[1]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self.proc.stdout.close()


class CoTenant:
    """Another workload on a host: `n` busy loops there, on CPUs `cpus` (taskset's list), at `niceness` (pass the
    daemon's: Ray runs every worker at 15, so a loop at 0 would take all but a sliver of the core, where another
    Ray job's worker takes its equal share). A daemon pinned to the same single core gets about 1/(n + 1) of it:
    its machine is that much slower than the cost model says."""

    def __init__(self, host: int, cpus: str, n: int, niceness: int):
        loop = [str(HOSTS), "exec", str(host), "nice", "-n", str(niceness), "taskset", "-c", cpus,
                str(ROOT / ".venv" / "bin" / "python"), "-c", "while True: pass"]
        self.procs = [subprocess.Popen(loop, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for _ in range(n)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(30)


class HostsRun:
    """`vlora-va run --cluster ADDRESS` on a host (default: auto on the head host h0), its JSONL sink read as it
    grows (each row stamped with the wall time this test read it)."""

    def __init__(self, config: Path, host: int = 0, address: str = "auto"):
        self.sink = config.parent / "results.jsonl"
        self.log_path = config.parent / "run.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "RAY_ADDRESS": f"{hosts('address', '0').strip()}:6390", "RAY_AUTH_MODE": "token",
               "RAY_DEDUP_LOGS": "0"}  # every worker's own final line, not "[repeated 3x across cluster]"
        self.proc = subprocess.Popen([str(HOSTS), "exec", str(host), str(ROOT / ".venv" / "bin" / "python"), "-m",
                                      "vlora_va.cli", "run", "--cluster", address, str(config)], cwd=ROOT, env=env,
                                     stdout=subprocess.DEVNULL, stderr=self._log, start_new_session=True)
        self.rows: list[dict] = []
        self._offset = 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def read(self) -> list[dict]:
        """New complete rows (result rows only, with "_read_at")."""
        if not self.sink.exists():
            return []
        data = self.sink.read_bytes()
        end = data.rfind(b"\n") + 1
        lines, self._offset = data[self._offset:end].decode().splitlines(), end
        now = time.time()
        new = [{**row, "_read_at": now} for line in lines if (row := json.loads(line)).get("type") == "result"]
        self.rows += new
        return new

    def wait(self, condition, what: str, timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        while not (got := condition()):
            if self.proc.poll() is not None:
                raise AssertionError(f"vlora-va run ended ({self.proc.returncode}) waiting for {what}:\n"
                                     f"{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.log()[-4000:]}")
            self.read()
            time.sleep(0.05)  # the sink's poll period: a row's read time is at most this late
        return got

    def finish(self, timeout: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.read()
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def served_by(run: HostsRun, streams: tuple[str, ...] = ("s0", "s1", "s2", "s3")) -> dict[str, list[str]]:
    """Once every stream has an ok row: the streams each daemon serves, by the rows (one daemon's first row may come
    before another stream's; reading sooner would miss that stream)."""
    run.wait(lambda: {r["stream"] for r in run.rows if r["status"] == "ok"} >= set(streams), "an ok row of every stream")
    by: dict[str, set] = {}
    for r in run.rows:
        if r["status"] == "ok":
            by.setdefault(r["daemon"], set()).add(r["stream"])
    return {d: sorted(s) for d, s in by.items()}


def lose_host(run: HostsRun, host: int, daemon: str, survivor: str) -> dict:
    """Node loss: once every stream is served, every process of `host` (where `daemon` runs, its raylet too) is
    killed; returns once `survivor` served each of the lost daemon's streams. What it measured: the streams, the
    kill's wall time and, per moved stream, the wall time its first ok row from `survivor` was read. The host is
    not healed here."""
    moved = served_by(run)[daemon]
    killed_at = time.time()
    hosts("kill", str(host))

    def served_again() -> dict[str, float] | None:
        first: dict[str, float] = {}
        for r in run.rows:
            if r["stream"] in moved and r.get("daemon") == survivor and r["status"] == "ok":
                first.setdefault(r["stream"], r["_read_at"])
        return first if len(first) == len(moved) else None
    first_ok = run.wait(served_again, f"daemon {daemon}'s streams served by {survivor}")
    return {"streams": moved, "killed_at": killed_at,
            "failover_s": {sid: round(t - killed_at, 3) for sid, t in first_ok.items()}}


def cut_host(run: HostsRun, host: int, daemon: str, other: str, seconds: float) -> dict:
    """Partition: once every stream is served, `host`'s link (where `daemon` runs) goes down for `seconds`, then up.
    Returns once `daemon` restarted there and serves again. What it measured: its streams, seconds from the cut
    until `other` served each of them, and from the heal until `daemon` served again."""
    streams = served_by(run)[daemon]
    cut_at = time.time()
    hosts("cut", str(host))
    run.wait(lambda: all(any(r["stream"] == sid and r.get("daemon") == other and r["status"] == "ok"
                             and r["_read_at"] > cut_at for r in run.rows) for sid in streams),
             f"daemon {daemon}'s streams served by {other} during the partition")
    moved_after = time.time() - cut_at
    run.wait(lambda: time.time() - cut_at >= seconds, "the partition's end")
    hosts("heal", str(host))
    healed_at = time.time()
    back = f"daemon {daemon} is back at tcp://" + hosts("address", str(host)).strip()
    run.wait(lambda: back in run.log(), f"daemon {daemon} restarted on h{host}")
    run.wait(lambda: any(r.get("daemon") == daemon and r["status"] == "ok" and r["_read_at"] > healed_at
                         for r in run.rows), f"daemon {daemon} serving again")
    return {"streams": streams, "cut_s": seconds, "moved_after_s": round(moved_after, 2),
            "back_after_heal_s": round(time.time() - healed_at, 2)}


def ingest_counts(log: str) -> dict[str, tuple[int, int]]:
    """Per stream, (chunks sent, chunks dropped) as its ingest worker says (its stats, as the controller got them
    back when it released the worker: the workers' own log lines travel through Ray's log forwarding, which may
    lose the last ones at exit)."""
    return {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"stream (\S+): ingest sent (\d+) chunk\(s\), dropped (\d+)", log)}


def ingest_sent(log: str, stopped: bool = False) -> dict[str, int]:
    """Chunks each stream's ingest worker handed to ZeroMQ (ingest_counts). drop_policy block sends every chunk
    made; stopped: the run was stopped, and a chunk made as the stop came may stay unsent (counted dropped, after
    every chunk sent)."""
    counts = ingest_counts(log)
    dropped = [d for _, d in counts.values()]
    if any(d > (1 if stopped else 0) for d in dropped):
        raise AssertionError(f"ingest dropped chunks: {dropped}")
    return {sid: sent for sid, (sent, _) in counts.items()}
