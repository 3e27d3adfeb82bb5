"""Streams per GPU (issue 31, part 4): the real daemon fed by live-decoded copies of sample_videos/pedestrians.mp4.

    python bench/gpu_streams.py --backbone PATH                       # on the GPU: 25..200 streams, cuda and off
    python bench/gpu_streams.py --device cpu --backbone ~/.cache/vlora-va/models/dinov2-small \\
        --streams 1,2 --hw off,cuda --duration 6 --settle 4 --budget 120 --workers 1 --max-batch 16   # a smoke run

One `vlora-va daemon` for the whole part (its config lists the streams of every point; a stream that never sends
costs it nothing but a dict entry). Each point (hw_decode mode, N streams) starts about --workers `vlora-va ingest`
processes over N fresh stream ids (each process takes its share with --streams: `vlora-va ingest` runs ONE worker
for the streams it is given, streams_per_worker only matters to `vlora-va run`), each stream a looping, real-time
copy of pedestrians.mp4 at 10 fps in 1-s chunks with the default task mix: detect (1 frame, 2000 ms) and activity
(8 frames at the actions adapter's 224 px, 3000 ms).

How a point is measured (the test's own books, from the rows the daemon's JSON Lines sink got; not its counters):
wait for the point's first row, let it settle --settle s, then a window of --duration s. A chunk belongs to the
window when its `captured_at` (the wall time its last frame was captured, same host, same clock) falls in it.
Every stream makes one chunk per second, so each is expected to make `duration` chunks in the window; a chunk
ingest dropped (or never made: decoding behind real time) has no row and counts as missed. A chunk is in deadline
when both its tasks' rows are ok with deadline_met. The streams keep running until the window's chunks are past
their deadlines, then ingest stops (SIGTERM) and the sink is read once it stops growing.
A point is held when >= 99% of its chunks are in deadline; a point under 50% ends its hw mode's sweep.
Writes OUT/gpu_streams.json after every point.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.contracts.results import JsonlFollower, is_result  # noqa: E402
from vlora_va.testing.harness import Child, percentile, stop_all, wait_daemon_ready  # noqa: E402

VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"
FPS = 10
CHUNK_S = 1.0
TASKS = [{"name": "detect", "adapter": "detect", "frames_per_chunk": 1, "deadline_ms": 2000},
         {"name": "activity", "adapter": "actions", "frames_per_chunk": 8, "deadline_ms": 3000}]
MAX_DEADLINE_S = max(t["deadline_ms"] for t in TASKS) / 1000.0
HELD = 0.99  # share of chunks in deadline for a point (and for a stream) to count as held
GIVE_UP = 0.5  # a point below this share ends its hw mode's sweep
POINT_OVERHEAD_S = 8.0  # first row, tail past the deadlines, ingest stop, sink quiet (the budget's estimate)
FIRST_ROW_TIMEOUT_S = 60.0
INGEST_STOP_TIMEOUT_S = 20.0  # a worker flushes for up to 5 s after SIGTERM, then closes
DAEMON_STOP_TIMEOUT_S = 30.0
SINK_QUIET_S = 2.0  # the sink has not grown this long: the point's rows are all in
SINK_QUIET_MAX_S = 30.0
POLL_S = 0.25
LOG_TAIL = 60


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- configs
def stream_ids(point: int, n: int) -> list[str]:
    return [f"p{point}-s{i}" for i in range(n)]


def stream_entries(ids: list[str]) -> list[dict]:
    return [{"id": sid, "source": str(VIDEO), "fps": FPS, "chunk_seconds": CHUNK_S, "loop": True, "realtime": True,
             "tasks": TASKS} for sid in ids]


def pipeline(daemon: dict, ids: list[str], sink: Path, hw: str = "off", per_worker: int = 1,
             send_hwm: int = 2) -> dict:
    """A pipeline file as a dict (the CLI reads JSON as YAML). The daemon's and each point's ingest's differ only in
    streams and ingest.hw_decode."""
    return {
        "version": 1,
        "daemon": daemon,
        # close_grace_s: a stopped worker need not wait for the daemon to read its last chunks (they are past the
        # window); the default 10 s would only lengthen every point
        "ingest": {"send_hwm": send_hwm, "drop_policy": "drop_oldest", "streams_per_worker": per_worker,
                   "hw_decode": hw, "close_grace_s": 0.5},
        "adapters": {"detect": str(ROOT / "adapters" / "detect"), "actions": str(ROOT / "adapters" / "actions")},
        "streams": stream_entries(ids),
        "sinks": [{"type": "jsonl", "path": str(sink)}],
    }


def daemon_section(endpoint: str, backbone: str, device: str, max_batch: int, precision: str = "auto") -> dict:
    # precision auto: bf16 on CUDA at once; on a CPU it measures every precision first (about a minute, again for
    # every new stream count), which a smoke run may skip with fp32
    return {"endpoint": endpoint, "backbone": backbone, "image_size": 336, "device": device,
            "max_batch_images": max_batch, "http_port": 0, "log_every_s": 5, "precision": precision}


# ---------------------------------------------------------------- what the machine did meanwhile
def _cpu_ticks_busy_total() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Sampler:
    """During a window: GPU utilisation, NVDEC utilisation and memory once a second (where nvidia-smi exists),
    the load average, the host's busy cores and the CPU the daemon and the ingest workers used."""

    def __init__(self, daemon_pid: int, ingest_pids: list[int]):
        self.daemon_pid, self.ingest_pids = daemon_pid, ingest_pids
        self.smi = shutil.which("nvidia-smi")
        self.fields = ["utilization.gpu", "utilization.decoder", "memory.used"]  # decoder: NVDEC at work
        self.gpu: list[tuple[float, float, float]] = []
        self.load: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self._t0 = time.monotonic()
        self._host0 = _cpu_ticks_busy_total()
        self._daemon0 = _proc_cpu_s(self.daemon_pid)
        self._ingest0 = [_proc_cpu_s(p) for p in self.ingest_pids]
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self.wall = time.monotonic() - self._t0
        self._host1 = _cpu_ticks_busy_total()
        self._daemon1 = _proc_cpu_s(self.daemon_pid)
        self._ingest1 = [_proc_cpu_s(p) for p in self.ingest_pids]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.load.append(float(Path("/proc/loadavg").read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
            if self.smi:
                self._gpu_sample()
            self._stop.wait(1.0)

    def _gpu_sample(self) -> None:
        try:
            out = subprocess.run([self.smi, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
            values = [float(x) for x in out.splitlines()[0].split(",")]
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            if "utilization.decoder" in self.fields:  # a driver that does not know the field fails the whole query
                self.fields.remove("utilization.decoder")
            return
        if len(values) == 2:
            values.insert(1, float("nan"))
        self.gpu.append(tuple(values))

    def figures(self) -> dict:
        busy = self._host1[0] - self._host0[0]
        total = max(1, self._host1[1] - self._host0[1])
        ncpu = os.cpu_count() or 1
        ingest = [b - a for a, b in zip(self._ingest0, self._ingest1) if a is not None and b is not None]
        out = {"host_cores_busy": round(ncpu * busy / total, 2), "cpu_count": ncpu,
               "loadavg_1m": [round(v, 2) for v in self.load],
               "daemon_cores": None if None in (self._daemon0, self._daemon1)
               else round((self._daemon1 - self._daemon0) / self.wall, 2),
               "ingest_cores": round(sum(ingest) / self.wall, 2) if ingest else None}
        if self.gpu:
            gpu, dec, mem = zip(*self.gpu)
            out.update(gpu_util_mean=round(statistics.fmean(gpu), 1), gpu_util_max=max(gpu),
                       gpu_mem_used_mb_max=max(mem), gpu_samples=len(gpu))
            if not any(math.isnan(d) for d in dec):
                out.update(nvdec_util_mean=round(statistics.fmean(dec), 1), nvdec_util_max=max(dec))
        return out


# ---------------------------------------------------------------- the books
def captured_wall(row: dict) -> float | None:
    """The row's captured_at (ISO 8601 UTC, ms) as a Unix time."""
    text = row.get("captured_at")
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def books(rows: list[dict], ids: list[str], t0: float, t1: float) -> dict:
    """The point's figures from the rows of its streams whose chunk was captured in [t0, t1)."""
    expected = round((t1 - t0) / CHUNK_S)  # per stream
    tasks = {t["name"] for t in TASKS}
    chunks: dict[tuple[str, int], dict[str, dict]] = {}
    for r in rows:
        cap = captured_wall(r)
        if cap is not None and t0 <= cap < t1:
            chunks.setdefault((r["stream"], r["chunk"]), {})[r["task"]] = r
    window = [r for per_task in chunks.values() for r in per_task.values()]
    good = {sid: 0 for sid in ids}
    seen = {sid: 0 for sid in ids}
    for (sid, _), per_task in chunks.items():
        seen[sid] += 1
        if set(per_task) == tasks and all(r["status"] == "ok" and r["deadline_met"] for r in per_task.values()):
            good[sid] += 1
    # phase jitter can put one chunk more than `expected` in the window: a stream never counts more than that
    in_deadline = sum(min(v, expected) for v in good.values())
    total = expected * len(ids)
    lat = [r["latency_ms"]["total"] for r in window if r["status"] == "ok"]
    per_task = {}
    for name in sorted(tasks):
        mine = [r for r in window if r["task"] == name]
        ok = [r for r in mine if r["status"] == "ok"]
        per_task[name] = {"rows": len(mine), "in_deadline": sum(r["deadline_met"] for r in ok),
                          "late": sum(not r["deadline_met"] for r in ok),
                          "shed": sum(r["status"] == "shed" for r in mine),
                          "error": sum(r["status"] == "error" for r in mine),
                          "p50_ms": percentile([r["latency_ms"]["total"] for r in ok], 0.5),
                          "p99_ms": percentile([r["latency_ms"]["total"] for r in ok], 0.99)}
    reasons: dict[str, int] = {}
    for r in window:
        if r["status"] != "ok":
            key = re.sub(r"\d+(\.\d+)?", "N", r.get("reason", ""))[:120]  # numbers out: the kinds of reason
            reasons[key] = reasons.get(key, 0) + 1
    return {
        "streams": len(ids), "chunks_per_stream": expected, "chunks_expected": total,
        "chunks_seen": sum(min(v, expected) for v in seen.values()),
        "chunks_in_deadline": in_deadline, "fraction": round(in_deadline / total, 4) if total else 0.0,
        "streams_held": sum(v >= HELD * expected for v in good.values()),
        "rows": len(window), "late": sum(t["late"] for t in per_task.values()),
        "shed": sum(t["shed"] for t in per_task.values()), "error": sum(t["error"] for t in per_task.values()),
        "p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99),
        # chunks ingest dropped just before a window chunk, as the daemon's rows report them (one row per chunk)
        "dropped_before": sum(r.get("dropped_before", 0) for r in window if r["task"] == "detect"),
        # rows answered from an earlier chunk's result (frame filtering at ingest; bench/capacity.py)
        "reused_rows": sum("reused_chunk" in r for r in window),
        "reused_by_task": {name: sum("reused_chunk" in r for r in window if r["task"] == name)
                           for name in sorted(tasks)},
        "tasks": per_task, "not_ok_reasons": reasons,
    }


FALLBACK = re.compile(r"stream (\S+): hardware decoding \((\S+)\) unavailable, decoding in software: (.*)")
FINISHED = re.compile(r"stream (\S+): finished: (\d+) chunks sent, (\d+) dropped, (\d+) errors")


def ingest_report(hw: str, logs: list[str], n: int) -> dict:
    """What the workers' logs say: hardware decoding that fell back (with the exact text), chunks sent and dropped
    over the whole point (the workers say it when they stop), errors."""
    fell_back: dict[str, str] = {}
    sent = dropped = errors = reported = 0
    error_lines: list[str] = []
    for text in logs:
        for line in text.splitlines():
            if m := FALLBACK.search(line):
                fell_back.setdefault(m.group(1), line.strip())
            if m := FINISHED.search(line):
                sent, dropped, errors = sent + int(m.group(2)), dropped + int(m.group(3)), errors + int(m.group(4))
                reported += 1
            if (" ERROR " in line or "Traceback" in line) and len(error_lines) < 10:
                error_lines.append(line.strip()[:400])
    if hw == "off":
        mode = "software"
    elif not fell_back:
        mode = hw
    elif len(fell_back) >= n:
        mode = f"software ({hw} unavailable: fell back)"
    else:
        mode = f"mixed ({len(fell_back)} of {n} streams fell back to software)"
    return {"decode_asked": hw, "decode_used": mode, "streams_fell_back": len(fell_back),
            "fallback_text": sorted(set(fell_back.values()))[:3],
            # over the point's whole run, from each stream's last line (a worker killed at the stop does not say it)
            "streams_reported": reported, "chunks_sent": sent, "chunks_dropped": dropped,
            "stream_errors": errors, "error_lines": error_lines}


def decode_evidence(hw: str, used: str, machine: dict) -> str | None:
    """Whether NVDEC really worked: FFmpeg, asked with allow_software_fallback, may decode in software without a
    word where the device opens but the stream does not suit it; the GPU's decoder utilisation tells."""
    if hw == "off" or used != hw:
        return None
    if "nvdec_util_mean" not in machine:
        return "not known (no NVDEC utilisation from nvidia-smi)"
    busy = machine["nvdec_util_max"] > 0
    return f"NVDEC {'busy' if busy else 'IDLE: decoding was in software'} (mean {machine['nvdec_util_mean']}%)"


# ---------------------------------------------------------------- one point
@dataclass
class Setup:
    work: Path
    daemon_cfg: dict
    sink: Path
    workers: int
    settle: float
    duration: float
    send_hwm: int


class SinkRows:
    """The sink's result rows as it grows, kept for the streams asked for."""

    def __init__(self, path: Path):
        self.follower = JsonlFollower(path)
        self.path = path

    def take(self, ids: set[str], into: list[dict]) -> None:
        for line in self.follower.new_lines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if is_result(row) and row.get("stream") in ids:
                into.append(row)

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0


def wait_first_row(sink: SinkRows, ids: set[str], rows: list[dict], workers: list[Child], daemon: Child) -> float:
    deadline = time.monotonic() + FIRST_ROW_TIMEOUT_S
    while time.monotonic() < deadline:
        sink.take(ids, rows)
        if rows:
            return time.time()
        if all(w.proc.poll() is not None for w in workers):
            raise RuntimeError("every ingest worker exited before a row came")
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited {daemon.proc.returncode}")
        time.sleep(POLL_S)
    raise RuntimeError(f"no row of the point's streams within {FIRST_ROW_TIMEOUT_S:.0f} s")


def wait_until(t_wall: float, sink: SinkRows, ids: set[str], rows: list[dict]) -> None:
    """Keep reading the sink until the wall time t_wall."""
    while time.time() < t_wall:
        sink.take(ids, rows)
        time.sleep(min(POLL_S, max(0.0, t_wall - time.time())))


def wait_sink_quiet(sink: SinkRows, ids: set[str], rows: list[dict]) -> float:
    """Read until the sink has not grown for SINK_QUIET_S (bounded); returns the seconds waited."""
    start = last_change = time.monotonic()
    size = sink.size()
    while time.monotonic() - last_change < SINK_QUIET_S and time.monotonic() - start < SINK_QUIET_MAX_S:
        time.sleep(POLL_S)
        sink.take(ids, rows)
        now_size = sink.size()
        if now_size != size:
            size, last_change = now_size, time.monotonic()
    return time.monotonic() - start


def measure_point(s: Setup, index: int, hw: str, n: int, daemon: Child, sink: SinkRows, log) -> dict:
    ids = stream_ids(index, n)
    idset = set(ids)
    per_worker = math.ceil(n / max(1, s.workers))
    groups = [ids[i:i + per_worker] for i in range(0, n, per_worker)]
    cfg = s.work / f"ingest-p{index}.json"
    cfg.write_text(json.dumps(pipeline(s.daemon_cfg, ids, s.sink, hw, per_worker, s.send_hwm)))
    rows: list[dict] = []
    sink.take(idset, rows)  # what came before this point is not its
    workers: list[Child] = []
    t_start = time.time()
    codes: list[int] = []
    try:
        for j, g in enumerate(groups):  # inside the try: those started are stopped whatever fails
            workers.append(Child(["ingest", str(cfg), "--streams", ",".join(g)], s.work / f"ingest-p{index}-w{j}.log"))
        t_first = wait_first_row(sink, idset, rows, workers, daemon)
        wait_until(t_first + s.settle, sink, idset, rows)
        t0 = time.time()
        with Sampler(daemon.proc.pid, [w.proc.pid for w in workers]) as sampler:
            wait_until(t0 + s.duration, sink, idset, rows)
        t1 = t0 + s.duration
        wait_until(t1 + MAX_DEADLINE_S + 1.0, sink, idset, rows)  # the window's last chunks reach their deadlines
        alive = [w.proc.poll() is None for w in workers]
    finally:
        codes = stop_all(workers, INGEST_STOP_TIMEOUT_S)
    quiet_s = wait_sink_quiet(sink, idset, rows)
    machine = sampler.figures()
    ingest = ingest_report(hw, [w.text() for w in workers], n)
    point = {"hw": hw, "streams": n, "ingest_processes": len(workers), "streams_per_process": per_worker,
             **books(rows, ids, t0, t1), "machine": machine,
             "ingest": {**ingest, "decode_evidence": decode_evidence(hw, ingest["decode_used"], machine),
                        "exit_codes": sorted(set(codes)),
                        "alive_at_window_end": sum(alive),
                        "log_tail_worker0": workers[0].text().splitlines()[-12:]},
             "window": {"start": t0, "end": t1, "start_utc": datetime.fromtimestamp(t0, timezone.utc).isoformat(),
                        "end_utc": datetime.fromtimestamp(t1, timezone.utc).isoformat()},
             "first_row_after_s": round(t_first - t_start, 2), "sink_quiet_wait_s": round(quiet_s, 1),
             "wall_s": round(time.time() - t_start, 1)}
    log(f"  hw {hw} {n} streams: {point['chunks_in_deadline']}/{point['chunks_expected']} chunks in deadline "
        f"({point['fraction']:.1%}), {point['streams_held']}/{n} streams held, shed {point['shed']}, late "
        f"{point['late']}, errors {point['error']}, p50/p99 {point['p50_ms']}/{point['p99_ms']} ms, ingest dropped "
        f"{point['ingest']['chunks_dropped']}, decode {point['ingest']['decode_used']}, "
        f"GPU {point['machine'].get('gpu_util_mean', '-')}% NVDEC {point['machine'].get('nvdec_util_mean', '-')}%, "
        f"host cores busy {point['machine']['host_cores_busy']}, {point['wall_s']:.0f} s")
    return point


# ---------------------------------------------------------------- the part
def meta(device: str, params: dict) -> dict:
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
           "args": params}
    try:
        import torch

        out["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        out["torch"] = None
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    try:
        import av

        out["pyav"] = av.__version__
    except ImportError:
        out["pyav"] = None
    return out


def largest_held(points: list[dict], hw: str) -> int | None:
    held = [p["streams"] for p in points if p["hw"] == hw and "fraction" in p and p["fraction"] >= HELD]
    return max(held) if held else None


def run(backbone: str, *, device: str = "cuda", streams: list[int] = (100, 200, 300), hw: list[str] = ("cuda", "off"),
        max_batch: int = 64, workers: int = 14, settle: float = 6.0, duration: float = 15.0, budget: float = 200.0,
        send_hwm: int = 2, precision: str = "auto", out: Path = ROOT / "bench" / "results", keep: bool = False, log=say) -> dict:
    """The streams-per-GPU part; returns (and writes, after every point, to out/gpu_streams.json) its results."""
    start = time.monotonic()
    params = {"backbone": backbone, "device": device, "streams": list(streams), "hw": list(hw),
              "max_batch": max_batch, "workers": workers, "settle": settle, "duration": duration, "budget": budget,
              "send_hwm": send_hwm, "precision": precision}
    res: dict = {"meta": meta(device, params), "points": [], "largest_held": {}, "not_run": []}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_streams.json"

    def save() -> None:
        res["largest_held"] = {h: largest_held(res["points"], h) for h in hw}
        res["wall_s"] = round(time.monotonic() - start, 1)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(path)

    plan = [(h, n) for h in hw for n in streams]
    work = Path(tempfile.mkdtemp(prefix="vlora-gpu-streams-", dir="/tmp"))
    sink_path = work / "results.jsonl"
    daemon_cfg = daemon_section(f"ipc://{work}/daemon.sock", str(Path(backbone).expanduser().resolve()), device,
                                max_batch, precision)
    all_ids = [sid for i, (_, n) in enumerate(plan) for sid in stream_ids(i, n)]
    (work / "daemon.json").write_text(json.dumps(pipeline(daemon_cfg, all_ids, sink_path)))
    setup = Setup(work, daemon_cfg, sink_path, workers, settle, duration, send_hwm)
    daemon = None
    save()
    try:
        log(f"streams per GPU: daemon on {device}, {len(all_ids)} streams configured, work dir {work}")
        daemon = Child(["daemon", str(work / "daemon.json")], work / "daemon.log")
        wait_daemon_ready(daemon, max(10.0, budget - (time.monotonic() - start)))
        res["daemon_ready_s"] = round(time.monotonic() - start, 1)
        log(f"  daemon ready after {res['daemon_ready_s']} s")
        sink = SinkRows(sink_path)
        given_up: set[str] = set()
        last_wall = 0.0
        for index, (h, n) in enumerate(plan):
            estimate = max(settle + duration + POINT_OVERHEAD_S, last_wall)
            left = budget - (time.monotonic() - start)
            if h in given_up or estimate > left:
                why = "an earlier point of this mode was under 50%" if h in given_up else \
                    f"budget: ~{estimate:.0f} s needed, {left:.0f} s left"
                res["not_run"].append({"hw": h, "streams": n, "why": why})
                log(f"  hw {h} {n} streams: not run ({why})")
                continue
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited {daemon.proc.returncode} during the sweep")
            t = time.monotonic()
            try:
                point = measure_point(setup, index, h, n, daemon, sink, log)
            except RuntimeError as e:
                point = {"hw": h, "streams": n, "failed": str(e)}
                log(f"  hw {h} {n} streams: failed: {e}")
            last_wall = time.monotonic() - t
            res["points"].append(point)
            if point.get("fraction", 0.0) < GIVE_UP:
                given_up.add(h)
            save()
    except Exception as e:  # noqa: BLE001 - whatever went wrong is said in the results, and the daemon still stops
        res["error"] = f"{type(e).__name__}: {e}"
        log(f"  streams per GPU failed: {res['error']}")
    finally:
        if daemon is not None:
            res["daemon_exit"] = stop_all([daemon], DAEMON_STOP_TIMEOUT_S)[0]
            res["daemon_log_tail"] = daemon.text().splitlines()[-LOG_TAIL:]
        save()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    log(f"  largest N held (>= {HELD:.0%} of chunks in deadline): {res['largest_held']}")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backbone", required=True, help="a local backbone directory (config.json + model.safetensors)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--streams", default="25,50,100,150,200", help="N per point, ascending")
    ap.add_argument("--hw", default="cuda,off", help="ingest.hw_decode modes, one sweep each")
    ap.add_argument("--max-batch", type=int, default=64, help="daemon.max_batch_images")
    ap.add_argument("--workers", type=int, default=14, help="about this many ingest processes per point")
    ap.add_argument("--send-hwm", type=int, default=2, help="ingest.send_hwm (chunks queued per worker)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "int8"],
                    help="daemon.precision (auto: bf16 on CUDA)")
    ap.add_argument("--settle", type=float, default=6.0, help="seconds after a point's first row before its window")
    ap.add_argument("--duration", type=float, default=15.0, help="the measured window, seconds")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the whole part")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (configs, logs, the sink)")
    a = ap.parse_args(argv)
    res = run(a.backbone, device=a.device, streams=[int(v) for v in a.streams.split(",")], hw=a.hw.split(","),
              max_batch=a.max_batch, workers=a.workers, settle=a.settle, duration=a.duration, budget=a.budget,
              send_hwm=a.send_hwm, precision=a.precision, out=a.out, keep=a.keep)
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
