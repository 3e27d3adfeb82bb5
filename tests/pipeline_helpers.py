"""`vlora-va run` in a subprocess on a tiny random-weight backbone (seconds to start, not a minute), with its log
and results readable while it runs: for the supervision, reload, shutdown and CURVE tests.

Every wait is on a condition (a log line, a number of rows) with a generous time-out: the machines these tests
run on are shared and slow."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from vlora_va.contracts.results import is_result
from vlora_va.testing.tiny import TINY_IMAGE

ROOT = Path(__file__).resolve().parents[1]
BIKES = ROOT / "sample_videos" / "bikes.mp4"  # 640x272, 25 fps, 10 s
CLI = [sys.executable, "-m", "vlora_va.cli"]
WAIT_S = 240.0


def tiny_pipeline(tmp_path: Path, backbone: Path, adapters: dict[str, Path], streams: list[dict], **extra) -> dict:
    """A pipeline dict for the tiny backbone: private ipc endpoint, jsonl sink in tmp_path, one stream per
    worker unless `ingest` says otherwise. streams: [{"id": ..., **overrides}] on the bikes video, looping, paced."""
    cfg = {
        "daemon": {"endpoint": f"ipc://{tmp_path}/daemon.sock", "backbone": str(backbone), "image_size": TINY_IMAGE,
                   "threads": 1, "max_wait_ms": 5, "profile_cache": str(tmp_path / "profiles"), "http_port": 0,
                   "log_every_s": 2},
        "ingest": {"streams_per_worker": 1, "drop_policy": "drop_oldest", "close_grace_s": 2},
        "adapters": {n: str(p) for n, p in adapters.items()},
        "streams": [{"source": str(BIKES), "fps": 4, "chunk_seconds": 0.5, "loop": True, "realtime": True,
                     "tasks": [{"name": "det", "adapter": next(iter(adapters)), "frames_per_chunk": 1,
                                "deadline_ms": 30000}], **s} for s in streams],
        "sinks": [{"type": "jsonl", "path": str(tmp_path / "results.jsonl"), "fsync": "never"}],
    }
    for key, value in extra.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return cfg


def write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class Run:
    """`vlora-va run FILE` (or another command: `daemon`, with more arguments) in its own process group; its log
    goes to a file (read it with .log())."""

    def __init__(self, config_path: Path, *args: str, command: str = "run"):
        self.path = config_path
        self.sink = config_path.parent / "results.jsonl"
        self.log_path = config_path.parent / f"{command}.log"
        self._log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen([*CLI, command, str(config_path), *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=self._log_file, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rows(self) -> list[dict]:
        """The result rows written so far (event rows: `events`)."""
        return [r for r in self.all_rows() if is_result(r)]

    def events(self) -> list[dict]:
        return [r for r in self.all_rows() if not is_result(r)]

    def all_rows(self) -> list[dict]:
        if not self.sink.exists():
            return []
        out = []
        for line in self.sink.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written right now
                pass
        return out

    def wait_for(self, what: str, condition, timeout: float = WAIT_S):
        """Poll condition() until it returns something truthy (returned), the run dies, or time is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = condition()
            if got:
                return got
            if self.proc.poll() is not None:
                raise AssertionError(f"vlora-va run exited ({self.proc.returncode}) waiting for {what}:\n"
                                     f"{self.log()[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.log()[-4000:]}")

    def wait_log(self, pattern: str, timeout: float = WAIT_S, after: int = 0) -> re.Match:
        return self.wait_for(f"log /{pattern}/", lambda: re.search(pattern, self.log()[after:]), timeout)

    def wait_rows(self, predicate, n: int = 1, timeout: float = WAIT_S) -> list[dict]:
        return self.wait_for(f"{n} rows matching", lambda: (m := [r for r in self.rows() if predicate(r)])[n - 1:] and m,
                             timeout)

    def pid(self, child: str, after: int = 0) -> int:
        """The pid of the latest 'daemon' or 'ingest worker N' started (from the supervisor's log)."""
        pattern = r"daemon started \(pid (\d+)\)" if child == "daemon" else rf"{child} \(pid (\d+)\)"
        return int(self.wait_log(pattern, after=after).group(1)) if not re.findall(pattern, self.log()[after:]) \
            else int(re.findall(pattern, self.log()[after:])[-1])

    def send(self, sig: int, group: bool = False) -> None:
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def finish(self, sig: int = signal.SIGINT, group: bool = True, timeout: float = WAIT_S) -> int:
        """Stop it (like Ctrl-C in a terminal) and return its exit code."""
        if self.proc.poll() is None:
            self.send(sig, group)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self._log_file.close()


def stopped_counts(log: str) -> dict[str, int]:
    """The daemon's last "daemon stopped: ..." line as numbers."""
    m = re.findall(r"daemon stopped: (\d+) chunks, (\d+) requests, (\d+) results, (\d+) shed, (\d+) errors", log)
    assert m, log[-3000:]
    return dict(zip(("chunks", "requests", "ok", "shed", "errors"), map(int, m[-1])))


def ingest_sent(log: str) -> dict[str, int]:
    """Per stream, chunks its ingest workers handed to ZeroMQ (summed over the workers that ran it)."""
    out: dict[str, int] = {}
    for sid, n in re.findall(r"stream (\S+): finished: (\d+) chunks sent", log):
        out[sid] = out.get(sid, 0) + int(n)
    return out


def accounting(rows: list[dict], stream: str, task: str = "det") -> dict:
    """One stream's rows: chunk numbers answered, the chunks ingest said it dropped (dropped_before), and the
    chunks neither answered nor reported (lost in flight). Duplicates would be an error."""
    mine = sorted((r for r in rows if r["stream"] == stream and r["task"] == task), key=lambda r: r["chunk"])
    chunks = [r["chunk"] for r in mine]
    assert len(chunks) == len(set(chunks)), f"{stream}: a chunk answered twice: {chunks}"
    reported = sum(r.get("dropped_before", 0) for r in mine)
    last = chunks[-1] if chunks else -1
    return {"rows": mine, "chunks": chunks, "reported": reported, "lost": last + 1 - len(chunks) - reported}


def probe(cfg: dict, backbone: Path, adapters: dict[str, Path], seq: int, tasks: list[tuple[str, str]],
          run: "Run", timeout: float = WAIT_S) -> None:
    """Send one known chunk (stream "probe") straight to the running daemon, as an authorised client where the
    pipeline uses CURVE, and check that every task's row is exactly what a fresh engine computes for it: the
    daemon is alive and still serves correct results."""
    import zmq

    from tests.serving.test_daemon import chunk_parts
    from vlora_va.contracts.security import CurveConfig, curve_client
    from vlora_va.testing.messages import payload_difference, reference_payloads

    parts = chunk_parts("probe", seq, tasks, n_frames=2, frames_seed=100 + seq)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    curve = cfg.get("security", {}).get("curve")
    if curve:
        curve_client(CurveConfig(**curve)).secure(push)
    push.connect(cfg["daemon"]["endpoint"])
    try:
        push.send_multipart(parts)
        got = run.wait_rows(lambda r: r["stream"] == "probe" and r["chunk"] == seq, len(tasks), timeout)
    finally:
        push.close(linger=0)
        ctx.term()
    want = reference_payloads(backbone, {a: adapters[a] for _, a in tasks}, TINY_IMAGE, parts)
    for row in got:
        assert row["status"] == "ok", row
        problem = payload_difference(row, want[row["task"]])
        assert problem is None, f"probe chunk {seq} task {row['task']}: {problem}"
