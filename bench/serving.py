"""The serving benchmark (issue 11): replayed workloads through the real daemon, every scheduling policy.

    python bench/serving.py                  # the default grid (~40 min on 2 cores)
    python bench/serving.py --quick          # a smoke run (~5 min)

Each point starts `vlora-va daemon` as its own process with one policy, replays a workload into it over
real ZeroMQ (synthetic frames, one frame and one task per chunk, each chunk's adapter drawn by the skew),
then reads the rows from its JSON Lines sink and the mode switches from its Prometheus endpoint.
Offered load is set relative to the capacity this machine measured (the daemon's cost profile: images per
second in merged mode, the cheapest there is). Backbones: the real DINOv2-S (ViT-S/14) and a random-weight
ViT-B-sized DINOv2 whose per-slot premerged weights do not fit daemon.premerge_max_mb (so switching modes can
pay). Adapters: random LoRA (ranks 8-64) on every linear layer, untrained detection heads.

Reported per point: served-in-deadline images/s, mean and p99 latency of served rows, miss rate (served
late), shed rate, mode switches, and streams held (>= 99% of their chunks answered in deadline). Points are
run in rounds, policies shuffled inside a round, so slow spells of this shared machine hit every policy
alike; the table gives medians over rounds and each policy's ratio to the best baseline at the same point.
Writes bench/results/serving.{json,md,png}.

On a GPU (`--device cuda --max-batch 64 --backbones vit-l`; bench/gpu_policies.py drives the policy points):
capacity is higher and the generator sends one message at a time from Python, so its own ceiling (chunks/s it can
send with no pacing) is measured and each point says whether it was `generator_limited`, with the rate it
achieved. `--senders K` splits the schedule by stream across K processes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import queue
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.contracts.config import DaemonConfig  # noqa: E402
from vlora_va.contracts.geometry import Letterbox  # noqa: E402
from vlora_va.contracts.results import is_result  # noqa: E402
from vlora_va.contracts.wire import ChunkHeader, TaskRequest, encode_chunk  # noqa: E402
from vlora_va.testing.harness import Child, free_port, stop_all, wait_daemon_ready  # noqa: E402

POLICIES = ["vlora", "edf", "merge-only", "unmerge-only", "dlora"]
BASELINES = [p for p in POLICIES if p != "vlora"]
RANKS = [8, 16, 32, 64]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]
WARMUP_S = 3.0  # rows of chunks sent in the first seconds are not counted (queues and windows settle)
# The daemon's own default (premerge_max_mb left out of the config): per-slot premerged weights larger than this
# are not kept, so only unmerged, merged and mixture modes serve.
DEFAULT_PREMERGE_MB = DaemonConfig.premerge_max_mb
CEILING_S = 2.0  # how long the generator's ceiling is measured
GENERATOR_HEADROOM = 0.8  # a point needing more than this share of the generator's ceiling is generator-limited
SEND_HWM = 64
DAEMON_READY_S = 600.0  # it builds its engine and measures (or loads) its cost profile first
DAEMON_STOP_S = 300.0


@dataclass(frozen=True)
class Backbone:
    name: str
    hidden: int
    layers: int
    heads: int
    image_size: int
    # Each request's deadline: a few times a full batch (on 2 CPU cores: vit-s ~0.7 s per 16 images, vit-b
    # ~2.4 s); --deadline-ms overrides it.
    deadline_ms: float


BACKBONES = {
    "vit-s": Backbone("vit-s", 384, 12, 6, 224, 2000.0),  # the real default backbone, dinov2-small
    "vit-b": Backbone("vit-b", 768, 12, 12, 224, 3000.0),  # random weights, ViT-B sized
    # Random weights, for a GPU: more compute per frame sent (the generator's bytes per frame stay those of 224 px),
    # so 3x capacity stays within what one Python sender can offer. Deadlines: a few 64-image batches on an
    # H100/H200 in bf16 (estimated); bench/gpu_policies.py sets them from the measured profile instead.
    "vit-l": Backbone("vit-l", 1024, 24, 16, 224, 150.0),
    "vit-h": Backbone("vit-h", 1280, 32, 16, 224, 300.0),
    # At 448 px (1,025 tokens) a frame costs ~4.5x its 224-px price, so the GPU rather than the daemon's per-chunk
    # host work limits serving at 3x load (vit-l at 224 px ran 2,114 images/s on an H200: host-bound there).
    "vit-l-448": Backbone("vit-l-448", 1024, 24, 16, 448, 1000.0),
    "vit-h-448": Backbone("vit-h-448", 1280, 32, 16, 448, 1000.0),
    "tiny": Backbone("tiny", 64, 2, 2, 56, 1000.0),  # smoke tests of the bench itself
}


@dataclass(frozen=True)
class Workload:
    streams: int
    adapters: int
    skew: float  # share of chunks for adapter 0 (the rest spread evenly); 1/adapters = uniform
    load: float  # offered images/s as a multiple of the measured capacity

    @property
    def label(self) -> str:
        skew = "uniform" if abs(self.skew - 1 / self.adapters) < 1e-6 else f"{self.skew:.0%} one"
        return f"{self.streams} streams, {self.adapters} adapters, {skew}, {self.load:g}x"


# ---------------------------------------------------------------- set-up: backbones, adapters, configs
def build_backbone(b: Backbone, work: Path) -> str:
    if b.name == "vit-s":
        from vlora_va.engine.backbones import DEFAULT_BACKBONE, cache_dir, fetched_ok
        if not fetched_ok(cache_dir() / DEFAULT_BACKBONE):
            raise SystemExit("the default backbone is not fetched: run `vlora-va models fetch`")
        return DEFAULT_BACKBONE
    import torch
    from transformers import Dinov2Config, Dinov2Model

    path = work / b.name
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        cfg = Dinov2Config(hidden_size=b.hidden, num_hidden_layers=b.layers, num_attention_heads=b.heads,
                           intermediate_size=4 * b.hidden, patch_size=14, image_size=518, layerscale_value=1.0)
        Dinov2Model(cfg).save_pretrained(path, safe_serialization=True)
    return str(path)


def build_adapters(b: Backbone, backbone_id: str, n: int, work: Path) -> dict[str, str]:
    """n adapters with random LoRA (rank RANKS[i % 4]) on every linear layer, untrained detection heads."""
    import torch

    from vlora_va.engine.adapters import fit_target_modules, init_untrained, load_adapter_dir, save_adapter_dir
    from vlora_va.engine.backbones import linear_names, load_backbone

    model = load_backbone(backbone_id)
    here = fit_target_modules(TARGETS, linear_names(model))  # the installed transformers' layer names
    names = [m for m in linear_names(model) if any(m == t or m.endswith("." + t) for t in here)]
    shapes = {m: tuple(model.get_submodule(m).weight.shape) for m in names}
    out = {}
    for i in range(n):
        path = work / f"{b.name}-adapter{i}"
        rank = RANKS[i % len(RANKS)]
        if not (path / "head.safetensors").exists():
            init_untrained(path, task="detection", names=["person"], base_model=backbone_id, hidden=b.hidden,
                           target_modules=TARGETS, module_shapes=shapes, rank=rank, alpha=rank,
                           image_size=b.image_size, seed=i)
            a = load_adapter_dir("x", path, b.hidden)
            g = torch.Generator().manual_seed(100 + i)
            lora = {m: (A, torch.randn(B.shape, generator=g) * 0.01) for m, (A, B) in a.lora.items()}
            save_adapter_dir(path, lora=lora, rank=rank, alpha=rank, target_modules=TARGETS, base_model=backbone_id,
                             head=a.head, head_config={k: v for k, v in a.head_config.items()
                                                       if k not in ("format", "version")})
        out[f"a{i}"] = str(path)
    return out


def write_config(path: Path, b: Backbone, backbone_id: str, adapters: dict[str, str], policy: str,
                 results: Path, endpoint: str, metrics_port: int, threads: int, device: str = "cpu",
                 premerge_max_mb: int | None = None, max_batch_images: int = 16, profile_cache: str = "") -> None:
    """premerge_max_mb None: left out (the daemon's default, DEFAULT_PREMERGE_MB). profile_cache "": the
    daemon's default ($VLORA_VA_PROFILES or ~/.cache/vlora-va/profiles)."""
    daemon = {"endpoint": endpoint, "backbone": backbone_id, "image_size": b.image_size, "device": device,
              "threads": threads, "max_batch_images": max_batch_images, "policy": policy,
              "metrics_port": metrics_port, "log_every_s": 5, "max_slots": 8}
    if premerge_max_mb is not None:
        daemon["premerge_max_mb"] = premerge_max_mb
    if profile_cache:
        daemon["profile_cache"] = profile_cache
    cfg = {
        "version": 1,
        "daemon": daemon,
        "adapters": adapters,
        # The daemon needs a stream to say its capacity estimate; the bench sends the chunks itself.
        "streams": [{"id": "bench", "source": "unused.mp4", "fps": 1,
                     "tasks": [{"adapter": next(iter(adapters)), "deadline_ms": b.deadline_ms}]}],
        "sinks": [{"type": "jsonl", "path": str(results)}],
    }
    path.write_text(json.dumps(cfg))


def profile_base(log_text: str, image_size: int) -> list[tuple[int, float]]:
    """(images, seconds) per measured batch in merged mode at image_size, from the cost profile the daemon used."""
    m = re.search(r"cost profile (?:from|cached in) (\S+\.json)", log_text)
    if m is None:
        raise RuntimeError("the daemon did not say where its cost profile is")
    return [tuple(p) for p in json.loads(Path(m.group(1).rstrip(")")).read_text())["base"][str(image_size)]]


def profile_capacity(log_text: str, image_size: int, device: str = "cpu") -> float:
    """Images per second in merged mode at image_size, from the cost profile the daemon used."""
    points = profile_base(log_text, image_size)
    if device == "cuda":
        # On CUDA the profile has one point per batch bucket (1, 2, 4, ... max_batch_images) and time is far from
        # linear in images: small batches leave the GPU idle and pay a fixed launch cost, so the slope between the
        # smallest and the largest batch overstates what it serves. Under overload the daemon runs full batches:
        # the images/s of the largest batch is its capacity.
        n, t = points[-1]
        return n / t
    # A CPU's time is close to linear in images (two points, 1 and 4): the slope is the per-image cost. A tiny
    # model timed while other work shares the cores can make it zero or negative: then the largest batch's average.
    (n0, t0), (n1, t1) = points[0], points[-1]
    per_image = (t1 - t0) / (n1 - n0) if n1 > n0 else t1 / n1
    return 1.0 / (per_image if per_image > 0 else t1 / n1)


def premerge_state(log_text: str) -> tuple[bool | None, float | None]:
    """(whether the daemon kept premerged weights, the MB they take or would take), from its log."""
    m = re.search(r"LoRA: (no )?premerged weights (?:for \d+ slot\(s\), |\(they would take )(\d+) MB", log_text)
    return (None, None) if m is None else (m.group(1) is None, float(m.group(2)))


def switches(metrics_port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    m = re.search(r"^vlora_mode_switches_total (\S+)", text, re.M)
    return int(float(m.group(1))) if m else 0


# ---------------------------------------------------------------- load generation
def schedule(w: Workload, capacity: float, duration: float, seed: int) -> list[tuple[float, int, int, int]]:
    """(send time, stream, seq, adapter index) for every chunk: one image each, streams evenly interleaved,
    adapters drawn by the skew from a seeded generator (the same sequence for every policy)."""
    rate = w.load * capacity  # chunks (= images) per second, all streams together
    rnd = random.Random(seed)
    weights = [w.skew] + [(1 - w.skew) / (w.adapters - 1)] * (w.adapters - 1)
    out, seqs = [], [0] * w.streams
    n = int(rate * duration)
    for i in range(n):
        stream = i % w.streams
        adapter = rnd.choices(range(w.adapters), weights)[0]
        out.append((i / rate, stream, seqs[stream], adapter))
        seqs[stream] += 1
    return out


def make_frames(side: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, (side, side, 3), dtype=np.uint8) for _ in range(8)]


def send_chunks(sock, chunks, frames: list[np.ndarray], b: Backbone, deadline_ms: float, start: float,
                block: bool = False, until: float | None = None) -> tuple[int, int, float]:
    """Send (time, stream, seq, adapter) chunks at start + time, like live cameras (ready = the send time), one
    message each. block False: a chunk the daemon's socket cannot take is not sent (an ingest worker's drop
    policy would drop it). until: stop at this wall time. Returns (sent, not sent, wall time of the last send)."""
    side = b.image_size
    lb = Letterbox(1.0, 0.0, 0.0)
    flags = 0 if block else zmq.NOBLOCK
    sent = dropped = 0
    for t, stream, seq, adapter in chunks:
        wait = start + t - time.time()
        if wait > 0:
            time.sleep(wait)
        now = time.time()
        if until is not None and now >= until:
            break
        header = ChunkHeader(stream=f"s{stream}", seq=seq, fps=1.0, frame_ts=(float(seq),), frame_shape=(side, side, 3),
                             orig_size=(side, side), letterbox=lb,
                             tasks=(TaskRequest("detect", f"a{adapter}", (0,), deadline_ms),), ready_wall=now,
                             sent_wall=now)
        try:
            sock.send_multipart(encode_chunk(header, [frames[seq % len(frames)]]), flags=flags, copy=False)
            sent += 1
        except zmq.Again:
            dropped += 1
    return sent, dropped, time.time()


def unpaced(streams: int = 4, adapters: int = 4):
    """Chunks all due at once, streams interleaved: what the generator's ceiling is measured with."""
    return ((0.0, i % streams, i // streams, i % adapters) for i in itertools.count())


def _push(ctx, endpoint: str, block: bool):
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, SEND_HWM)
    if block:
        sock.setsockopt(zmq.SNDTIMEO, 2000)  # a receiver that stopped reading ends the measurement, not the bench
    sock.connect(endpoint)
    return sock


def _sender(endpoint: str, plan: list | None, b: Backbone, deadline_ms: float, frame_seed: int, block: bool,
            seconds: float | None, ready, go, start_at, results) -> None:
    """One sender process (--senders K): connect, say ready, send its share of the plan from the common start."""
    ctx = zmq.Context()
    sock = _push(ctx, endpoint, block)
    frames = make_frames(b.image_size, frame_seed)
    ready.put(os.getpid())
    go.wait()
    start = start_at.value
    chunks = unpaced() if plan is None else plan
    sent, dropped, end = send_chunks(sock, chunks, frames, b, deadline_ms, start, block,
                                     start + seconds if seconds else None)
    time.sleep(1.0)  # stay connected while the daemon reads the last chunks
    sock.close(linger=5000)
    ctx.term()
    results.put((sent, dropped, end))


def run_senders(endpoint: str, plans: list[list | None], b: Backbone, deadline_ms: float, frame_seed: int,
                block: bool = False, seconds: float | None = None) -> dict:
    """Send each plan from its own process (spawned; each its own PUSH socket), all from one start time.
    A plan None sends unpaced chunks for `seconds`. Returns {sent, dropped, wall_s} over all senders."""
    mp = multiprocessing.get_context("spawn")
    ready, results, go, start_at = mp.Queue(), mp.Queue(), mp.Event(), mp.Value("d", 0.0)
    procs = [mp.Process(target=_sender, args=(endpoint, plan, b, deadline_ms, frame_seed, block, seconds, ready, go,
                                              start_at, results), daemon=True) for plan in plans]
    for p in procs:
        p.start()
    try:
        _gather(ready, procs, len(procs), timeout=120)
        start_at.value = time.time() + 0.5
        go.set()
        longest = max((plan[-1][0] for plan in plans if plan), default=0.0) + (seconds or 0.0)
        out = _gather(results, procs, len(procs), timeout=longest + 60 + 30 * len(procs))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return {"sent": sum(o[0] for o in out), "dropped": sum(o[1] for o in out),
            "wall_s": max(o[2] for o in out) - start_at.value}


def _gather(q, procs, n: int, timeout: float) -> list:
    """n items from q, failing early when a sender process died without putting its own."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n:
        try:
            got.append(q.get(timeout=1.0))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"sender process exited {dead[0].exitcode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"senders: {len(got)} of {n} answered in {timeout:.0f} s") from None
    return got


def replay(endpoint: str, plan: list, frames: list[np.ndarray], b: Backbone, deadline_ms: float | None = None,
           senders: int = 1, frame_seed: int = 0) -> dict:
    """Send the chunks on time, like live cameras. Returns {sent, dropped (not sent because the daemon's socket
    was full: an ingest worker's drop policy would drop them), wall_s (from the first planned send to the last
    send)}. senders > 1: the plan split by stream across that many processes (frames made from frame_seed)."""
    deadline_ms = b.deadline_ms if deadline_ms is None else deadline_ms
    if senders > 1:
        return run_senders(endpoint, [[c for c in plan if c[1] % senders == k] for k in range(senders)], b,
                           deadline_ms, frame_seed)
    ctx = zmq.Context()
    sock = _push(ctx, endpoint, block=False)
    start = time.time() + 0.5
    sent, dropped, end = send_chunks(sock, plan, frames, b, deadline_ms, start)
    time.sleep(1.0)  # stay connected while the daemon reads the last chunks
    sock.close(linger=5000)
    ctx.term()
    return {"sent": sent, "dropped": dropped, "wall_s": end - start}


def generator_ceiling(b: Backbone, senders: int = 1, seconds: float = CEILING_S, seed: int = 0) -> dict:
    """Chunks per second the generator sends with no pacing (the same encode and send path as replay, frames of
    b's size) into a PULL socket that a thread drains as fast as it can. Sends block when the receiver lags, so
    every chunk counted was delivered: what a daemon reading as fast as this could be offered."""
    work = Path(tempfile.mkdtemp(prefix="vlora-ceiling-"))
    endpoint = f"ipc://{work}/pull.sock"
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVTIMEO, 100)
    pull.bind(endpoint)
    stop, drained = threading.Event(), [0]

    def drain():
        while not stop.is_set():
            try:
                pull.recv_multipart(copy=False)
                drained[0] += 1
            except zmq.Again:
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if senders > 1:
            r = run_senders(endpoint, [None] * senders, b, b.deadline_ms, seed, block=True, seconds=seconds)
        else:
            sock = _push(ctx, endpoint, block=True)
            start = time.time()
            sent, dropped, end = send_chunks(sock, unpaced(), make_frames(b.image_size, seed), b, b.deadline_ms,
                                             start, block=True, until=start + seconds)
            sock.close(linger=1000)
            r = {"sent": sent, "dropped": dropped, "wall_s": end - start}
    finally:
        stop.set()
        reader.join(5)
        ctx.destroy(linger=0)
        shutil.rmtree(work, ignore_errors=True)
    return {"generator_ceiling_per_s": r["sent"] / r["wall_s"], "senders": senders, "seconds": round(r["wall_s"], 2),
            "frame_bytes": b.image_size ** 2 * 3}


def analyse(rows: list[dict], offered: int, duration: float, n_switches: int) -> dict:
    """Figures over the counted rows (the chunks sent after the warm-up). A chunk the daemon's socket could
    not take (as an ingest drop policy would drop it) has no row and counts as not answered."""
    ok = [r for r in rows if r["status"] == "ok"]
    in_deadline = [r for r in ok if r["deadline_met"]]
    lat = sorted(r["latency_ms"]["total"] for r in ok)
    streams: dict[str, list[bool]] = {}
    for r in rows:
        streams.setdefault(r["stream"], []).append(r["status"] == "ok" and r["deadline_met"])
    total = max(1, offered)
    return {
        "offered": offered, "not_answered": offered - len(rows),
        "in_deadline_per_s": len(in_deadline) / duration,
        "mean_latency_ms": statistics.fmean(lat) if lat else None,
        "p99_latency_ms": lat[int(0.99 * (len(lat) - 1))] if lat else None,
        "miss_rate": (len(ok) - len(in_deadline)) / total,
        "shed_rate": sum(r["status"] == "shed" for r in rows) / total,
        "switches": n_switches, "streams": len(streams),
        "streams_held": sum(sum(v) >= 0.99 * len(v) for v in streams.values()),
    }


def shed_reasons(rows: list[dict]) -> dict[str, int]:
    """Shed rows counted by the kind of reason (numbers taken out: "needs ~N ms, M ms left" is one kind)."""
    kinds: dict[str, int] = {}
    for r in rows:
        if r["status"] == "shed":
            kind = re.sub(r"[0-9.]+", "N", r.get("reason") or "?")[:80]
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def run_point(b: Backbone, backbone_id: str, adapters: dict, policy: str, w: Workload, duration: float,
              work: Path, threads: int, seed: int, capacity: float | None, keep: bool = False,
              device: str = "cpu", premerge_max_mb: int | None = None, max_batch_images: int = 16,
              deadline_ms: float | None = None, deadline_batches: float = 0.0, ceiling: float | None = None,
              senders: int = 1, profile_cache: str = "") -> tuple[dict, float]:
    """One daemon, one policy, one workload. capacity None: read from the daemon's cost profile (returned, so the
    next points offer the same load). Each request's deadline: deadline_batches > 0: that many times a full merged
    batch (max_batch_images at that capacity); else deadline_ms, else b's. ceiling: the generator's
    (generator_ceiling); a point needing more than GENERATOR_HEADROOM of it, or sending clearly below its plan,
    says generator_limited."""
    point = work / f"{b.name}-{policy}-{abs(hash((w, seed, premerge_max_mb))) % 10**8}"
    point.mkdir(parents=True, exist_ok=True)
    results = point / "results.jsonl"
    endpoint = f"ipc://{point}/daemon.sock"
    port = free_port()
    cfg = point / "pipeline.json"
    write_config(cfg, b, backbone_id, {k: adapters[k] for k in list(adapters)[:w.adapters]}, policy, results,
                 endpoint, port, threads, device, premerge_max_mb, max_batch_images, profile_cache)
    daemon = Child(["daemon", str(cfg)], point / "daemon.log")
    try:
        wait_daemon_ready(daemon, DAEMON_READY_S)
        log_text = daemon.text()
        capacity = capacity or profile_capacity(log_text, b.image_size, device)
        batch_s = max_batch_images / capacity  # a full batch in merged mode (on CUDA: the profile's largest)
        if deadline_batches > 0:
            deadline_ms = deadline_batches * batch_s * 1000
        deadline_ms = b.deadline_ms if deadline_ms is None else deadline_ms
        plan = schedule(w, capacity, WARMUP_S + duration, seed)
        sent = replay(endpoint, plan, make_frames(b.image_size, seed), b, deadline_ms, senders, frame_seed=seed)
        n_switches = switches(port)
    finally:
        stop_all([daemon], DAEMON_STOP_S)
        log_text = daemon.text()
    rows = [r for line in results.read_text().splitlines() if is_result(r := json.loads(line))] \
        if results.exists() else []
    counted_after = {(f"s{stream}", seq) for t, stream, seq, _ in plan if t >= WARMUP_S}
    counted = [r for r in rows if (r["stream"], r["chunk"]) in counted_after]
    figures = analyse(counted, len(counted_after), duration, n_switches)
    figures.update(generator_figures(plan, sent, w.load * capacity, ceiling))
    premerged, premerge_mb = premerge_state(log_text)
    figures.update(capacity_per_s=capacity, batch_ms=batch_s * 1000, deadline_ms=deadline_ms, premerged=premerged,
                   premerge_mb=premerge_mb, shed_reasons=shed_reasons(counted),
                   # the daemon's own account (status lines: cost correction, overload, queue), for a point whose
                   # figures need explaining after its machine is gone (a GPU's)
                   daemon_log_tail=[ln for ln in log_text.splitlines() if "status" in ln or "overload" in ln][-12:])
    if not keep:
        shutil.rmtree(point, ignore_errors=True)
    return figures, capacity


SUSTAINED_DEADLINE_MS = 60_000.0  # long enough that nothing in the closed loop is shed


def sustained_capacity(b: Backbone, backbone_id: str, adapter: str, duration: float, work: Path, threads: int,
                       device: str = "cpu", premerge_max_mb: int | None = None, max_batch_images: int = 16,
                       profile_cache: str = "") -> dict:
    """Images/s the daemon sustains in merged mode (the cheapest mode there is) with work always waiting: one
    adapter, `merge-only`, and a closed loop that keeps two full batches outstanding (one chunk sent for each row
    read from the sink), deadlines long enough that nothing is shed. Every cost of serving is in it (intake,
    planning, rows, the sink, the generator on the same cores), under the load it serves; the start-up profile
    times the engine alone, the fastest of 3 runs on an idle machine. Rows of the first WARMUP_S are not counted."""
    point = work / f"{b.name}-sustained"
    point.mkdir(parents=True, exist_ok=True)
    results = point / "results.jsonl"
    endpoint, port = f"ipc://{point}/daemon.sock", free_port()
    cfg = point / "pipeline.json"
    write_config(cfg, replace(b, deadline_ms=SUSTAINED_DEADLINE_MS), backbone_id, {"a0": adapter}, "merge-only",
                 results, endpoint, port, threads, device, premerge_max_mb, max_batch_images, profile_cache)
    daemon = Child(["daemon", str(cfg)], point / "daemon.log")
    ctx = zmq.Context()
    try:
        wait_daemon_ready(daemon, DAEMON_READY_S)
        sock = _push(ctx, endpoint, block=True)
        frames = make_frames(b.image_size, 0)
        seq = 0

        def send(n: int) -> None:
            nonlocal seq
            chunks = [(0.0, 0, seq + i, 0) for i in range(n)]
            send_chunks(sock, chunks, frames, b, SUSTAINED_DEADLINE_MS, time.time(), block=True)
            seq += n

        send(2 * max_batch_images)
        start = time.time()
        count_from, end = start + WARMUP_S, start + WARMUP_S + duration
        statuses: dict[str, int] = {}
        offset, pending = 0, b""
        while time.time() < end:
            data = results.read_bytes()[offset:] if results.exists() else b""
            offset += len(data)
            pending += data
            *lines, pending = pending.split(b"\n")
            rows = [r for line in lines if line.strip() and is_result(r := json.loads(line))]
            now = time.time()
            for r in rows:
                if now >= count_from:
                    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
            if rows:
                send(len(rows))
            else:
                time.sleep(0.005)  # polling the sink file: a row appears within one batch
        sock.close(linger=0)
    finally:
        ctx.destroy(linger=0)
        stop_all([daemon], DAEMON_STOP_S)
        shutil.rmtree(point, ignore_errors=True)
    return {"images_per_s": statuses.get("ok", 0) / duration, "rows": statuses, "seconds": duration}


def generator_figures(plan: list, sent: dict, needed: float, ceiling: float | None) -> dict:
    """What the generator offered: achieved = chunks sent per second of the replay; attempted adds those the
    daemon's full socket refused (the generator's own pace). Limited: the plan needs more than GENERATOR_HEADROOM
    of the ceiling, or the generator fell more than 10% behind its plan."""
    wall = max(sent["wall_s"], 1e-9)
    attempted = (sent["sent"] + sent["dropped"]) / wall
    behind = len(plan) > 1 and attempted < 0.9 * needed
    return {"needed_rate_per_s": needed, "achieved_rate_per_s": sent["sent"] / wall,
            "attempted_rate_per_s": attempted, "sent": sent["sent"], "refused_at_send": sent["dropped"],
            "generator_ceiling_per_s": ceiling,
            "generator_limited": bool(behind or (ceiling is not None and needed > GENERATOR_HEADROOM * ceiling))}


# ---------------------------------------------------------------- the grid
def grid(quick: bool, loads: set[float] | None = None) -> dict[str, list[Workload]]:
    """The workloads per backbone; `loads` keeps only those offered at these multiples of capacity."""
    if loads:
        return {b: [w for w in ws if w.load in loads] for b, ws in grid(quick).items()}
    if quick:
        return {"vit-s": [Workload(6, 4, 0.25, 1.0), Workload(6, 4, 0.9, 3.0)],
                "vit-b": [Workload(4, 4, 0.9, 3.0)]}
    vit_s = [Workload(6, 4, skew, load) for skew in (0.25, 0.5, 0.9) for load in (0.5, 1.0, 3.0)]
    vit_s += [Workload(1, 2, 0.5, 1.0), Workload(12, 8, 0.125, 1.0), Workload(12, 8, 0.9, 3.0)]
    vit_b = [Workload(4, 4, skew, load) for skew in (0.25, 0.5, 0.9) for load in (1.0, 3.0)]
    return {"vit-s": vit_s, "vit-b": vit_b}


def _median(key: str, figs: list[dict]):
    """The median of a figure over rounds; a figure that is not a number (shed reasons, log lines, flags): the last
    round's."""
    values = [f[key] for f in figs if f.get(key) is not None]
    if not values:
        return None
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return statistics.median(values)
    return values[-1]


def summarise(points: list[dict], sustained: dict[str, float] | None = None) -> list[dict]:
    """Medians over rounds per (backbone, workload, policy), with ratios to the best baseline, to the start-up
    profile's capacity and to the sustained capacity (median over rounds, per backbone) the bench measured."""
    keyed: dict[tuple, list[dict]] = {}
    for p in points:
        keyed.setdefault((p["backbone"], p["workload"], p["policy"]), []).append(p["figures"])
    rows = []
    for (backbone, workload, policy), figs in keyed.items():
        med = {k: _median(k, figs) for k in figs[0]}
        rows.append({"backbone": backbone, "workload": workload, "policy": policy, "rounds": len(figs), **med})
    for r in rows:
        base = [x for x in rows if x["backbone"] == r["backbone"] and x["workload"] == r["workload"]
                and x["policy"] in BASELINES]
        best = max((x["in_deadline_per_s"] for x in base), default=0.0)
        r["vs_best_baseline"] = r["in_deadline_per_s"] / best if best else None
        unm = next((x for x in base if x["policy"] == "unmerge-only"), None)
        r["vs_unmerge_only"] = r["in_deadline_per_s"] / unm["in_deadline_per_s"] if unm and unm["in_deadline_per_s"] else None
        # Overload efficiency (issue 32): in deadline against merged-mode capacity, the cheapest mode there is
        cap = r.get("capacity_per_s")
        r["vs_capacity"] = r["in_deadline_per_s"] / cap if cap else None
        held = (sustained or {}).get(r["backbone"])
        r["sustained_per_s"] = held
        r["vs_sustained"] = r["in_deadline_per_s"] / held if held else None
    return rows


def markdown(summary: list[dict], meta: dict) -> str:
    lines = [f"# Serving benchmark ({meta['date']})", "",
             f"CPU: {meta['cpu']}, {meta['threads']} daemon threads; torch {meta['torch']}. "
             f"Medians over {meta['rounds']} round(s); load is relative to the capacity each daemon measured "
             f"(merged-mode images/s: " + ", ".join(f"{k} {v:.1f}" for k, v in meta["capacity"].items()) + "). "
             "Sustained: the images/s the daemon served in merged mode with work always waiting, measured by this "
             "run (closed loop, median over rounds): " + (", ".join(f"{k} {statistics.median(v):.1f}"
                                                              for k, v in meta.get("sustained", {}).items()) or "—")
             + ".", "",
             "| backbone | workload | policy | in-deadline img/s | vs capacity | vs sustained | vs best baseline "
             "| vs unmerge-only | mean / p99 latency ms | missed | shed | switches | streams held |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(summary, key=lambda r: (r["backbone"], r["workload"], POLICIES.index(r["policy"]))):
        def f(v, spec=".2f"):
            return "—" if v is None else format(v, spec)
        lines.append(f"| {r['backbone']} | {r['workload']} | {r['policy']} | {f(r['in_deadline_per_s'])} | "
                     f"{f(r.get('vs_capacity'))} | {f(r.get('vs_sustained'))} | {f(r['vs_best_baseline'])} | {f(r['vs_unmerge_only'])} | {f(r['mean_latency_ms'], '.0f')} / "
                     f"{f(r['p99_latency_ms'], '.0f')} | {f(r['miss_rate'], '.1%')} | {f(r['shed_rate'], '.1%')} | "
                     f"{f(r['switches'], '.0f')} | {f(r['streams_held'], '.0f')}/{f(r['streams'], '.0f')} |")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    backbones = sorted({r["backbone"] for r in summary})
    fig, axes = plt.subplots(1, len(backbones), figsize=(7 * len(backbones), 4.5), squeeze=False)
    for ax, backbone in zip(axes[0], backbones):
        mine = [r for r in summary if r["backbone"] == backbone]
        workloads = sorted({r["workload"] for r in mine}, key=lambda w: [r["workload"] for r in mine].index(w))
        width = 0.8 / len(POLICIES)
        for i, policy in enumerate(POLICIES):
            vals = [next((r["in_deadline_per_s"] for r in mine if r["workload"] == w and r["policy"] == policy), 0)
                    for w in workloads]
            ax.bar([j + i * width for j in range(len(workloads))], vals, width, label=policy)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))])
        ax.set_xticklabels([w.replace(" streams", "s").replace(" adapters", "a") for w in workloads], rotation=60,
                           ha="right", fontsize=7)
        ax.set_ylabel("served in deadline, images/s")
        ax.set_title(backbone)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 workloads, 1 round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--loads", default="", help="only workloads offered at these multiples of capacity, e.g. 1,3")
    ap.add_argument("--duration", type=float, default=15.0, help="measured seconds per point (after warm-up)")
    ap.add_argument("--backbones", default="vit-s,vit-b",
                    help=f"of {', '.join(BACKBONES)}; those without a grid of their own run vit-b's workloads")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--premerge-max-mb", type=int, default=None,
                    help=f"daemon.premerge_max_mb (default: left out, the daemon's {DEFAULT_PREMERGE_MB})")
    ap.add_argument("--max-batch", type=int, default=16, help="daemon.max_batch_images (64 fills a GPU)")
    ap.add_argument("--deadline-ms", type=float, default=None,
                    help="every request's deadline (default: the backbone's)")
    ap.add_argument("--senders", type=int, default=1, help="sender processes, the schedule split among them by stream")
    ap.add_argument("--no-sustained", action="store_true",
                    help="skip the sustained-capacity point (a closed loop in merged mode) at the start of each round")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    rounds = 1 if a.quick else a.rounds
    policies = a.policies.split(",")
    work = Path(tempfile.mkdtemp(prefix="vlora-bench-"))
    os.environ.setdefault("VLORA_VA_PROFILES", str(Path.home() / ".cache" / "vlora-va" / "profiles"))
    points, capacity, ceiling, sustained = [], {}, {}, {}
    t_start = time.time()
    workloads_of = grid(a.quick, {float(x) for x in a.loads.split(',') if x})
    try:
        for name in a.backbones.split(","):
            workloads = workloads_of.get(name, workloads_of["vit-b"])
            b = BACKBONES[name] if a.deadline_ms is None else replace(BACKBONES[name], deadline_ms=a.deadline_ms)
            backbone_id = build_backbone(b, work)
            adapters = build_adapters(b, backbone_id, max(w.adapters for w in workloads), work)
            ceiling[name] = generator_ceiling(b, a.senders)["generator_ceiling_per_s"]
            print(f"{name}: the generator sends up to {ceiling[name]:.0f} chunks/s ({a.senders} sender(s))",
                  flush=True)
            for rnd in range(rounds):
                if not a.no_sustained:
                    held = sustained_capacity(b, backbone_id, adapters["a0"], a.duration, work, a.threads, a.device,
                                              a.premerge_max_mb, a.max_batch)
                    sustained.setdefault(name, []).append(held["images_per_s"])
                    print(f"[{time.time() - t_start:5.0f}s] {name} sustained (merged, closed loop): "
                          f"{held['images_per_s']:.2f} img/s, rows {held['rows']}", flush=True)
                for w in workloads:
                    order = policies[:]
                    random.Random(hash((rnd, w))).shuffle(order)
                    for policy in order:
                        figs, cap = run_point(b, backbone_id, adapters, policy, w, a.duration, work, a.threads,
                                              seed=rnd * 1000 + hash(w) % 1000, capacity=capacity.get(name),
                                              device=a.device, premerge_max_mb=a.premerge_max_mb,
                                              max_batch_images=a.max_batch, ceiling=ceiling[name],
                                              senders=a.senders)
                        capacity[name] = cap
                        points.append({"backbone": name, "workload": w.label, "policy": policy, "round": rnd,
                                       "spec": asdict(w), "figures": figs})
                        print(f"[{time.time() - t_start:5.0f}s] {name} {w.label} {policy}: "
                              f"{figs['in_deadline_per_s']:.2f} img/s in deadline, shed {figs['shed_rate']:.0%}, "
                              f"missed {figs['miss_rate']:.1%}, p99 {figs['p99_latency_ms']} ms, "
                              f"{figs['switches']} switches"
                              + (", GENERATOR-LIMITED" if figs["generator_limited"] else ""), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch

    from vlora_va.engine.precision import device_name

    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": device_name(torch.device("cpu")),
            "platform": platform.platform(), "torch": torch.__version__, "threads": a.threads, "rounds": rounds,
            "duration_s": a.duration, "capacity": capacity, "wall_s": round(time.time() - t_start),
            "device": a.device, "premerge_max_mb": a.premerge_max_mb, "default_premerge_max_mb": DEFAULT_PREMERGE_MB,
            "max_batch_images": a.max_batch, "senders": a.senders, "generator_ceiling_per_s": ceiling,
            "sustained": sustained}
    summary = summarise(points, {k: statistics.median(v) for k, v in sustained.items()})
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "serving.json").write_text(json.dumps({"meta": meta, "summary": summary, "points": points}, indent=1))
    (a.out / "serving.md").write_text(markdown(summary, meta))
    plot(summary, a.out / "serving.png")
    print(markdown(summary, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
