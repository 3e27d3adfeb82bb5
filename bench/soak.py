"""Soak (issue 14, item 6): the default pipeline on looping videos for a set time, watched for slow leaks.

    python bench/soak.py                     # 30 minutes of pipelines.yaml, every stream looping
    python bench/soak.py --minutes 10        # shorter
    python bench/soak.py --warmup-minutes 3 --sample-s 10 --config other.yaml

`vlora-va run` runs in its own process group (real backbone, shipped adapters, real ingest processes), its
streams set to loop and its results to a private JSON Lines file. Every --sample-s seconds the soak reads, from
/proc, each process's RSS, open file descriptors and threads (the supervisor, the daemon and every ingest
worker, found by the pids the supervisor logs), and from the results the rows of that window: served, shed,
errors, deadline misses, ingest drops, latency (median, p95). At the end it stops the run like Ctrl-C and checks:

  - RSS: the least-squares slope after warm-up, per process and in all, must stay under --max-rss-mb-h (20 MB/h);
  - open fds and threads: must not grow (the median of the last third of the samples after warm-up is not above
    that of the first third, per process);
  - the run exits 0, and every request the daemon received was answered (received = answered).

Writes bench/results/soak.json (every sample) and bench/results/soak.md (the summary); exits 1 when a check fails.
Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vlora_va.contracts.results import (
    JsonlFollower,  # noqa: E402
    is_result,  # noqa: E402
)
from vlora_va.testing.harness import percentile  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def proc_stats(pid: int) -> dict | None:
    """RSS (MB), open fds and threads of one process, or None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rss, threads = re.search(r"VmRSS:\s+(\d+) kB", status), re.search(r"Threads:\s+(\d+)", status)
    if rss is None or threads is None:  # exiting (a zombie has no memory left)
        return None
    rss, threads = int(rss.group(1)) / 1024, int(threads.group(1))
    return {"rss_mb": round(rss, 2), "fds": fds, "threads": threads}


def children(log: str, run_pid: int) -> dict[str, int]:
    """Role -> pid of the processes the supervisor says it started (the latest of each role)."""
    out = {"run": run_pid}
    for m in re.finditer(r"daemon started \(pid (\d+)\)", log):
        out["daemon"] = int(m.group(1))
    for m in re.finditer(r"ingest worker (\d+) \(pid (\d+)\)", log):
        out[f"ingest-{m.group(1)}"] = int(m.group(2))
    return out


class ResultsFollower:
    """The results file read as it grows."""

    def __init__(self, path: Path):
        self.follower = JsonlFollower(path)

    def new(self) -> list[dict]:
        return [r for line in self.follower.new_lines() if is_result(r := json.loads(line))]


def window(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    lat = sorted(r["latency_ms"]["total"] for r in ok)
    return {"rows": len(rows), "ok": len(ok), "shed": sum(r["status"] == "shed" for r in rows),
            "errors": sum(r["status"] == "error" for r in rows),
            "misses": sum(not r["deadline_met"] for r in ok),
            "ingest_dropped": sum(r.get("dropped_before", 0) for r in rows),
            "latency_p50_ms": latency_ms(lat, 0.5), "latency_p95_ms": latency_ms(lat, 0.95)}


def latency_ms(values: list[float], q: float) -> float | None:
    """A latency percentile (harness.percentile: nearest rank) to 0.1 ms; None without values."""
    p = percentile(values, q)
    return None if p is None else round(p, 1)


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over ts (seconds), per hour."""
    if len(ts) < 3:
        return 0.0
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return 3600.0 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den if den else 0.0


def grows(ys: list[float]) -> bool:
    """The median of the last third is above that of the first third (a count that keeps rising)."""
    n = len(ys) // 3
    return n >= 2 and statistics.median(ys[-n:]) > statistics.median(ys[:n])


def pipeline(config: Path, tmp: Path, profile_cache: Path | None, loop: bool = True) -> Path:
    """A private copy of `config`: its own endpoint, profile cache and JSON Lines sink in tmp, no HTTP server,
    every stream looping (or as the file says)."""
    cfg = yaml.safe_load(config.read_text())
    base = config.resolve().parent
    cfg.setdefault("daemon", {})["endpoint"] = f"ipc://{tmp}/daemon.sock"
    cfg["daemon"]["profile_cache"] = str(profile_cache or tmp / "profiles")
    cfg["daemon"]["http_port"] = 0
    cfg["adapters"] = {n: str(base / p) for n, p in cfg["adapters"].items()}
    for s in cfg["streams"]:
        s["source"] = s["source"] if "://" in s["source"] else str(base / s["source"])
        if loop:
            s["loop"] = True
            s.pop("max_chunks", None)
    cfg["sinks"] = [{"type": "jsonl", "path": str(tmp / "results.jsonl")}]
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "pipelines.yaml")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup-minutes", type=float, default=3.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--max-rss-mb-h", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    ap.add_argument("--profile-cache", type=Path,
                    help="daemon.profile_cache for the run (default: a fresh directory, so the daemon measures this "
                         "machine as it is now: a profile cached while the machine was busier can make it shed "
                         "everything, and a soak that computes nothing measures nothing)")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="vlora-soak-"))
    path = pipeline(args.config, tmp, args.profile_cache)
    log_path = tmp / "run.log"
    log_file = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "vlora_va.cli", "run", str(path)], cwd=ROOT, stderr=log_file,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    rows = ResultsFollower(tmp / "results.jsonl")
    samples: list[dict] = []
    all_rows: list[dict] = []
    t0 = time.monotonic()
    started = None
    stop = {"now": False}  # Ctrl-C: end the soak early, still stop the run cleanly and report
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    print(f"soak: {args.minutes:.0f} min of {args.config} (looping), log {log_path}", flush=True)
    try:
        while time.monotonic() - t0 < args.minutes * 60 and proc.poll() is None:
            if stop["now"]:
                break
            t_next = time.monotonic() + args.sample_s
            while time.monotonic() < t_next and not stop["now"]:
                time.sleep(0.2)
            log = log_path.read_text(errors="replace")
            if started is None:
                if "ingest worker 0 (pid" not in log:
                    continue
                started = time.monotonic()
            new = rows.new()
            all_rows += [{"status": r["status"], "stream": r["stream"], "task": r["task"], "chunk": r["chunk"]}
                         for r in new]
            procs = {role: st for role, pid in children(log, proc.pid).items() if (st := proc_stats(pid))}
            sample = {"t_s": round(time.monotonic() - started, 1), "procs": procs, **window(new)}
            samples.append(sample)
            total = sum(p["rss_mb"] for p in procs.values())
            print(f"{sample['t_s']:7.0f} s  rss {total:7.1f} MB  fds {sum(p['fds'] for p in procs.values()):4d}  "
                  f"threads {sum(p['threads'] for p in procs.values()):4d}  rows {sample['rows']:4d} "
                  f"(shed {sample['shed']}, misses {sample['misses']}, errors {sample['errors']})  "
                  f"p50 {sample['latency_p50_ms']} ms  p95 {sample['latency_p95_ms']} ms", flush=True)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(900)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        log_file.close()
    log = log_path.read_text(errors="replace")
    all_rows += [{"status": r["status"], "stream": r["stream"], "task": r["task"], "chunk": r["chunk"]}
                 for r in rows.new()]
    return report(args, samples, all_rows, log, code, tmp)


def report(args, samples: list[dict], rows: list[dict], log: str, code: int, tmp: Path) -> int:
    warm = [s for s in samples if s["t_s"] >= args.warmup_minutes * 60]
    roles = sorted({r for s in warm for r in s["procs"]})
    failures = []
    trend = {}
    for role in roles + ["all"]:
        pts = [(s["t_s"], s["procs"][role]) if role != "all" else
               (s["t_s"], {k: sum(p[k] for p in s["procs"].values()) for k in ("rss_mb", "fds", "threads")})
               for s in warm if role == "all" or role in s["procs"]]
        if len(pts) < 3:
            continue
        ts = [t for t, _ in pts]
        trend[role] = {k: {"first": pts[0][1][k], "last": pts[-1][1][k], "min": min(p[k] for _, p in pts),
                           "max": max(p[k] for _, p in pts), "slope_per_h": round(slope_per_hour(ts, [p[k] for _, p in pts]), 2),
                           "grows": grows([p[k] for _, p in pts])} for k in ("rss_mb", "fds", "threads")}
        if trend[role]["rss_mb"]["slope_per_h"] > args.max_rss_mb_h:
            failures.append(f"{role}: RSS grows {trend[role]['rss_mb']['slope_per_h']:.1f} MB/h after warm-up "
                            f"(limit {args.max_rss_mb_h:.0f})")
        if role != "all":
            for k in ("fds", "threads"):
                if trend[role][k]["grows"]:
                    failures.append(f"{role}: {k} grow ({trend[role][k]['first']} -> {trend[role][k]['last']}, "
                                    f"{trend[role][k]['slope_per_h']:+.1f}/h)")
    m = re.findall(r"daemon stopped: (\d+) chunks, (\d+) requests, (\d+) results, (\d+) shed, (\d+) errors", log)
    stopped = dict(zip(("chunks", "requests", "ok", "shed", "errors"), map(int, m[-1]))) if m else None
    if code != 0:
        failures.append(f"vlora-va run exited {code}")
    if stopped is None:
        failures.append("the daemon did not report stopping")
    elif stopped["requests"] != stopped["ok"] + stopped["shed"] + stopped["errors"] or stopped["requests"] != len(rows):
        failures.append(f"received != answered: {stopped} vs {len(rows)} rows written")
    answered = {(r["stream"], r["task"], r["chunk"]) for r in rows}
    if len(answered) != len(rows):
        failures.append(f"{len(rows) - len(answered)} request(s) answered twice")
    totals = {k: sum(s[k] or 0 for s in samples) for k in ("rows", "ok", "shed", "errors", "misses", "ingest_dropped")}
    lat = [s["latency_p95_ms"] for s in warm if s["latency_p95_ms"] is not None]
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_avg_at_end": os.getloadavg()},
        "minutes": round(samples[-1]["t_s"] / 60, 1) if samples else 0, "warmup_minutes": args.warmup_minutes,
        "sample_s": args.sample_s, "exit_code": code, "daemon_stopped": stopped, "totals": totals,
        "latency_p95_ms_over_time": {"first": lat[0] if lat else None, "last": lat[-1] if lat else None,
                                     "slope_per_h": round(slope_per_hour([s["t_s"] for s in warm if s["latency_p95_ms"]],
                                                                         lat), 1) if lat else None},
        "trend": trend, "failures": failures, "samples": samples, "workdir": str(tmp),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    md = [f"# Soak: {result['minutes']} min of the default pipeline (looping), warm-up {args.warmup_minutes:.0f} min",
          "", f"Machine: {result['machine']['cores']} cores ({result['machine']['cpu']}), load average at the end "
          f"{', '.join(f'{x:.1f}' for x in result['machine']['load_avg_at_end'])}. Exit code {code}.", "",
          "| process | RSS first → last (MB) | RSS slope (MB/h) | fds first → last (max) | threads first → last (max) |",
          "|---|---:|---:|---:|---:|"]
    for role, t in trend.items():
        md.append(f"| {role} | {t['rss_mb']['first']:.1f} → {t['rss_mb']['last']:.1f} | {t['rss_mb']['slope_per_h']:+.1f} | "
                  f"{t['fds']['first']} → {t['fds']['last']} ({t['fds']['max']}) | "
                  f"{t['threads']['first']} → {t['threads']['last']} ({t['threads']['max']}) |")
    md += ["", f"Rows: {totals['rows']} ({totals['ok']} ok, {totals['shed']} shed, {totals['errors']} errors), "
               f"{totals['misses']} deadline misses, {totals['ingest_dropped']} chunks dropped by ingest; "
               f"daemon at stop: {stopped}. p95 latency per window: first {result['latency_p95_ms_over_time']['first']} ms, "
               f"last {result['latency_p95_ms_over_time']['last']} ms.", "",
           "Verdict: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures))]
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
