"""End to end: `vlora-va run` on the sample videos with the real default backbone and the shipped adapters,
through real ingest processes, real ZeroMQ sockets and the real daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vlora_va.models import DEFAULT_BACKBONE, cache_dir, fetched_ok

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "vlora_va.cli"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def default_backbone():
    if not fetched_ok(cache_dir() / DEFAULT_BACKBONE):
        pytest.fail("the default backbone is not fetched: run `vlora-va models fetch` (make test does)")


def pipeline(tmp_path: Path, **stream_overrides) -> Path:
    """The repository's default pipeline, with a private endpoint and sink, and lossless ingest."""
    cfg = yaml.safe_load((ROOT / "pipelines.yaml").read_text())
    cfg["daemon"]["endpoint"] = f"ipc://{tmp_path}/daemon.sock"
    cfg["ingest"]["drop_policy"] = "block"  # every chunk must reach the daemon, however slow this machine is
    cfg["adapters"] = {n: str(ROOT / p) for n, p in cfg["adapters"].items()}
    for s in cfg["streams"]:
        s["source"] = str(ROOT / s["source"])
        s.update(stream_overrides)
    cfg["sinks"] = [{"type": "jsonl", "path": str(tmp_path / "results.jsonl")}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def read_rows(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]


def check_rows(rows: list[dict], config: dict) -> None:
    streams = {s["id"]: s for s in config["streams"]}
    sizes = {"pedestrians": (768, 576), "bikes": (640, 272)}
    for sid, s in streams.items():
        for task in s["tasks"]:
            mine = [r for r in rows if r["stream"] == sid and r["task"] == task["name"]]
            seqs = [r["chunk"] for r in mine]
            assert seqs == list(range(len(seqs))) and seqs, f"{sid}/{task['name']}: chunks {seqs}"
            for r in mine:
                assert "error" not in r, r
                assert len(r["frame_ts"]) == task["frames_per_chunk"]
                assert all(r["chunk"] <= t < r["chunk"] + 1 for t in r["frame_ts"])  # 1-s chunks
                lat = r["latency_ms"]
                assert 0 <= lat["queue"] and 0 < lat["compute"] <= lat["total"] < 300_000
                assert isinstance(r["deadline_met"], bool) and r["deadline_ms"] == task["deadline_ms"]
                if "frames" in r:
                    w, h = sizes[sid]
                    for f in r["frames"]:
                        for d in f["detections"]:
                            x1, y1, x2, y2 = d["box"]
                            assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h and 0 < d["score"] <= 1
                else:
                    assert r["label"] and 0 < r["score"] <= 1
                    w, h = sizes[sid]
                    for person in r.get("persons", []):  # a per-person adapter reports everyone it sees
                        x1, y1, x2, y2 = person["box"]
                        assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h and 0 < person["score"] <= 1
                        assert person["activity"] in ("standing", "walking_left", "walking_right", "walking_toward",
                                                      "walking_away", "cycling")


def test_default_pipeline_on_the_sample_videos(tmp_path):
    path = pipeline(tmp_path, max_chunks=3, realtime=False)
    proc = subprocess.run([*CLI, "run", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(tmp_path)
    config = yaml.safe_load(path.read_text())
    check_rows(rows, config)
    assert len(rows) == sum(3 * len(s["tasks"]) for s in config["streams"])
    assert "daemon stopped" in proc.stderr and "opened" in proc.stderr


def test_per_person_activity_adapter_in_the_pipeline(tmp_path):
    """The shipped actions-persons adapter served by the real daemon in place of the default activity adapter."""
    path = pipeline(tmp_path, max_chunks=3, realtime=False)
    cfg = yaml.safe_load(path.read_text())
    cfg["adapters"]["actions-persons"] = str(ROOT / "adapters" / "actions-persons")
    cfg["streams"] = [s for s in cfg["streams"] if s["id"] == "pedestrians"]
    for task in cfg["streams"][0]["tasks"]:
        if task["adapter"] == "actions":
            task.update(adapter="actions-persons", frames_per_chunk=4)
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([*CLI, "run", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(tmp_path)
    check_rows(rows, cfg)
    assert "-frame clips" not in proc.stderr  # no clip-length warning: 4 frames, as the adapter learnt
    # The surveillance scene always has people walking: the adapter must find some in 3 s of it.
    assert any(r.get("persons") for r in rows if r["task"] == "activity")


def test_ctrl_c_drains_every_received_chunk(tmp_path):
    path = pipeline(tmp_path, loop=True, realtime=True)
    proc = subprocess.Popen([*CLI, "run", str(path)], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            sink = tmp_path / "results.jsonl"
            if sink.exists() and len(sink.read_text().splitlines()) >= 4:
                break
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C in a terminal: the whole process group
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    rows = read_rows(tmp_path)
    check_rows(rows, yaml.safe_load(path.read_text()))  # contiguous chunks: nothing received was lost
    received = int(err.split("daemon stopped: ")[1].split(" chunks")[0])
    tasks_per_stream = {s["id"]: len(s["tasks"]) for s in yaml.safe_load(path.read_text())["streams"]}
    per_stream = {sid: len({r["chunk"] for r in rows if r["stream"] == sid}) for sid in tasks_per_stream}
    assert sum(per_stream.values()) == received
    assert len(rows) == sum(per_stream[s] * n for s, n in tasks_per_stream.items())
