"""Stream placement in cluster mode (issue 30), simulated: adapter affinity vs round robin vs least loaded.

The scenario of the issue: 1,000 streams over 50 adapters with Zipf skew (s = 1.0: adapter k of 1..50 gets a share
proportional to 1/k), 100 daemons with 8 adapter slots each, offered load fixed at 80% of the total capacity. One
adapter per stream; each stream is a detect stream sending 2, 4 or 8 frames per 1-s chunk (equally likely), with
priority 0, 1 or 2 (equally likely). A stream's load is its seconds of compute per second of video from the
MEASURED cost model: the newest cached cost profile (serving/profiling.py, ~/.cache/vlora-va/profiles) gives one
chunk's forward at the detect adapter's image size (336), one adapter, merged; without a cached profile, the
images/s of bench/results/serving.json (vit-s) is used as a flat per-image cost. The output says which. Only the
ratios between the streams' loads matter: each daemon's capacity is then set so the total load is 80% of the
total capacity.

Per seed (the medians over seeds are reported), for each policy of vlora_va.cluster.placement.place:
    decision time     place() wall time / streams (µs)
    max/mean load     the most loaded daemon over the mean (the daemon whose deadlines slip first)
    adapters/daemon   distinct adapters per daemon (mean, max); adapter loads = their sum over daemons (each is a
                      slot filled, an adapter's weights loaded); daemons over their 8 slots
    switches/s        a simple model of mode switches: each second a daemon runs one batch per adapter of that
                      second's images (split at 16 images, max_batch_images), round robin over its adapters, the
                      sequence repeating every second; each change of adapter between consecutive batches is a
                      switch (one adapter: none). Summed over daemons.
Then, from the affinity placement: one daemon lost (replace_lost: moves, time, max/mean after) and one daemon
joining (fill_joined: moves, the newcomer's load over the mean and its adapters, max/mean after).
Goals: affinity needs >= 2x fewer adapter loads than round robin, and max/mean <= 1.1.

    python bench/placement.py [--streams 1000] [--adapters 50] [--daemons 100] [--seeds 5] [--profile PATH]

Writes bench/results/placement.json, placement.md and (with matplotlib) placement.png.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.cluster import placement as pl  # noqa: E402
from vlora_va.cluster.placement import DaemonLoad, StreamLoad  # noqa: E402
from vlora_va.testing.host import cpu_name  # noqa: E402

OUT = ROOT / "bench" / "results"
FRAMES = (2, 4, 8)  # frames per 1-s chunk of the three stream kinds
DETECT_SIZE = 336  # the detect adapter's image size
MAX_BATCH = 16  # max_batch_images: a batch holds at most this many images
GOAL_ADAPTER_LOADS = 2.0  # round robin's adapter loads / affinity's
GOAL_MAX_MEAN = 1.1


# ---------------------------------------------------------------- the measured cost of a stream
def stream_costs(profile: str = "") -> tuple[dict[int, float], str]:
    """Seconds of compute per 1-s chunk of n frames, for n in FRAMES, and where the figure comes from."""
    from vlora_va.engine.modes import PREMERGED, LoRAMode
    from vlora_va.serving.costs import CostModel, CostProfile
    from vlora_va.serving.profiling import profile_dir

    paths = [Path(profile)] if profile else sorted(profile_dir().glob("profile-*.json"))
    found = []
    for p in paths:
        try:
            cp = CostProfile.from_json(json.loads(p.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if DETECT_SIZE in cp.base:
            found.append((cp.created, p.name, cp))
    if found:
        created, name, cp = max(found, key=lambda f: (f[0], f[1]))
        model = CostModel(cp)
        costs = {n: model.forward_s(DETECT_SIZE, n, LoRAMode(PREMERGED), 1) for n in FRAMES}
        key = cp.key
        return costs, (f"cached cost profile {name} ({key.get('device')}, {key.get('threads')} threads, "
                       f"{key.get('backbone')}, {key.get('precision')}, measured {created}): one {DETECT_SIZE}-px "
                       f"forward of n images")
    serving = json.loads((OUT / "serving.json").read_text())
    per_s = serving["meta"]["capacity"]["vit-s"]
    return ({n: n / per_s for n in FRAMES},
            f"no cached cost profile: {1 / per_s * 1e3:.1f} ms per image from bench/results/serving.json "
            f"(vit-s, {per_s:.1f} images/s, {serving['meta']['cpu']})")


# ---------------------------------------------------------------- the scenario
def scenario(n_streams: int, n_adapters: int, n_daemons: int, slots: int, offered: float, skew: float,
             costs: dict[int, float], seed: int) -> tuple[list[StreamLoad], list[DaemonLoad], dict[str, int]]:
    """Streams (in a random order), daemons whose capacity makes the total load `offered` of the total capacity,
    and each stream's frames per chunk."""
    rng = random.Random(seed)
    adapters = [f"a{k:02d}" for k in range(n_adapters)]
    weights = [1 / (k + 1) ** skew for k in range(n_adapters)]
    streams, frames = [], {}
    for i in range(n_streams):
        n = rng.choice(FRAMES)
        sid = f"s{i:04d}"
        streams.append(StreamLoad(sid, frozenset(rng.choices(adapters, weights)), costs[n], rng.choice((0, 1, 2))))
        frames[sid] = n
    capacity = sum(s.load for s in streams) / (offered * n_daemons)
    daemons = [DaemonLoad(f"d{j:03d}", capacity=capacity, slots=slots) for j in range(n_daemons)]
    return streams, daemons, frames


# ---------------------------------------------------------------- figures of a placement
def switches_per_s(assignment: dict[str, str], streams: list[StreamLoad], frames: dict[str, int]) -> int:
    """Mode switches per second over all daemons, under the model of the module docstring."""
    images: dict[str, dict[str, int]] = {}
    for s in streams:
        per = images.setdefault(assignment[s.id], {})
        for a in s.adapters:
            per[a] = per.get(a, 0) + frames[s.id]
    total = 0
    for per in images.values():
        batches = {a: math.ceil(n / MAX_BATCH) for a, n in per.items()}
        order = [a for r in range(max(batches.values())) for a in sorted(batches) if batches[a] > r]
        total += sum(x != y for x, y in zip(order, order[1:] + order[:1]))  # the sequence repeats every second
    return total


def figures(assignment: dict[str, str], streams: list[StreamLoad], daemons: list[DaemonLoad],
            frames: dict[str, int]) -> dict:
    loads = pl.daemon_loads(assignment, streams)
    held = pl.daemon_adapters(assignment, streams)
    per_daemon = [loads.get(d.name, 0.0) for d in daemons]
    n_adapters = [len(held.get(d.name, ())) for d in daemons]
    mean = statistics.fmean(per_daemon)
    return {"max_mean": max(per_daemon) / mean, "min_mean": min(per_daemon) / mean,
            "max_utilisation": max(loads.get(d.name, 0.0) / d.capacity for d in daemons),
            "adapters_mean": statistics.fmean(n_adapters), "adapters_max": max(n_adapters),
            "adapter_loads": sum(n_adapters),
            "over_slots": sum(n > d.slots for n, d in zip(n_adapters, daemons)),
            "switches_per_s": switches_per_s(assignment, streams, frames)}


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


# ---------------------------------------------------------------- one seed
def run_seed(args, costs: dict[int, float], seed: int) -> dict:
    streams, daemons, frames = scenario(args.streams, args.adapters, args.daemons, args.slots, args.offered,
                                        args.skew, costs, seed)
    out = {"seed": seed, "policies": {}}
    placed = {}
    for policy in pl.POLICIES:
        assignment, wall = timed(pl.place, streams, daemons, policy)
        placed[policy] = assignment
        out["policies"][policy] = dict(figures(assignment, streams, daemons, frames),
                                       decision_us_per_stream=wall / len(streams) * 1e6)
    base = placed["affinity"]
    lost = daemons[seed % len(daemons)].name
    survivors = [d for d in daemons if d.name != lost]
    moves, wall = timed(pl.replace_lost, base, streams, survivors, lost)
    after = {**base, **{m.stream: m.target for m in moves}}
    f = figures(after, streams, survivors, frames)
    mean_before = sum(s.load for s in streams) / len(daemons)
    out["lost"] = {"daemon": lost, "streams_on_it": sum(d == lost for d in base.values()), "moves": len(moves),
                   "largest_stream_over_mean": max(s.load for s in streams) / mean_before,
                   "others_moved": sum(m.source != lost for m in moves), "ms": wall * 1e3,
                   "max_mean_after": f["max_mean"], "adapter_loads_after": f["adapter_loads"],
                   "over_slots_after": f["over_slots"]}
    joined = DaemonLoad("d-new", capacity=daemons[0].capacity, slots=args.slots)
    grown = daemons + [joined]
    moves, wall = timed(pl.fill_joined, base, streams, grown, joined.name)
    after = {**base, **{m.stream: m.target for m in moves}}
    f = figures(after, streams, grown, frames)
    loads = pl.daemon_loads(after, streams)
    mean = sum(loads.values()) / len(grown)
    by_id = {s.id: s for s in streams}
    out["joined"] = {"moves": len(moves), "ms": wall * 1e3, "newcomer_over_mean": loads.get(joined.name, 0.0) / mean,
                     "newcomer_adapters": len(pl.daemon_adapters(after, streams).get(joined.name, ())),
                     "moved_priorities": sorted({by_id[m.stream].priority for m in moves}),
                     "max_mean_after": f["max_mean"], "min_mean_after": f["min_mean"],
                     "adapter_loads_after": f["adapter_loads"],
                     "adapter_loads_before": out["policies"]["affinity"]["adapter_loads"]}
    return out


def median_of(runs: list[dict], *path: str) -> float:
    vals = []
    for r in runs:
        for p in path:
            r = r[p]
        vals.append(r)
    return statistics.median(vals)


def summarise(runs: list[dict]) -> dict:
    keys = ("decision_us_per_stream", "max_mean", "min_mean", "max_utilisation", "adapters_mean", "adapters_max",
            "adapter_loads", "over_slots", "switches_per_s")
    policies = {p: {k: median_of(runs, "policies", p, k) for k in keys} for p in pl.POLICIES}
    lost = {k: median_of(runs, "lost", k) for k in ("streams_on_it", "moves", "others_moved", "ms", "max_mean_after",
                                                    "adapter_loads_after", "over_slots_after",
                                                    "largest_stream_over_mean")}
    joined = {k: median_of(runs, "joined", k) for k in ("moves", "ms", "newcomer_over_mean", "newcomer_adapters",
                                                        "max_mean_after", "min_mean_after", "adapter_loads_before",
                                                        "adapter_loads_after")}
    joined["moved_priorities"] = sorted({p for r in runs for p in r["joined"]["moved_priorities"]})
    ratio = policies["round_robin"]["adapter_loads"] / policies["affinity"]["adapter_loads"]
    worst_max_mean = max(r["policies"]["affinity"]["max_mean"] for r in runs)
    goals = {"adapter_loads_round_robin_over_affinity": ratio,
             "adapter_loads_goal": f">= {GOAL_ADAPTER_LOADS}", "adapter_loads_met": ratio >= GOAL_ADAPTER_LOADS,
             "affinity_max_mean_worst_seed": worst_max_mean, "max_mean_goal": f"<= {GOAL_MAX_MEAN}",
             "max_mean_met": worst_max_mean <= GOAL_MAX_MEAN}
    return {"policies": policies, "lost": lost, "joined": joined, "goals": goals}


# ---------------------------------------------------------------- output


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def table(doc: dict) -> str:
    s, sc = doc["summary"], doc["scenario"]
    rows = [f"Stream placement, simulated ({doc['cpu']}, Python {doc['python']}, {doc['date']})", "",
            f"{sc['streams']} streams, {sc['adapters']} adapters (Zipf s={sc['skew']}), {sc['daemons']} daemons x "
            f"{sc['slots']} slots, offered load {sc['offered']:.0%} of capacity; medians over {len(sc['seeds'])} "
            f"seeds. Stream loads: {doc['costs']['source']}; per 1-s chunk of 2/4/8 frames: "
            + ", ".join(f"{v * 1e3:.0f} ms" for v in doc["costs"]["seconds_per_chunk"].values()) + ".", "",
            "| policy | decision µs/stream | max/mean load | min/mean | adapters/daemon mean (max) | adapter loads "
            "| daemons over slots | switches/s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p, r in s["policies"].items():
        rows.append(f"| {p} | {r['decision_us_per_stream']:.1f} | {r['max_mean']:.3f} | {r['min_mean']:.3f} | "
                    f"{r['adapters_mean']:.2f} ({r['adapters_max']:.0f}) | {r['adapter_loads']:.0f} | "
                    f"{r['over_slots']:.0f} | {r['switches_per_s']:.0f} |")
    lo, jo, g = s["lost"], s["joined"], s["goals"]
    rows += ["", "| event (from the affinity placement) | moves | time | after |", "|---|---:|---:|---|",
             f"| a daemon lost (replace_lost) | {lo['moves']:.0f} (of {lo['streams_on_it']:.0f} on it; others moved: "
             f"{lo['others_moved']:.0f}) | {lo['ms']:.2f} ms | max/mean {lo['max_mean_after']:.3f}, adapter loads "
             f"{lo['adapter_loads_after']:.0f}, over slots {lo['over_slots_after']:.0f} |",
             f"| a daemon joined (fill_joined) | {jo['moves']:.0f} | {jo['ms']:.2f} ms | newcomer at "
             f"{jo['newcomer_over_mean']:.2f}x the mean with {jo['newcomer_adapters']:.0f} adapter(s); max/mean "
             f"{jo['max_mean_after']:.3f}, min/mean {jo['min_mean_after']:.3f}; adapter loads "
             f"{jo['adapter_loads_before']:.0f} -> {jo['adapter_loads_after']:.0f}; moved priorities "
             f"{jo['moved_priorities']} (of 0, 1, 2) |", "",
             f"A lost daemon's streams may not displace others, so a survivor can end one stream above the rest: the "
             f"largest stream is {lo['largest_stream_over_mean']:.0%} of a daemon's mean load.", "",
             f"Goals: affinity needs {g['adapter_loads_round_robin_over_affinity']:.2f}x fewer adapter loads than "
             f"round robin (goal {g['adapter_loads_goal']}): {met(g['adapter_loads_met'])}; affinity max/mean "
             f"{g['affinity_max_mean_worst_seed']:.3f} on its worst seed (goal {g['max_mean_goal']}): "
             f"{met(g['max_mean_met'])}.", "",
             "Switches: each second a daemon runs one batch per adapter (split at 16 images), round robin over its "
             "adapters; a change of adapter between consecutive batches is a switch.", ""]
    return "\n".join(rows)


def plot(doc: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    s = doc["summary"]["policies"]
    names = list(s)
    panels = (("adapter_loads", "adapter loads (sum of distinct adapters)"), ("max_mean", "max / mean daemon load"),
              ("switches_per_s", "mode switches / s (model)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.6))
    for ax, (key, title) in zip(axes, panels):
        ax.bar(names, [s[n][key] for n in names], color=["tab:green", "tab:grey", "tab:blue"])
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    axes[1].axhline(GOAL_MAX_MEAN, color="red", lw=0.8, ls="--")
    sc = doc["scenario"]
    fig.suptitle(f"{sc['streams']} streams, {sc['adapters']} adapters (Zipf {sc['skew']}), {sc['daemons']} daemons, "
                 f"{sc['offered']:.0%} load: medians over {len(sc['seeds'])} seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--adapters", type=int, default=50)
    ap.add_argument("--daemons", type=int, default=100)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--offered", type=float, default=0.8, help="total load / total capacity")
    ap.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of the adapters' popularity")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--profile", default="", help="a cost profile JSON (default: the newest cached one)")
    ap.add_argument("--out", default=str(OUT / "placement.json"))
    args = ap.parse_args()
    costs, source = stream_costs(args.profile)
    runs = [run_seed(args, costs, seed) for seed in range(args.seeds)]
    doc = {"cpu": cpu_name(), "python": platform.python_version(),
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "scenario": {"streams": args.streams, "adapters": args.adapters, "daemons": args.daemons,
                        "slots": args.slots, "offered": args.offered, "skew": args.skew,
                        "seeds": list(range(args.seeds)), "frames_per_chunk": list(FRAMES), "chunk_s": 1.0,
                        "priorities": [0, 1, 2], "adapters_per_stream": 1},
           "costs": {"source": source, "seconds_per_chunk": {str(n): v for n, v in costs.items()}},
           "summary": summarise(runs), "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(doc))
    plot(doc, out.with_suffix(".png"))
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
