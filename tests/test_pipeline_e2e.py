"""End to end: `vlora-va run` on the sample videos with the real default backbone and the shipped adapters,
through real ingest processes, real ZeroMQ sockets and the real daemon."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import unavailable
from tests.pipeline_helpers import Run
from vlora_va.analytics.tracking import one_box_per_object
from vlora_va.contracts.boxes import pair_iou
from vlora_va.contracts.results import DetectionResult, FrameDetections, JsonlFollower, is_result
from vlora_va.engine.backbones import DEFAULT_BACKBONE, cache_dir, fetched_ok
from vlora_va.testing.harness import free_port

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
    cfg["daemon"]["http_port"] = 0  # tests may overlap: no fixed dashboard port
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
    """The result rows (event rows: read_events)."""
    return [r for r in read_all(tmp_path) if is_result(r)]


def read_events(tmp_path: Path) -> list[dict]:
    return [r for r in read_all(tmp_path) if not is_result(r)]


def read_all(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]


def run(path: Path, timeout: int = 600) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`vlora-va run` on a pipeline file to the end; it must exit 0. Returns the process and the rows."""
    proc = subprocess.run([*CLI, "run", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, read_rows(path.parent)


SIZES = {"pedestrians": (768, 576), "bikes": (640, 272)}


def check_rows(rows: list[dict], config: dict) -> None:
    """One row per chunk and task, contiguous; served rows well formed; shed rows say why; no errors."""
    streams = {s["id"]: s for s in config["streams"]}
    for sid, s in streams.items():
        for task in s["tasks"]:
            mine = sorted((r for r in rows if r["stream"] == sid and r["task"] == task["name"]), key=lambda r: r["chunk"])
            seqs = [r["chunk"] for r in mine]
            assert seqs == list(range(len(seqs))) and seqs, f"{sid}/{task['name']}: chunks {seqs}"
            for r in mine:
                assert r["status"] in ("ok", "shed"), r
                assert len(r["frame_ts"]) == task["frames_per_chunk"]
                assert all(r["chunk"] <= t < r["chunk"] + 1 for t in r["frame_ts"])  # 1-s chunks
                assert r["deadline_ms"] == task["deadline_ms"]
                if r["status"] == "shed":
                    assert r["reason"] and r["deadline_met"] is False and "frames" not in r and "label" not in r
                    continue
                lat = r["latency_ms"]
                assert 0 <= lat["queue"] and 0 < lat["compute"] <= lat["total"] < 300_000
                assert isinstance(r["deadline_met"], bool)
                check_payload(r, SIZES[sid.split("-")[0]])


def check_payload(r: dict, size: tuple[int, int]) -> None:
    w, h = size
    if "frames" in r:
        for f in r["frames"]:
            for d in f["detections"]:
                x1, y1, x2, y2 = d["box"]
                assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h and 0 < d["score"] <= 1
    else:
        assert r["label"] and 0 < r["score"] <= 1
        for person in r.get("persons", []):  # a per-person adapter reports everyone it sees
            x1, y1, x2, y2 = person["box"]
            assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h and 0 < person["score"] <= 1
            assert person["activity"] in ("standing", "walking_left", "walking_right", "walking_toward",
                                          "walking_away", "cycling")


def reference_rows(path: Path) -> dict[tuple[str, int, str], dict]:
    """What every request of the pipeline must be answered with: the chunks its ingest sends (captured by running
    the same ingest code against a plain receiver), each task computed alone by a fresh engine with the shipped
    adapters. Keyed by (stream, chunk, task)."""
    import threading

    import zmq

    from tests.ingest.ingest_helpers import Receiver
    from vlora_va.contracts.config import load_config
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.executor import Engine
    from vlora_va.engine.modes import UNMERGED, LoRAMode
    from vlora_va.ingest.worker import run_ingest
    from vlora_va.serving.scheduling import make_plan

    cfg = load_config(path)
    ctx = zmq.Context()
    receiver = Receiver(ctx)
    cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, endpoint=receiver.endpoint))
    flushed, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=run_ingest, args=(cfg, None, None, flushed, release), daemon=True)
    worker.start()
    total = sum(s.max_chunks for s in cfg.streams)
    assert receiver.pump(lambda: len(receiver.chunks) == total, 300), len(receiver.chunks)
    release.set()
    worker.join(60)
    receiver.sock.close()
    ctx.term()
    backbone = load_backbone(cfg.daemon.backbone)
    adapters = {n: load_adapter_dir(n, p, backbone.config.hidden_size) for n, p in cfg.adapters.items()}
    engine = Engine(backbone, adapters, cfg.daemon.image_size)
    tracked = {(s.id, t.name) for s in cfg.streams for t in s.tracked_tasks}
    out = {}
    for chunk in receiver.chunks:
        for r in chunk.requests(time.time()):
            payload = engine.execute(make_plan([r], LoRAMode(UNMERGED), engine.catalog()))[0]
            if (r.stream, r.task) in tracked:  # a tracked task's row has one box per object (analytics/tracking.py)
                payload = DetectionResult(tuple(FrameDetections(f.ts, tuple(one_box_per_object(
                    list(f.detections), cfg.tracking.class_nms_iou))) for f in payload.frames))
            out[(r.stream, r.seq, r.task)] = payload.to_json()
    return out


def same_payload(got: dict, want: dict, threshold: float) -> str | None:
    """None when a row carries the reference's result (batched float maths aside), else what differs. A detection
    within 0.01 of the head's score threshold may fall on either side of it; so may the class of one object found
    as two classes scoring within 0.01 of each other (a tracked task keeps one of them). Track ids are not
    compared (the reference has none)."""
    if "label" in want:
        if got.get("label") != want["label"]:
            return f"label {got.get('label')} != {want['label']}"
        off = {k: (got["scores"].get(k), v) for k, v in want["scores"].items() if abs(got["scores"].get(k, -1) - v) > 1e-3}
        return f"scores differ: {off}" if off else None
    if len(got["frames"]) != len(want["frames"]):
        return f"{len(got['frames'])} frames != {len(want['frames'])}"
    for g, w in zip(got["frames"], want["frames"]):
        for mine, other, what in ((w["detections"], g["detections"], "missing"),
                                  (g["detections"], w["detections"], "extra")):
            for d in mine:
                if d["score"] < threshold + 0.01:
                    continue
                if not any(e["class"] == d["class"] and abs(e["score"] - d["score"]) <= 1e-3
                           and max(abs(x - y) for x, y in zip(e["box"], d["box"])) <= 1.0 for e in other) \
                        and not any(e["class"] != d["class"] and abs(e["score"] - d["score"]) <= 0.01
                                    and pair_iou(e["box"], d["box"]) >= 0.7 for e in other):
                    return f"frame {w['ts']}: {what} {d}"
    return None


def test_default_pipeline_on_the_sample_videos(tmp_path):
    """Every request answered, with what the shipped adapters compute for exactly those frames (a pipeline that
    sent the wrong frames, mixed up adapters or rows, or answered with nothing, fails), and people found in the
    surveillance scene."""
    path = pipeline(tmp_path, max_chunks=3, realtime=False)
    config = yaml.safe_load(path.read_text())
    config["daemon"]["precision"] = "fp32"  # the reference below computes in fp32 (int8/bf16 depend on the batch)
    path.write_text(yaml.safe_dump(config))
    proc, rows = run(path)
    check_rows(rows, config)
    assert len(rows) == sum(3 * len(s["tasks"]) for s in config["streams"])
    assert "daemon stopped" in proc.stderr and "opened" in proc.stderr
    want = reference_rows(path)
    assert set(want) == {(r["stream"], r["chunk"], r["task"]) for r in rows}
    thresholds = {n: json.loads((Path(p) / "head_config.json").read_text()).get("params", {}).get("score_threshold", 0)
                  for n, p in config["adapters"].items()}
    for r in rows:
        assert r["status"] == "ok", r
        problem = same_payload(r, want[(r["stream"], r["chunk"], r["task"])], thresholds[r["adapter"]])
        assert problem is None, f"{r['stream']} chunk {r['chunk']} {r['task']}: {problem}"
    people = [[d for d in f["detections"] if d["class"] == "person"]
              for r in rows if r["stream"] == "pedestrians" and r["task"] == "detect" for f in r["frames"]]
    frames = next(t["frames_per_chunk"] for st in config["streams"] if st["id"] == "pedestrians" for t in st["tasks"]
                  if t["name"] == "detect")
    assert len(people) == 3 * frames and all(people), people  # people walk through every second of this scene


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
    proc, rows = run(path)
    check_rows(rows, cfg)
    assert "-frame clips" not in proc.stderr  # no clip-length warning: 4 frames, as the adapter learnt
    # The surveillance scene always has people walking: the adapter must find some in 3 s of it.
    assert any(r.get("persons") for r in rows if r["task"] == "activity")


def ingest_sent(stderr: str) -> dict[str, int]:
    """Chunks each stream's ingest worker says it handed to ZeroMQ ("stream X: finished: N chunks sent")."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"stream (\S+): finished: (\d+) chunks sent", stderr)}


def test_ctrl_c_answers_every_chunk_ingest_sent(tmp_path):
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
    config = yaml.safe_load(path.read_text())
    check_rows(rows, config)  # contiguous chunks, one row per task
    sent = ingest_sent(err)
    tasks_per_stream = {s["id"]: len(s["tasks"]) for s in config["streams"]}
    assert set(sent) == set(tasks_per_stream) and all(sent.values())
    for sid, n in tasks_per_stream.items():  # what ingest sent, not what the daemon happened to read
        assert len({r["chunk"] for r in rows if r["stream"] == sid}) == sent[sid], (sid, sent)
        assert sum(r["stream"] == sid for r in rows) == sent[sid] * n


# ---------------------------------------------------------------- live runs, measured from outside
READ_AT = "_read_at"  # the wall time this test read a row from the sink (added to the rows it returns)
POLL_S = 0.01  # how often the sink is read: a row's read time is at most this late
SAMPLE_S = 0.25  # how often the daemon's RSS is sampled


@dataclasses.dataclass
class Followed:
    log: str  # the run's log (stderr)
    rows: list[dict]  # result rows, in sink order, each with READ_AT
    rss_kb: list[tuple[float, int]]  # (wall time, the daemon process's resident set) sampled during the run


def follow(path: Path, timeout: float = 900, during=None) -> Followed:
    """`vlora-va run` on a pipeline file to its end (it must exit 0), its JSONL sink read as it grows, like a
    consumer's tail -f: each row is stamped with the wall time this test read it, and the daemon's RSS is sampled.
    during(live, rows): called every SAMPLE_S while it runs."""
    live = Run(path)
    follower = JsonlFollower(live.sink)
    rows: list[dict] = []
    rss: list[tuple[float, int]] = []
    daemon_pid, next_sample = None, 0.0
    deadline = time.monotonic() + timeout
    try:
        while True:
            ended = live.proc.poll() is not None
            lines = follower.new_lines()
            read_at = time.time()
            rows.extend({**row, READ_AT: read_at} for line in lines if is_result(row := json.loads(line)))
            if ended:
                break
            assert time.monotonic() < deadline, f"vlora-va run still running after {timeout} s:\n{live.log()[-3000:]}"
            if time.monotonic() >= next_sample:
                next_sample = time.monotonic() + SAMPLE_S
                daemon_pid = daemon_pid or started_pid(live.log())
                if daemon_pid and (kb := rss_kb(daemon_pid)):
                    rss.append((time.time(), kb))
                if during is not None:
                    during(live, rows)
            time.sleep(POLL_S)  # the sink's poll period (what it waits on is the process's end, above)
    finally:
        live.close()
    log = live.log()
    assert live.proc.returncode == 0, log[-3000:]
    assert len(re.findall(r"daemon started \(pid \d+\)", log)) == 1, "the daemon was restarted: RSS samples mix two"
    return Followed(log, rows, rss)


def started_pid(log: str) -> int | None:
    m = re.search(r"daemon started \(pid (\d+)\)", log)
    return int(m.group(1)) if m else None


def rss_kb(pid: int) -> int | None:
    """A process's resident set (kB), None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(m.group(1)) if m else None


def end_to_end_s(row: dict) -> float:
    """Capture to delivery: from the capture of the chunk's last frame (`captured_at`: ingest's clock, which on one
    machine is the daemon's and this test's) to the moment this test read the row from the sink."""
    return row[READ_AT] - datetime.fromisoformat(row["captured_at"]).timestamp()


def served_on_time(rows: list[dict], min_served: int) -> None:
    """The real-time contract, measured from outside the daemon: served rows are read from the sink within their
    deadline at the 99th percentile (the scheduler keeps the measured sink leg out of its budget:
    serving/sink_leg.py), and none later than twice it; at least min_served rows were served."""
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= min_served, f"{len(ok)} rows served, expected at least {min_served}"
    late = sorted(end_to_end_s(r) * 1000 / r["deadline_ms"] for r in ok)
    assert late[int(0.99 * (len(late) - 1))] <= 1.0, late[-5:]
    assert late[-1] <= 2.0, late[-5:]


def summary(seconds: list[float]) -> str:
    if not seconds:
        return "none"
    ordered = sorted(seconds)
    return (f"median {ordered[len(ordered) // 2]:.3f} s, p99 {ordered[int(0.99 * (len(ordered) - 1))]:.3f} s, "
            f"max {ordered[-1]:.3f} s")


def results_in_metrics(port: int) -> tuple[dict[tuple[str, str, str], int], float]:
    """The daemon's own counts from its /metrics: result rows by (stream, task, status), and the offered load
    (seconds of compute per second) it measures now."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    counts, offered = {}, 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vlora_results_total":
                counts[(sample.labels["stream"], sample.labels["task"], sample.labels["status"])] = int(sample.value)
            elif sample.name == "vlora_offered_load":
                offered = sample.value
    return counts, offered


LOAD_LIMIT = 0.5  # "well below capacity": at most half of what the admission estimate says this machine can do


def detection_loads(cfg: dict) -> list[tuple[str, dict]]:
    """The default pipeline's detection work, heaviest first: both cameras (the tracked one at 2 frames a chunk),
    the tracked camera alone, then at 1 frame a chunk. Which is below half this machine's capacity depends on the
    CPU (0.4 s/s on an AVX-512 EPYC with OpenVINO, 0.88 s/s on a Xeon without bf16 running torch int8)."""
    def detect_only(streams: list[dict], frames: int | None = None) -> dict:
        out = []
        for s in streams:
            tasks = [dict(t, frames_per_chunk=min(t["frames_per_chunk"], frames) if frames else t["frames_per_chunk"])
                     for t in s["tasks"] if t["adapter"] == "detect"]
            out.append(dict(s, tasks=tasks))
        return {**cfg, "streams": out}

    tracked = [s for s in cfg["streams"] if s["id"] == "pedestrians"]
    return [("both cameras", detect_only(cfg["streams"])), ("the tracked camera", detect_only(tracked)),
            ("the tracked camera at 1 frame a chunk", detect_only(tracked, 1))]


def estimated_need(path: Path) -> float:
    """Seconds of compute per second the daemon's own start-up estimate (`vlora-va validate --profile`) gives the
    pipeline file on this machine (its profile cached for the run that follows)."""
    out = subprocess.run([*CLI, "validate", "--profile", str(path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    found = re.search(r"needs (\d+\.\d+) s of compute per second here", out.stdout)
    assert out.returncode == 0 and found, out.stdout[-2000:] + out.stderr[-2000:]
    return float(found.group(1))


def test_below_half_its_capacity_every_row_is_served_on_time(tmp_path):
    """The default pipeline's detection tasks (tracked on the surveillance stream, plain on the bikes), paced like
    live cameras, sized to this machine: the heaviest of `detection_loads` that the daemon's estimate puts at most
    at half its capacity (both cameras, 0.4 s of compute per second, on the 2-core reference EPYC). Nothing is shed
    or dropped, and every row is read from the sink within its deadline, measured by this test from the frame's
    capture."""
    path = pipeline(tmp_path, max_chunks=25, realtime=True)
    cfg = yaml.safe_load(path.read_text())
    cfg["ingest"]["drop_policy"] = "drop_oldest"
    for name, trial in detection_loads(cfg):
        path.write_text(yaml.safe_dump(trial))
        estimate = estimated_need(path)
        print(f"\n{name}: needs {estimate:.2f} s/s here")
        if estimate <= LOAD_LIMIT:
            cfg = trial
            break
    else:
        unavailable(f"even {name} needs {estimate:.2f} s/s here: no detection load of the default pipeline is below "
                    "half this machine's capacity")
    live = follow(path)
    need = re.search(r"capacity: \d+ stream\(s\), \d+ images/s: needs (\d+\.\d+) s of compute per second here",
                     live.log)
    assert need, live.log[-3000:]
    assert float(need.group(1)) <= LOAD_LIMIT * 1.2, f"the daemon's estimate says this load needs {need.group(1)} s/s, " \
                                                     f"the same start-up estimate said {estimate:.2f} before it started"
    rows = live.rows
    print(f"\nneeds {need.group(1)} s/s; {len(rows)} rows; capture to sink read: "
          f"{summary([end_to_end_s(r) for r in rows])}")
    check_rows(rows, cfg)
    sent = ingest_sent(live.log)
    assert {s["id"]: sum(r["stream"] == s["id"] for r in rows) for s in cfg["streams"]} == sent  # one task each
    assert [r for r in rows if r["status"] != "ok" or not r["deadline_met"] or r.get("dropped_before")] == []
    late = [(r["stream"], r["chunk"], r["task"], round(end_to_end_s(r), 3)) for r in rows
            if end_to_end_s(r) * 1000 > r["deadline_ms"]]
    assert late == [], f"read from the sink after the deadline: {late}"
    people = [d for r in rows if r["stream"] == "pedestrians" for f in r["frames"] for d in f["detections"]
              if d["class"] == "person"]
    assert len(people) >= 10  # people walk through every second of this scene


UNSERVED_MIN = 0.2  # overloaded: at least this share of the images ingest sent for the heavy streams is not served
OVERLOAD_AIM = 1.8  # the estimate the copies aim at: five copies of 1 detection frame offered ~1.7 s/s on the EPYC
# the test was made on, ~0.97 on a 2-core Xeon with AMX (OpenVINO bf16), which never overloaded it
COPIES = 5  # heavier copies rather than more: 12 copies made ingest drop a chunk there (the test counts them all)
RSS_GROWTH_MAX_MB = 300  # the daemon's RSS under overload may exceed its RSS when serving began by at most this


def images_served(row: dict, frames: int) -> int:
    """The frames a served row's request was served with: all `frames` of its task, or fewer where overload
    thinned the clip ("degraded": "overload: 4 of 8 frames")."""
    m = re.search(r"(\d+) of \d+ frames", row.get("degraded") or "")
    return int(m.group(1)) if m else frames


def detect_frames_to_overload(tmp_path: Path, cfg: dict, copy: dict) -> int:
    """The detection frames per chunk (1-10) with which COPIES copies of `copy` offer about OVERLOAD_AIM s of compute
    per second on this machine: what `vlora-va validate --profile` (the daemon's own start-up estimate) says one copy
    needs here with 1 and with 10 frames, interpolated (the cost is close to linear in frames)."""
    def need(frames: int) -> float:
        probe = tmp_path / f"one-copy-{frames}.yaml"
        probe.write_text(yaml.safe_dump({**cfg, "streams": [dict(with_detect_frames(copy, frames), id="probe")]}))
        return estimated_need(probe)

    one, ten = need(1), need(10)
    per_frame = max(ten - one, 1e-6) / 9
    frames = min(10, max(1, 1 + math.ceil((OVERLOAD_AIM / COPIES - one) / per_frame)))
    print(f"\none copy needs {one:.2f} s/s here with 1 detection frame, {ten:.2f} with 10: {frames} frames")
    return frames


def with_detect_frames(stream: dict, frames: int) -> dict:
    """`stream` with its detection task on `frames` frames per chunk."""
    return dict(stream, tasks=[dict(t, frames_per_chunk=frames) if t["adapter"] == "detect" else t
                               for t in stream["tasks"]])


def test_overload_sheds_per_stream_and_full_service_resumes_when_it_ends(tmp_path):
    """Five copies of the surveillance stream (each detect + 8-frame activity; detect on as many frames as this
    machine's estimate says offer about OVERLOAD_AIM, one at least) overload two cores; beside them a light stream
    (detect on bikes, 1 frame/s) runs on after they end. Under overload, at the offered load
    the daemon measures, served work keeps its deadlines (measured by this test from capture to the sink), memory
    stays bounded, and the shed rows of each stream are what the daemon counts for it; once the load drops, the
    light stream is served in full again, without a restart."""
    port = free_port()
    cfg = yaml.safe_load((ROOT / "pipelines.yaml").read_text())
    cfg["daemon"]["endpoint"] = f"ipc://{tmp_path}/daemon.sock"
    cfg["daemon"]["http_port"] = port  # its /metrics: the daemon's own counts
    cfg["ingest"].update(drop_policy="drop_oldest", streams_per_worker=2)
    cfg["adapters"] = {n: str(ROOT / p) for n, p in cfg["adapters"].items()}
    peds = next(s for s in cfg["streams"] if s["id"] == "pedestrians")
    bikes = next(s for s in cfg["streams"] if s["id"] == "bikes")
    # five, not three: on a fast AVX-512 VNNI CPU three copies offered ~0.95-0.99 s of compute per second, at the
    # edge of overload, and sometimes nothing was shed; five offered ~1.7 s there (detect_frames_to_overload)
    # The copies are untracked: tracking (2 detection frames, priority 1) is not what this test is about, and five
    # tracked copies would offer another ~0.6 s per second. Their detection frames: detect_frames_to_overload.
    untracked = [{k: v for k, v in t.items() if k not in ("track", "priority")} | {"frames_per_chunk": 1}
                 if t.get("track") else t for t in peds["tasks"]]
    peds = {k: v for k, v in peds.items() if k not in ("lines", "zones", "snapshots")} | {"tasks": untracked}
    copy = dict(peds, source=str(ROOT / peds["source"]), max_chunks=18)
    copy = with_detect_frames(copy, detect_frames_to_overload(tmp_path, cfg, copy))
    heavy = [dict(copy, id=f"pedestrians-{i}") for i in range(COPIES)]
    light = dict(bikes, id="bikes", source=str(ROOT / bikes["source"]), loop=True, max_chunks=36)
    cfg["streams"] = [*heavy, light]
    cfg["sinks"] = [{"type": "jsonl", "path": str(tmp_path / "results.jsonl")}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    heavy_ids = {s["id"] for s in heavy}
    seen = {"counts": None}

    def watch(live: Run, rows: list[dict]) -> None:
        """The daemon's counts once every heavy chunk has its rows (18 chunks, two tasks: check_rows below says no
        chunk was dropped), while the light stream runs on."""
        if "daemon ready" not in live.log() or seen["counts"] is not None:
            return
        if all(sum(r["stream"] == sid for r in rows) == 2 * 18 for sid in heavy_ids):
            try:
                seen["counts"], _ = results_in_metrics(port)  # scraped after those rows were read: counted before
            except OSError:  # its HTTP server may start a moment after it says ready
                return

    live = follow(path, during=watch)
    rows = live.rows
    served = [r for r in rows if r["status"] == "ok"]
    base = next(kb for t, kb in live.rss_kb if t >= rows[0][READ_AT])  # once serving began
    peak = max(kb for _, kb in live.rss_kb)
    # Overloaded, by the test's own books: of the images ingest sent for the heavy streams, the share not served
    sent = ingest_sent(live.log)
    frames = {t["name"]: t["frames_per_chunk"] for t in copy["tasks"]}
    offered = sum(sent[sid] for sid in heavy_ids) * sum(frames.values())
    served_images = sum(images_served(r, frames[r["task"]]) for r in served if r["stream"] in heavy_ids)
    unserved = 1.0 - served_images / offered
    print(f"\n{offered} images sent for the heavy streams, {served_images} served ({unserved:.0%} not); "
          f"{len(served)} of {len(rows)} rows served; capture to sink read: "
          f"{summary([end_to_end_s(r) for r in served])}; daemon RSS {base // 1024} MB when serving began, "
          f"peak {peak // 1024} MB")
    check_rows(rows, cfg)
    served_on_time(rows, min_served=len(rows) // 4)
    assert unserved >= UNSERVED_MIN, f"only {unserved:.0%} of the heavy streams' images were not served"
    assert "overload:" in live.log
    # per stream and task, the rows say what the daemon counted (shed above all)
    counts = seen["counts"]
    assert counts is not None, "the heavy streams' rows were never all in while the daemon ran"
    mine = {}
    for r in rows:
        if r["stream"] in heavy_ids:
            mine[(r["stream"], r["task"], r["status"])] = mine.get((r["stream"], r["task"], r["status"]), 0) + 1
    assert {k: v for k, v in counts.items() if k[0] in heavy_ids and v} == mine
    assert all(mine.get((sid, "activity", "shed"), 0) + mine.get((sid, "detect", "shed"), 0) > 0 for sid in heavy_ids)
    # memory: bounded queues, whatever the load (RSS once serving began vs its peak under overload)
    assert peak - base <= RSS_GROWTH_MAX_MB * 1024, f"daemon RSS {base // 1024} MB when serving began, peak " \
                                                   f"{peak // 1024} MB"
    # Once the heavy streams are over (18 s) and the 5-s load window has forgotten them, everything is served.
    tail = [r for r in rows if r["stream"] == "bikes" and r["chunk"] >= 27]
    assert tail and all(r["status"] == "ok" and r["deadline_met"] for r in tail), [
        (r["chunk"], r["status"], r.get("reason")) for r in tail if r["status"] != "ok"]
    stopped = re.search(r"daemon stopped: (\d+) chunks, (\d+) requests, (\d+) results, (\d+) shed, (\d+) errors",
                        live.log)
    chunks, requests, ok, n_shed, errors = map(int, stopped.groups())
    assert requests == ok + n_shed + errors == len(rows) and errors == 0
