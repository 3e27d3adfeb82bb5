"""Policies where switching pays, on a GPU (issue 31, part 5): the real daemon, one policy per point, offered
3x its measured capacity by bench/serving.py's load generator.

    python3 bench/gpu_policies.py --out bench/results --budget-s 900          # vit-l on cuda, the defaults below
    python3 bench/gpu_policies.py --device cpu --backbone tiny --skews 0.9 --policies vlora,unmerge-only \\
        --duration 3 --deadline-ms 1000 --budget-s 150                        # a smoke run on a CPU

A random-weight backbone (ViT-L by default: more compute per 224 px frame sent, so 3x capacity stays within what
the Python generator can send) and 4 random LoRA adapters are built once in /tmp; the generator's own ceiling is
measured once. Points run premerge setting by setting (premerge_max_mb 0 first: no per-slot weights, where switching
pays), skew 0.9 first, then vlora, unmerge-only, edf. Every point offers the same load: the capacity (and, unless
given, the deadline: DEADLINE_BATCHES full merged batches) measured at the first point. All daemons share one
cost-profile cache. Writes <out>/gpu_policies.json after every point and stops starting points when the next one
would pass the time budget (estimated from the longest point so far). At the end, per skew and premerge setting:
vlora over unmerge-only and over the best baseline (in-deadline images/s), and the policy with the lowest mean
latency, against the issue's goals.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import serving as S  # noqa: E402

DEADLINE_BATCHES = 3.0  # each request's deadline, in full merged batches of the profile (vit-s on a CPU: ~3)
GOAL_VS_UNMERGE_ONLY = 1.2  # at every skew
GOAL_VS_BEST_BASELINE = 1.5  # at 90% skew
GOAL_SKEW = 0.9


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _premerge_label(setting: int | None) -> str:
    return f"default ({S.DEFAULT_PREMERGE_MB})" if setting is None else str(setting)


def _premerges(setting: int | None, mb: float | None) -> bool | None:
    """Whether the daemon keeps premerged weights under this setting, given the MB they take (None: not known)."""
    if mb is None:
        return None
    return 0 < mb <= (S.DEFAULT_PREMERGE_MB if setting is None else setting)


def _same_as_done(points: list[dict], setting: int | None, skew: float, policy: str) -> int | None | str:
    """An earlier setting whose point at (skew, policy) ran the very same daemon (premerged the same way), else
    "no". A default that does not premerge (the weights take more than it allows) is the same as 0."""
    mb = next((p["figures"]["premerge_mb"] for p in points if p.get("figures", {}).get("premerge_mb") is not None),
              None)
    mine = _premerges(setting, mb)
    if mine is None:
        return "no"
    for p in points:
        if (p.get("figures") and p["skew"] == skew and p["policy"] == policy and p["premerge"] != setting
                and _premerges(p["premerge"], mb) == mine):
            return p["premerge"]
    return "no"


def versions() -> dict:
    import torch
    import transformers

    meta = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cpus": os.cpu_count(), "platform": platform.platform()}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    meta["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return meta


def summarise(points: list[dict], policies) -> list[dict]:
    """Per premerge setting and skew: vlora's in-deadline images/s over unmerge-only's and over the best
    baseline's, the policy with the lowest mean latency, and the issue's goals met or not (None: not measured)."""
    rows = []
    keys = list(dict.fromkeys((p["premerge"], p["skew"]) for p in points if p.get("figures")))
    for setting, skew in keys:
        figs = {p["policy"]: p["figures"] for p in points
                if p.get("figures") and p["premerge"] == setting and p["skew"] == skew}
        served = {k: f["in_deadline_per_s"] for k, f in figs.items()}
        vlora = served.get("vlora")
        baselines = {k: v for k, v in served.items() if k != "vlora"}
        best = max(baselines, key=baselines.get) if baselines else None
        unm = served.get("unmerge-only")
        latency = {k: f["mean_latency_ms"] for k, f in figs.items() if f["mean_latency_ms"] is not None}
        lowest = min(latency, key=latency.get) if len(latency) > 1 else None
        vs_unm = vlora / unm if vlora is not None and unm else None
        vs_best = vlora / baselines[best] if vlora is not None and best and baselines[best] else None
        rows.append({
            "premerge": setting, "skew": skew, "policies": [p for p in policies if p in figs],
            "in_deadline_per_s": served, "mean_latency_ms": latency,
            "vlora_vs_unmerge_only": vs_unm, "best_baseline": best, "vlora_vs_best_baseline": vs_best,
            "lowest_mean_latency": lowest,
            "generator_limited": any(f["generator_limited"] for f in figs.values()),
            "goals": {
                f"vs_unmerge_only>={GOAL_VS_UNMERGE_ONLY}": None if vs_unm is None else vs_unm >= GOAL_VS_UNMERGE_ONLY,
                f"vs_best_baseline>={GOAL_VS_BEST_BASELINE}": (None if vs_best is None or skew < GOAL_SKEW
                                                               else vs_best >= GOAL_VS_BEST_BASELINE),
                "lowest_mean_latency": None if lowest is None or "vlora" not in figs else lowest == "vlora",
            },
        })
    return rows


def _write(path: Path, result: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.rename(path)  # a run killed mid-write leaves the previous point's file whole


def run(out_dir: Path | str, backbone: str = "vit-l", policies=("vlora", "unmerge-only", "edf"), skews=(0.5, 0.9),
        premerge=(0, None), duration: float = 8.0, load: float = 3.0, device: str = "cuda", budget_s: float = 900.0,
        log=_log, streams: int = 4, adapters: int = 4, max_batch: int | None = None,
        deadline_ms: float | None = None, senders: int = 1, threads: int | None = None,
        work: Path | str | None = None) -> dict:
    """Run the points (module docstring) and return what gpu_policies.json holds. max_batch None: 64 on cuda, else
    16. deadline_ms None: DEADLINE_BATCHES x the full merged batch time of the first point's profile."""
    t0 = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "gpu_policies.json"
    work = Path(work or f"/tmp/vlora-gpu-policies-{backbone}")
    work.mkdir(parents=True, exist_ok=True)
    profiles = work / "profiles"  # one cost-profile cache for every daemon of this run
    # Daemons and sender processes import vlora_va from the repository (not installed), beside what PYTHONPATH has
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    max_batch = max_batch or (64 if device == "cuda" else 16)
    threads = threads or os.cpu_count() or 2
    b = S.BACKBONES[backbone] if deadline_ms is None else replace(S.BACKBONES[backbone], deadline_ms=deadline_ms)

    log(f"[{time.time() - t0:5.0f}s] building {backbone} and {adapters} adapters in {work}")
    backbone_id = S.build_backbone(b, work)
    adapter_dirs = S.build_adapters(b, backbone_id, adapters, work)
    ceiling = S.generator_ceiling(b, senders)
    log(f"[{time.time() - t0:5.0f}s] generator ceiling {ceiling['generator_ceiling_per_s']:.0f} chunks/s "
        f"({senders} sender(s), {ceiling['frame_bytes']} B frames)")
    result = {"meta": {**versions(), "date": time.strftime("%Y-%m-%d %H:%M"), "device": device,
                       "backbone": asdict(b), "adapters": adapters, "streams": streams, "load": load,
                       "duration_s": duration, "warmup_s": S.WARMUP_S, "max_batch_images": max_batch,
                       "threads": threads, "senders": senders, "default_premerge_max_mb": S.DEFAULT_PREMERGE_MB,
                       "budget_s": budget_s, "generator": ceiling,
                       "generator_ceiling_per_s": ceiling["generator_ceiling_per_s"]},
              "points": [], "skipped": [], "summary": []}
    _write(out, result)

    capacity, walls = None, []
    order = [(pm, skew, policy) for pm in premerge for skew in sorted(skews, reverse=True) for policy in policies]
    for i, (pm, skew, policy) in enumerate(order):
        name = f"premerge {_premerge_label(pm)}, skew {skew:g}, {policy}"
        elapsed = time.time() - t0
        same = _same_as_done(result["points"], pm, skew, policy)
        if same != "no":
            log(f"[{elapsed:5.0f}s] {name}: skipped, the same daemon as premerge {_premerge_label(same)}")
            result["skipped"].append({"point": name, "why": f"premerges as premerge {_premerge_label(same)} does"})
            continue
        if elapsed >= budget_s or (walls and elapsed + max(walls) > budget_s):
            left = [f"premerge {_premerge_label(p)}, skew {s:g}, {q}" for p, s, q in order[i:]]
            log(f"[{elapsed:5.0f}s] budget: {len(left)} point(s) not started")
            result["skipped"] += [{"point": x, "why": "time budget"} for x in left]
            break
        point = {"policy": policy, "skew": skew, "premerge": pm, "premerge_label": _premerge_label(pm)}
        started = time.time()
        try:
            figures, capacity = S.run_point(
                b, backbone_id, adapter_dirs, policy, S.Workload(streams, adapters, skew, load), duration, work,
                threads, seed=int(skew * 1000), capacity=capacity, device=device, premerge_max_mb=pm,
                max_batch_images=max_batch, deadline_ms=deadline_ms,
                deadline_batches=DEADLINE_BATCHES if deadline_ms is None else 0.0,
                ceiling=ceiling["generator_ceiling_per_s"], senders=senders, profile_cache=str(profiles))
            deadline_ms = figures["deadline_ms"]  # every later point: the first one's deadline
            result["meta"].update(deadline_ms=deadline_ms, capacity_per_s=capacity)
            point["figures"] = figures
            log(f"[{time.time() - t0:5.0f}s] {name}: {figures['in_deadline_per_s']:.1f} img/s in deadline "
                f"(capacity {figures['capacity_per_s']:.0f}, offered {figures['achieved_rate_per_s']:.0f}/s of "
                f"{figures['needed_rate_per_s']:.0f}), mean {_ms(figures['mean_latency_ms'])} p99 "
                f"{_ms(figures['p99_latency_ms'])} ms, deadline {figures['deadline_ms']:.0f} ms, shed "
                f"{figures['shed_rate']:.0%}, missed {figures['miss_rate']:.1%}, {figures['switches']} switches, "
                f"premerged {figures['premerged']}" + (", GENERATOR-LIMITED" if figures["generator_limited"] else ""))
        except Exception as e:  # one failed daemon costs its point, not the rest of the run
            point["error"] = f"{type(e).__name__}: {e}"[-3000:]
            log(f"[{time.time() - t0:5.0f}s] {name}: FAILED {point['error'][-600:]}")
        point["wall_s"] = round(time.time() - started, 1)
        walls.append(point["wall_s"])
        result["points"].append(point)
        result["summary"] = summarise(result["points"], policies)
        result["meta"]["wall_s"] = round(time.time() - t0)
        _write(out, result)
    result["meta"]["wall_s"] = round(time.time() - t0)
    _write(out, result)  # the points skipped after the last one run
    for row in result["summary"]:
        log(summary_line(row))
    return result


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def summary_line(row: dict) -> str:
    goals = ", ".join(f"{k} {'MET' if v else 'not met'}" for k, v in row["goals"].items() if v is not None)
    return (f"premerge {_premerge_label(row['premerge'])}, skew {row['skew']:g}: vlora "
            f"{_ratio(row['vlora_vs_unmerge_only'])} unmerge-only, {_ratio(row['vlora_vs_best_baseline'])} best "
            f"baseline ({row['best_baseline']}); lowest mean latency {row['lowest_mean_latency']}"
            + (" [GENERATOR-LIMITED]" if row["generator_limited"] else "") + (f"; {goals}" if goals else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--backbone", default="vit-l", choices=list(S.BACKBONES))
    ap.add_argument("--policies", default="vlora,unmerge-only,edf")
    ap.add_argument("--skews", default="0.5,0.9")
    ap.add_argument("--premerge", default="0,default", help="premerge_max_mb settings in order; default: left out")
    ap.add_argument("--duration", type=float, default=8.0, help="measured seconds per point (after the warm-up)")
    ap.add_argument("--load", type=float, default=3.0, help="offered images/s as a multiple of capacity")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--budget-s", type=float, default=900.0)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=None, help="daemon.max_batch_images (default 64 on cuda, 16)")
    ap.add_argument("--deadline-ms", type=float, default=None,
                    help=f"default: {DEADLINE_BATCHES:g} full merged batches of the first point's profile")
    ap.add_argument("--senders", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", type=Path, default=None, help="where the backbone, adapters and profiles are kept")
    a = ap.parse_args(argv)
    premerge = [None if x == "default" else int(x) for x in a.premerge.split(",") if x]
    result = run(a.out, a.backbone, tuple(a.policies.split(",")), tuple(float(x) for x in a.skews.split(",")),
                 tuple(premerge), a.duration, a.load, a.device, a.budget_s, streams=a.streams, max_batch=a.max_batch,
                 deadline_ms=a.deadline_ms, senders=a.senders, threads=a.threads, work=a.work)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
