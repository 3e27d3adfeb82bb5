"""The daemon over real ZeroMQ sockets, with a tiny random-weight backbone: every request gets exactly one
row, bad input is answered and never fatal, policies and modes serve the right adapter, and the log and
gauges keep moving under load."""

import json
import logging
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zmq

from vlora_va.contracts.config import parse_config
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.results import is_result
from vlora_va.contracts.wire import ChunkHeader, TaskRequest, encode_chunk
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.executor import Engine
from vlora_va.engine.modes import UNMERGED, LoRAMode
from vlora_va.outputs.attach import run_with_outputs
from vlora_va.serving.daemon import Daemon
from vlora_va.serving.scheduling import make_plan
from vlora_va.testing.messages import make_seeing_detector, payload_difference
from vlora_va.testing.tiny import TINY_IMAGE


def config(tmp_path, backbone, adapters, **daemon):
    return parse_config(cfg_text(tmp_path, backbone, adapters, **daemon), "test.yaml", tmp_path)


def cfg_text(tmp_path, backbone, adapters, **daemon):
    Path(tmp_path).mkdir(parents=True, exist_ok=True)  # the ipc endpoint's folder (nothing else may make it first)
    opts = "".join(f"\n  {k}: {v}" for k, v in daemon.items())
    text = f"""
daemon:
  endpoint: ipc://{tmp_path}/daemon.sock
  backbone: {backbone}
  image_size: {TINY_IMAGE}
  threads: 1
  max_wait_ms: 5
  profile_cache: {tmp_path}/profiles{opts}
adapters:
""" + "".join(f"  {n}: {p}\n" for n, p in adapters.items()) + f"""
streams:
  - id: cam
    source: unused.mp4
    tasks:
      - adapter: {next(iter(adapters))}
sinks:
  - type: jsonl
    path: {tmp_path}/results.jsonl
"""
    return text


def chunk_parts(stream, seq, tasks, n_frames=2, side=TINY_IMAGE, deadline_s=30.0, ready_ago_s=0.0, skew_s=0.0,
                frames_seed=None):
    """A chunk as ingest sends it. skew_s: the sender's clock runs this far from ours."""
    now = time.time() + skew_s
    rng = np.random.default_rng(seq if frames_seed is None else frames_seed)
    frames = [rng.integers(0, 255, (side, side, 3), dtype=np.uint8) for _ in range(n_frames)]
    header = ChunkHeader(stream=stream, seq=seq, fps=10.0, frame_ts=tuple(seq + 0.1 * i for i in range(n_frames)),
                         frame_shape=(side, side, 3), orig_size=(640, 480),
                         letterbox=Letterbox(side / 640, 0.0, (side - 480 * side / 640) / 2),
                         tasks=tuple(TaskRequest(name, adapter, tuple(range(n_frames)), deadline_s * 1000.0)
                                     for name, adapter in tasks),
                         ready_wall=now - ready_ago_s, sent_wall=now)
    return encode_chunk(header, frames)


class RunningDaemon:
    def __init__(self, cfg):
        self.cfg = cfg
        self.daemon = Daemon(cfg)
        self.stop, self.ready, self.drained = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=run_with_outputs, args=(self.daemon, self.stop, self.ready, self.drained),
                                       daemon=True)
        self.thread.start()
        assert self.ready.wait(60), "daemon did not start"
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(cfg.daemon.endpoint)

    def send(self, parts):
        self.push.send_multipart(parts, copy=False)

    def finish(self):
        # Like an ingest worker: stay connected until the daemon has drained (ZeroMQ drops what is still
        # in flight to a throttled receiver when the sender disconnects).
        self.stop.set()
        assert self.drained.wait(120), "daemon did not drain"
        self.push.close(linger=0)
        self.ctx.term()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return read_rows(self.cfg)


def read_rows(cfg):
    with open(cfg.sinks[0].options.path) as f:
        return [row for line in f if is_result(row := json.loads(line))]


@pytest.fixture
def running(tmp_path, tiny_backbone_dir, tiny_adapters):
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, tiny_adapters))
    yield d
    d.stop.set()


def test_serves_chunks_from_several_streams_in_order(running):
    for seq in range(4):
        for stream in ("a", "b"):
            running.send(chunk_parts(stream, seq, [("det", "detect"), ("act", "actions")]))
    rows = running.finish()
    assert len(rows) == 16 and all(r["status"] == "ok" for r in rows)
    for stream in ("a", "b"):
        for task in ("det", "act"):
            mine = [r for r in rows if r["stream"] == stream and r["task"] == task]
            assert [r["chunk"] for r in mine] == [0, 1, 2, 3]
    det = next(r for r in rows if r["task"] == "det")
    assert det["untrained"] is True and len(det["frames"]) == 2 and det["frame_ts"] == [0.0, 0.1]
    act = next(r for r in rows if r["task"] == "act")
    assert act["label"] in ("standing", "walking")
    for r in rows:
        lat = r["latency_ms"]
        assert 0 <= lat["queue"] and 0 < lat["compute"] <= lat["total"] < 60_000
        assert r["deadline_met"] is True and r["deadline_ms"] == pytest.approx(30_000, abs=1)
        assert r["mode"] in ("premerged", "unmerged", "merged:detect", "merged:actions", "mixture:detect",
                             "mixture:actions") and r["batch_images"] >= 2


def test_malformed_messages_are_logged_and_counted_never_fatal(running, caplog):
    good = lambda seq: chunk_parts("cam", seq, [("det", "detect")])
    running.send(good(0))
    running.send([b"{not json"])
    truncated = good(1)
    truncated[2] = truncated[2][:-100]
    running.send(truncated)
    running.send([good(2)[0]])  # header only: frames missing
    running.send(chunk_parts("cam", 3, [("det", "nosuch")]))  # unknown adapter
    running.send(chunk_parts("cam", 4, [("det", "detect")], side=28))  # wrong model image size
    huge = json.loads(bytes(good(6)[0]))
    huge["seq"] = 10 ** 400  # a number no float holds
    running.send([json.dumps(huge).encode(), *good(6)[1:]])
    running.send(good(5))
    rows = running.finish()
    assert running.daemon.totals.malformed == 4
    ok = [r for r in rows if r["status"] == "ok"]
    assert [r["chunk"] for r in ok] == [0, 5]
    errors = {r["chunk"]: r["reason"] for r in rows if r["status"] == "error"}
    assert "unknown adapter 'nosuch'" in errors[3]
    assert "frames are 28x28 but the daemon's image_size is 56" in errors[4]
    assert "malformed message rejected" in caplog.text and "header.seq: must be in" in caplog.text


def test_every_received_request_gets_exactly_one_row_even_under_overload(tmp_path, tiny_backbone_dir, tiny_adapters):
    """Far more work than the deadlines allow: every request is answered once, ok or shed (with a reason);
    nothing served is late."""
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters, max_batch_images=4)
    d = RunningDaemon(cfg)
    sent = 0
    for seq in range(150):
        d.send(chunk_parts("cam", seq, [("det", "detect"), ("act", "actions")], n_frames=4, deadline_s=0.05))
        sent += 2
    rows = d.finish()
    keys = [(r["chunk"], r["task"]) for r in rows]
    assert len(keys) == len(set(keys)) == sent == d.daemon.totals.answered == d.daemon.totals.requests
    shed = [r for r in rows if r["status"] == "shed"]
    assert shed and all(r["reason"] and r["deadline_met"] is False for r in shed)
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and sum(not r["deadline_met"] for r in ok) <= max(1, len(ok) // 100)
    assert d.daemon.totals.shed_by[("cam", "det")] + d.daemon.totals.shed_by[("cam", "act")] == len(shed)


def test_stop_drains_every_received_chunk(running):
    for seq in range(10):
        running.send(chunk_parts("cam", seq, [("det", "detect"), ("act", "actions")], n_frames=3))
    rows = running.finish()  # stop right after sending: all 20 requests must still be answered
    assert sorted((r["chunk"], r["task"]) for r in rows) == sorted((s, t) for s in range(10) for t in ("det", "act"))
    assert all(r["status"] == "ok" for r in rows)


def test_missing_adapter_is_reported_and_the_others_keep_working(tmp_path, tiny_backbone_dir, tiny_adapters):
    adapters = {"detect": tiny_adapters["detect"], "gone": tmp_path / "no-such-adapter"}
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, adapters))
    d.send(chunk_parts("cam", 0, [("det", "detect"), ("x", "gone")]))
    rows = d.finish()
    by_task = {r["task"]: r for r in rows}
    assert by_task["det"]["status"] == "ok"
    assert by_task["x"]["status"] == "error"
    assert "adapter 'gone' failed to load" in by_task["x"]["reason"] and "does not exist" in by_task["x"]["reason"]


def test_adapter_for_another_backbone_is_rejected_alone(tmp_path, tiny_backbone_dir, tiny_adapters):
    from vlora_va.testing.tiny import make_adapter

    alien = make_adapter(tmp_path / "alien", "detection", ["person"], targets=("attention.qkv",), nonzero=False)
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"], "alien": alien}))
    d.send(chunk_parts("cam", 0, [("det", "detect"), ("x", "alien")]))
    rows = d.finish()
    by_task = {r["task"]: r for r in rows}
    assert by_task["det"]["status"] == "ok"
    assert "not a linear layer of this backbone" in by_task["x"]["reason"]


def test_an_expired_request_is_shed_not_served_late(running):
    running.send(chunk_parts("cam", 0, [("det", "detect")], deadline_s=1.0, ready_ago_s=5.0))
    running.send(chunk_parts("cam", 1, [("det", "detect")]))
    rows = running.finish()
    by_chunk = {r["chunk"]: r for r in rows}
    assert by_chunk[0]["status"] == "shed" and by_chunk[0]["deadline_met"] is False
    assert "cannot meet its deadline" in by_chunk[0]["reason"]
    assert by_chunk[0]["latency_ms"]["total"] >= 5000
    assert by_chunk[1]["status"] == "ok" and by_chunk[1]["deadline_met"] is True


@pytest.mark.parametrize("skew_s", [-3600.0, 250.0])
def test_deadlines_survive_a_sender_whose_clock_is_off(running, skew_s):
    """Budgets travel relative to the chunk's capture time and the daemon measures the sender's clock
    offset: a sender an hour behind (or minutes ahead) is served in deadline with true latencies."""
    for seq in range(3):
        running.send(chunk_parts("cam", seq, [("det", "detect")], deadline_s=2.0, ready_ago_s=0.1, skew_s=skew_s))
    rows = running.finish()
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert all(r["deadline_met"] and 100 <= r["latency_ms"]["total"] < 2000 for r in rows)


@pytest.fixture(scope="module")
def seeing(tmp_path_factory):
    """A detection adapter whose untrained head fires (vlora_va/testing/messages.py): its rows carry detections,
    so comparing them means something (the plain tiny detector finds nothing, and two empty lists always agree)."""
    return make_seeing_detector(tmp_path_factory.mktemp("seeing") / "detect")


@pytest.mark.parametrize("policy", ["vlora", "edf", "merge-only", "unmerge-only", "dlora"])
def test_every_policy_serves_each_request_with_its_own_adapter(tmp_path, tiny_backbone_dir, tiny_adapters, seeing,
                                                               policy):
    """Distinguishable adapters, interleaved and skewed, through each policy (merge-only switches the base
    weights between batches): every row equals that request computed alone with its own adapter, and every
    detection row compared holds detections."""
    adapter_dirs = {"detect": seeing, "actions": tiny_adapters["actions"]}
    cfg = config(tmp_path, tiny_backbone_dir, adapter_dirs, policy=policy, premerge_max_mb=0, max_batch_images=4)
    d = RunningDaemon(cfg)
    plan = ["detect", "detect", "actions", "detect", "actions", "detect", "detect", "detect", "actions", "detect"]
    for seq, adapter in enumerate(plan):
        d.send(chunk_parts("cam", seq, [("t", adapter)], n_frames=2, frames_seed=7))  # identical frames
    rows = {r["chunk"]: r for r in d.finish()}
    assert all(r["status"] == "ok" for r in rows.values())
    # The reference: a fresh engine, each adapter alone, unmerged.
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in adapter_dirs.items()}
    ref = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE)
    from vlora_va.contracts.wire import decode_chunk

    for seq, adapter in enumerate(plan):
        parts = chunk_parts("cam", seq, [("t", adapter)], n_frames=2, frames_seed=7)
        req = decode_chunk([bytes(memoryview(p)) for p in parts]).requests(time.time())[0]
        want = ref.execute(make_plan([req], LoRAMode(UNMERGED), ref.catalog()))[0].to_json()
        got = rows[seq]
        if adapter == "detect":  # a comparison of two empty lists would pass whatever adapter served the row
            assert all(f["detections"] for f in got["frames"]), (seq, got["mode"], got["frames"])
        problem = payload_difference(got, want)
        assert problem is None, f"chunk {seq} ({adapter}, mode {got['mode']}): {problem}"
    if policy == "merge-only":
        assert d.daemon.totals.switches >= 2  # it did switch between the adapters under load


@pytest.mark.parametrize("policy, premerge_mb", [("vlora", 1024), ("vlora", 0), ("dlora", 0)])
def test_no_plan_key_runs_for_the_first_time_after_ready(tmp_path, tiny_backbone_dir, tiny_adapters, policy,
                                                          premerge_mb):
    """Ready means warm: every plan key the daemon runs while serving already ran in its warm-up, before it said
    ready, so no request pays a first call's costs (allocations, kernel choice; on a GPU, a compile). The load
    mixes the adapters and batch sizes; without premerged weights vlora serves it in several LoRA modes."""
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters, policy=policy, premerge_max_mb=premerge_mb,
                 max_batch_images=4)
    d = RunningDaemon(cfg)
    ready_at = time.monotonic()  # nothing was sent before: nothing the engine ran since ready is before this
    seq = 0
    for burst in (["detect"], ["detect", "actions"], ["actions"] * 3, ["detect"] * 4, ["detect", "actions"] * 2):
        for adapter in burst:  # a burst lands in one queue: batches of its size and mix
            d.send(chunk_parts("cam", seq, [("t", adapter)], n_frames=1))
            seq += 1
        wait_answered(d, seq)  # the next burst is batched on its own
    rows = d.finish()
    assert len(rows) == seq and all(r["status"] == "ok" for r in rows)
    first_runs = d.daemon.engine.first_runs
    late = {k: round(t - ready_at, 3) for k, t in first_runs.items() if t > ready_at}
    assert not late, f"plan keys run for the first time after ready (s after): {late}"
    if policy == "vlora":  # it may serve in every mode it has, so it warms every one
        modes = {"unmerged", "merged", "mixture"} | ({"premerged"} if premerge_mb else set())
        assert {(k.size, k.mode) for k in d.daemon.warmed} == {(TINY_IMAGE, m) for m in modes}
    if policy == "vlora" and not premerge_mb:  # this load ran more than one mode after ready
        assert len({r["mode"].split(":")[0] for r in rows}) >= 2, {r["mode"] for r in rows}


def wait_answered(d: RunningDaemon, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while d.daemon.totals.answered < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert d.daemon.totals.answered >= n, f"{d.daemon.totals.answered} of {n} requests answered"


def test_log_and_gauges_keep_moving_under_sustained_load(tmp_path, tiny_backbone_dir, tiny_adapters, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters, metrics_port=port, log_every_s=0.3, max_batch_images=2)
    caplog.set_level(logging.INFO, logger="vlora_va.serving")
    d = RunningDaemon(cfg)
    scrapes = []
    t_end = time.monotonic() + 4.0
    next_scrape = time.monotonic() + 0.5
    seq = 0
    while time.monotonic() < t_end:  # always more queued than one batch: the daemon never idles
        for _ in range(4):
            d.send(chunk_parts("cam", seq, [("det", "detect"), ("act", "actions")], n_frames=2))
            seq += 1
        if time.monotonic() >= next_scrape:
            scrapes.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
            next_scrape += 0.5
        time.sleep(0.02)
    d.finish()
    progress = [r.getMessage() for r in caplog.records if "chunks/s" in r.getMessage()]
    assert len(progress) >= 5  # ~every 0.3 s over 4 s of load
    # each line says where the loop's time went (shares of 100) and what its batches were: under this load the
    # engine has the loop most of the time, and no batch is larger than max_batch_images
    loaded = []
    for line in progress:
        shares = dict((k, int(v)) for k, v in re.findall(r"(engine|intake|planning|rows|waiting) (\d+)%", line))
        assert set(shares) == {"engine", "intake", "planning", "rows", "waiting"}, line
        assert 97 <= sum(shares.values()) <= 103, line  # rounded shares of one whole
        n, images, ms = re.search(r"(\d+) batches of ([\d.]+) images in ([\d.]+) ms", line).groups()
        assert float(images) <= 2
        if int(n):
            loaded.append((shares["engine"], float(ms)))
    assert len(loaded) >= 4 and max(e for e, _ in loaded) >= 50 and all(ms > 0 for _, ms in loaded), progress
    batches = [sum(float(v) for v in re.findall(r"^vlora_batches_total\{mode=\"[^\"]+\"\} (\S+)", text, re.M))
               for text in scrapes]
    assert len(batches) >= 3 and batches == sorted(batches) and batches[-1] > batches[0]
    assert all(len(re.findall(r'^vlora_lora_mode\{mode="[^"]+"\} 1\.0', t, re.M)) == 1 for t in scrapes[1:])
    assert all("vlora_queue_images" in t and "vlora_cost_correction" in t for t in scrapes)


def test_prometheus_metrics_count_what_happened(tmp_path, tiny_backbone_dir, tiny_adapters):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, tiny_adapters, metrics_port=port))
    d.send(chunk_parts("cam", 0, [("det", "detect")]))
    d.send([b"garbage"])
    d.send(chunk_parts("cam", 1, [("det", "detect")], deadline_s=1.0, ready_ago_s=3.0))
    deadline = time.monotonic() + 30
    while d.daemon.totals.answered < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    d.finish()
    assert 'vlora_chunks_received_total{stream="cam"} 2.0' in text
    assert "vlora_messages_malformed_total 1.0" in text
    assert 'vlora_results_total{status="ok",stream="cam",task="det"} 1.0' in text
    assert 'vlora_results_total{status="shed",stream="cam",task="det"} 1.0' in text
    assert 'vlora_requests_shed_total{cause="deadline",stream="cam",task="det"} 1.0' in text


def test_log_throttle_says_the_first_lines_then_how_many_more():
    from vlora_va.common.logs import Throttle

    lines = []

    class Sink:
        def error(self, msg, *args):
            lines.append(msg % args)

    t = Throttle(Sink(), "malformed messages", burst=3, period_s=10)
    for i in range(50):
        t.error(100.0 + i * 0.1, "bad %d", i)  # 50 in 5 s
    t.error(111.0, "bad %d", 99)  # the next period: the count of the suppressed ones, then this one
    assert lines == ["bad 0", "bad 1", "bad 2", "... and 47 more malformed messages in the last 10 s", "bad 99"]


def test_the_daemon_caps_its_batches_where_the_profile_says_images_cost_least(tmp_path, tiny_backbone_dir,
                                                                               tiny_adapters, caplog):
    """A CPU profile whose largest batch costs more per image than 4: the scheduler's batches stop at 4 (and say
    why); a profile without that rise leaves max_batch_images alone."""
    from vlora_va.serving.costs import CostModel, CostProfile

    cfg = config(tmp_path, tiny_backbone_dir, tiny_adapters, max_batch_images=8)
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, max_batch_images=8)

    def profile(points):
        return CostModel(CostProfile(key={}, base={TINY_IMAGE: points}, factors={"merged": {1: 1.0}}, switch_s=0.0))

    with caplog.at_level(logging.INFO, logger="vlora_va"):
        capped = Daemon(cfg, engine, profile([(1, 0.010), (4, 0.030), (8, 0.072)]))
    assert capped.scheduler.settings.max_batch_images == 4
    assert any("batches of at most 4 images" in r.getMessage() for r in caplog.records)
    assert Daemon(cfg, engine, profile([(1, 0.010), (4, 0.030), (8, 0.058)])).scheduler.settings.max_batch_images == 8
    # the start-up estimate counts the batches the daemon will run: 8 images/s as two batches of 4, not one of 8
    cfg8 = parse_config(cfg_text(tmp_path, tiny_backbone_dir, tiny_adapters).replace(
        "    tasks:", "    fps: 8\n    tasks:").replace("      - adapter: detect", "      - adapter: detect\n"
                                                       "        frames_per_chunk: 8"), "p.yaml", tmp_path)
    steep = profile([(1, 0.010), (4, 0.030), (8, 0.072)])
    assert Daemon(cfg8, engine, steep).estimate.need_s == pytest.approx(2 * 0.030)
