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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.contracts.geometry import Letterbox  # noqa: E402
from vlora_va.contracts.results import is_result  # noqa: E402
from vlora_va.contracts.wire import ChunkHeader, TaskRequest, encode_chunk  # noqa: E402

POLICIES = ["vlora", "edf", "merge-only", "unmerge-only", "dlora"]
BASELINES = [p for p in POLICIES if p != "vlora"]
RANKS = [8, 16, 32, 64]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]
WARMUP_S = 3.0  # rows of chunks sent in the first seconds are not counted (queues and windows settle)


@dataclass(frozen=True)
class Backbone:
    name: str
    hidden: int
    layers: int
    heads: int
    image_size: int
    deadline_ms: float


BACKBONES = {
    "vit-s": Backbone("vit-s", 384, 12, 6, 224, 2000.0),  # the real default backbone, dinov2-small
    "vit-b": Backbone("vit-b", 768, 12, 12, 224, 3000.0),  # random weights, ViT-B sized
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, b: Backbone, backbone_id: str, adapters: dict[str, str], policy: str,
                 results: Path, endpoint: str, metrics_port: int, threads: int, device: str = "cpu") -> None:
    cfg = {
        "version": 1,
        "daemon": {"endpoint": endpoint, "backbone": backbone_id, "image_size": b.image_size, "device": device,
                   "threads": threads, "max_batch_images": 16, "policy": policy, "metrics_port": metrics_port,
                   "log_every_s": 5, "max_slots": 8},
        "adapters": adapters,
        # The daemon needs a stream to say its capacity estimate; the bench sends the chunks itself.
        "streams": [{"id": "bench", "source": "unused.mp4", "fps": 1,
                     "tasks": [{"adapter": next(iter(adapters)), "deadline_ms": b.deadline_ms}]}],
        "sinks": [{"type": "jsonl", "path": str(results)}],
    }
    path.write_text(json.dumps(cfg))


# ---------------------------------------------------------------- the daemon process
class DaemonProcess:
    def __init__(self, config: Path, log: Path):
        self.log = log
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "vlora_va.cli", "daemon", str(config)], cwd=ROOT,
                                     stderr=self._log_file, stdout=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text()
            if "daemon ready" in text:
                return text
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError("daemon did not become ready")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log_file.close()
        return self.log.read_text()


def profile_capacity(log_text: str, image_size: int) -> float:
    """Images per second in merged mode at image_size, from the cost profile the daemon used."""
    m = re.search(r"cost profile (?:from|cached in) (\S+\.json)", log_text)
    if m is None:
        raise RuntimeError("the daemon did not say where its cost profile is")
    points = json.loads(Path(m.group(1).rstrip(")")).read_text())["base"][str(image_size)]
    (n0, t0), (n1, t1) = points[0], points[-1]
    per_image = (t1 - t0) / (n1 - n0) if n1 > n0 else t1 / n1
    return 1.0 / per_image


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


def replay(endpoint: str, plan: list, frames: list[np.ndarray], b: Backbone) -> tuple[int, int]:
    """Send the chunks on time, like live cameras (ready = the send time). Returns (sent, not sent because
    the daemon's socket was full: an ingest worker's drop policy would drop them)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 64)
    sock.connect(endpoint)
    side = b.image_size
    lb = Letterbox(1.0, 0.0, 0.0)
    start = time.time() + 0.5
    sent = dropped = 0
    for t, stream, seq, adapter in plan:
        wait = start + t - time.time()
        if wait > 0:
            time.sleep(wait)
        now = time.time()
        header = ChunkHeader(stream=f"s{stream}", seq=seq, fps=1.0, frame_ts=(float(seq),), frame_shape=(side, side, 3),
                             orig_size=(side, side), letterbox=lb,
                             tasks=(TaskRequest("detect", f"a{adapter}", (0,), b.deadline_ms),), ready_wall=now,
                             sent_wall=now)
        try:
            sock.send_multipart(encode_chunk(header, [frames[seq % len(frames)]]), flags=zmq.NOBLOCK, copy=False)
            sent += 1
        except zmq.Again:
            dropped += 1
    time.sleep(1.0)  # stay connected while the daemon reads the last chunks
    sock.close(linger=5000)
    ctx.term()
    return sent, dropped


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


def run_point(b: Backbone, backbone_id: str, adapters: dict, policy: str, w: Workload, duration: float,
              work: Path, threads: int, seed: int, capacity: float | None, keep: bool = False,
              device: str = "cpu") -> tuple[dict, float]:
    point = work / f"{b.name}-{policy}-{abs(hash((w, seed))) % 10**8}"
    point.mkdir(parents=True, exist_ok=True)
    results = point / "results.jsonl"
    endpoint = f"ipc://{point}/daemon.sock"
    port = free_port()
    cfg = point / "pipeline.json"
    write_config(cfg, b, backbone_id, {k: adapters[k] for k in list(adapters)[:w.adapters]}, policy, results,
                 endpoint, port, threads, device)
    daemon = DaemonProcess(cfg, point / "daemon.log")
    try:
        log_text = daemon.wait_ready()
        capacity = capacity or profile_capacity(log_text, b.image_size)
        rng = np.random.default_rng(seed)
        frames = [rng.integers(0, 255, (b.image_size, b.image_size, 3), dtype=np.uint8) for _ in range(8)]
        plan = schedule(w, capacity, WARMUP_S + duration, seed)
        replay(endpoint, plan, frames, b)
        n_switches = switches(port)
    finally:
        daemon.stop()
    rows = [r for line in results.read_text().splitlines() if is_result(r := json.loads(line))] \
        if results.exists() else []
    counted_after = {(f"s{stream}", seq) for t, stream, seq, _ in plan if t >= WARMUP_S}
    counted = [r for r in rows if (r["stream"], r["chunk"]) in counted_after]
    figures = analyse(counted, len(counted_after), duration, n_switches)
    if not keep:
        shutil.rmtree(point, ignore_errors=True)
    return figures, capacity


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


def summarise(points: list[dict]) -> list[dict]:
    """Medians over rounds per (backbone, workload, policy), with ratios to the best baseline."""
    keyed: dict[tuple, list[dict]] = {}
    for p in points:
        keyed.setdefault((p["backbone"], p["workload"], p["policy"]), []).append(p["figures"])
    rows = []
    for (backbone, workload, policy), figs in keyed.items():
        med = {k: statistics.median([f[k] for f in figs if f[k] is not None]) if any(f[k] is not None for f in figs)
               else None for k in figs[0]}
        rows.append({"backbone": backbone, "workload": workload, "policy": policy, "rounds": len(figs), **med})
    for r in rows:
        base = [x for x in rows if x["backbone"] == r["backbone"] and x["workload"] == r["workload"]
                and x["policy"] in BASELINES]
        best = max((x["in_deadline_per_s"] for x in base), default=0.0)
        r["vs_best_baseline"] = r["in_deadline_per_s"] / best if best else None
        unm = next((x for x in base if x["policy"] == "unmerge-only"), None)
        r["vs_unmerge_only"] = r["in_deadline_per_s"] / unm["in_deadline_per_s"] if unm and unm["in_deadline_per_s"] else None
    return rows


def markdown(summary: list[dict], meta: dict) -> str:
    lines = [f"# Serving benchmark ({meta['date']})", "",
             f"CPU: {meta['cpu']}, {meta['threads']} daemon threads; torch {meta['torch']}. "
             f"Medians over {meta['rounds']} round(s); load is relative to the capacity each daemon measured "
             f"(merged-mode images/s: " + ", ".join(f"{k} {v:.1f}" for k, v in meta["capacity"].items()) + ").", "",
             "| backbone | workload | policy | in-deadline img/s | vs best baseline | vs unmerge-only | mean / p99 latency ms "
             "| missed | shed | switches | streams held |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(summary, key=lambda r: (r["backbone"], r["workload"], POLICIES.index(r["policy"]))):
        def f(v, spec=".2f"):
            return "—" if v is None else format(v, spec)
        lines.append(f"| {r['backbone']} | {r['workload']} | {r['policy']} | {f(r['in_deadline_per_s'])} | "
                     f"{f(r['vs_best_baseline'])} | {f(r['vs_unmerge_only'])} | {f(r['mean_latency_ms'], '.0f')} / "
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
    ap.add_argument("--backbones", default="vit-s,vit-b")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    rounds = 1 if a.quick else a.rounds
    policies = a.policies.split(",")
    work = Path(tempfile.mkdtemp(prefix="vlora-bench-"))
    os.environ.setdefault("VLORA_VA_PROFILES", str(Path.home() / ".cache" / "vlora-va" / "profiles"))
    points, capacity = [], {}
    t_start = time.time()
    try:
        for name, workloads in grid(a.quick, {float(x) for x in a.loads.split(',') if x}).items():
            if name not in a.backbones.split(","):
                continue
            b = BACKBONES[name]
            backbone_id = build_backbone(b, work)
            adapters = build_adapters(b, backbone_id, max(w.adapters for w in workloads), work)
            for rnd in range(rounds):
                for w in workloads:
                    order = policies[:]
                    random.Random(hash((rnd, w))).shuffle(order)
                    for policy in order:
                        figs, cap = run_point(b, backbone_id, adapters, policy, w, a.duration, work, a.threads,
                                              seed=rnd * 1000 + hash(w) % 1000, capacity=capacity.get(name))
                        capacity[name] = cap
                        points.append({"backbone": name, "workload": w.label, "policy": policy, "round": rnd,
                                       "spec": asdict(w), "figures": figs})
                        print(f"[{time.time() - t_start:5.0f}s] {name} {w.label} {policy}: "
                              f"{figs['in_deadline_per_s']:.2f} img/s in deadline, shed {figs['shed_rate']:.0%}, "
                              f"missed {figs['miss_rate']:.1%}, p99 {figs['p99_latency_ms']} ms, "
                              f"{figs['switches']} switches", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch

    from vlora_va.engine.precision import device_name

    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": device_name(torch.device("cpu")),
            "platform": platform.platform(), "torch": torch.__version__, "threads": a.threads, "rounds": rounds,
            "duration_s": a.duration, "capacity": capacity, "wall_s": round(time.time() - t_start)}
    summary = summarise(points)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "serving.json").write_text(json.dumps({"meta": meta, "summary": summary, "points": points}, indent=1))
    (a.out / "serving.md").write_text(markdown(summary, meta))
    plot(summary, a.out / "serving.png")
    print(markdown(summary, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
