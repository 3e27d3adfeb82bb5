"""The default pipeline as `make run` runs it: start-up, and what was served in deadline, shed and late.

    python bench/default_pipeline.py                     # this CPU as it is: a cold start, then a warm one
    python bench/default_pipeline.py --isa native,avx2   # also as an AVX2-only CPU would run it
    python bench/default_pipeline.py --runs 3            # one cold start and two warm ones per variant

Each run is `vlora-va run` on a private copy of pipelines.yaml (the sample videos paced like live cameras, the
shipped adapters, the real backbone), its results to a JSON Lines file. A variant's runs share a profile cache
that starts empty: the first start measures this machine (cold), the next ones read what it cached (warm).
`--isa avx2` caps torch's kernels (ATen, oneDNN, MKL, fbgemm) at AVX2 through their environment variables, as
on an AVX2-only EPYC; the clock and caches stay this machine's, so it is an estimate of such a host.

Per run: start-up (process start -> "daemon ready"), the backbone precision chosen, the admission estimate, and
per task the rows by status, latency of served rows (median, p99) against the deadline, misses, rows written
later than twice their deadline, and chunks dropped by ingest. Checked (issue 11's acceptance): served p99 <=
deadline, nothing written later than twice its deadline, and nothing shed while the estimate says the load fits.
Writes bench/results/default_pipeline.json and .md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from soak import percentile, pipeline  # noqa: E402

from vlora_va.contracts.results import is_result  # noqa: E402
from vlora_va.engine.precision import AVX2_ENV  # noqa: E402

READY = "daemon ready on"


def run_once(config: Path, env: dict) -> dict:
    """One `vlora-va run` of config; its log lines with the seconds since start, and the exit code."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "vlora_va.cli", "run", str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code = proc.wait()
    reader.join(10)
    return {"code": code, "wall_s": time.monotonic() - t0, "lines": lines}


def summarise(out: dict, rows: list[dict], deadlines: dict[str, float]) -> dict:
    log = "\n".join(line for _, line in out["lines"])
    ready = next((t for t, line in out["lines"] if READY in line), None)
    precision = re.search(r"backbone precision (\w+)", log)
    backend = re.search(r"backbone precision \w+: .*\(backend (\w+)\)", log)
    capacity = re.search(r"capacity: (.*)", log)
    per_task = {}
    for task, deadline_ms in deadlines.items():
        mine = [r for r in rows if f"{r['stream']}/{r['task']}" == task]
        ok = [r for r in mine if r["status"] == "ok"]
        lat = sorted(r["latency_ms"]["total"] for r in ok)
        per_task[task] = {
            "deadline_ms": deadline_ms, "rows": len(mine), "ok": len(ok),
            "shed": sum(r["status"] == "shed" for r in mine), "errors": sum(r["status"] == "error" for r in mine),
            "misses": sum(not r["deadline_met"] for r in ok),
            "latency_p50_ms": percentile(lat, 0.5), "latency_p99_ms": percentile(lat, 0.99),
            "latency_max_ms": lat[-1] if lat else None,
            "later_than_2x": sum(r["latency_ms"]["total"] > 2 * r["deadline_ms"] for r in mine),
            "shed_reasons": dict(collections.Counter(r.get("reason", "")[:60] for r in mine if r["status"] == "shed")),
        }
    return {
        "exit_code": out["code"], "wall_s": round(out["wall_s"], 1), "startup_s": round(ready, 1) if ready else None,
        "profile": "measured" if "cost profile measured" in log else "cached",
        "precision": precision.group(1) if precision else None,
        "backend": backend.group(1) if backend else "torch",
        "capacity": capacity.group(1) if capacity else None, "fits": bool(capacity and "fits" in capacity.group(1)),
        "ingest_dropped": sum(r.get("dropped_before", 0) for r in rows), "tasks": per_task,
    }


def happened(rows: list[dict], events: list[dict]) -> dict:
    """What the tracked task saw: event rows by name (line crossings by line and direction), distinct tracks."""
    crossings = collections.Counter(f"{e['line']} {e['direction']}" for e in events if e["event"] == "line_crossed")
    tracks = {d["track_id"] for r in rows for f in r.get("frames", []) for d in f["detections"] if "track_id" in d}
    return {"events": dict(collections.Counter(e["event"] for e in events)), "crossings": dict(crossings),
            "tracks": len(tracks), "snapshots": sum(bool(e.get("snapshot")) for e in events)}


def verdict(run: dict) -> list[str]:
    problems = []
    for task, t in run["tasks"].items():
        if t["latency_p99_ms"] is not None and t["latency_p99_ms"] > t["deadline_ms"]:
            problems.append(f"{task}: p99 {t['latency_p99_ms']} ms > deadline {t['deadline_ms']:.0f} ms")
        if t["later_than_2x"]:
            problems.append(f"{task}: {t['later_than_2x']} row(s) written later than twice the deadline")
        if run["fits"] and t["shed"]:
            problems.append(f"{task}: {t['shed']} shed although the load fits")
        if t["errors"]:
            problems.append(f"{task}: {t['errors']} error row(s)")
    if run["exit_code"] != 0:
        problems.append(f"exit code {run['exit_code']}")
    return problems


def markdown(result: dict) -> str:
    m = result["machine"]
    md = [f"# The default pipeline, as `make run` runs it ({result['created']})", "",
          f"CPU: {m['cpu']} ({m['isa_flags']}), {m['cores']} cores; load average before: {m['load_before']}. "
          "Latency = the chunk's last frame captured -> result written; p99 over served rows.", "",
          "| ISA | start | start-up s | backend, precision | admission estimate | task | ok / shed / errors | "
          "p50 / p99 / max ms | deadline ms | misses | > 2x deadline | ingest drops | verdict |",
          "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for v in result["runs"]:
        for i, (task, t) in enumerate(v["tasks"].items()):
            head = (f"| {v['isa']} | {v['start']} ({v['profile']}) | {v['startup_s']} | {v['backend']} {v['precision']} | "
                    f"{v['capacity']} |") if i == 0 else "| | | | | |"
            md.append(f"{head} {task} | {t['ok']} / {t['shed']} / {t['errors']} | {t['latency_p50_ms']} / "
                      f"{t['latency_p99_ms']} / {t['latency_max_ms']} | {t['deadline_ms']:.0f} | {t['misses']} | "
                      f"{t['later_than_2x']} | {v['ingest_dropped'] if i == 0 else ''} | "
                      f"{('PASS' if not v['problems'] else 'FAIL: ' + '; '.join(v['problems'])) if i == 0 else ''} |")
    md += ["", "Events (tracked task: pedestrians/detect):", ""]
    md += [f"- {v['isa']} {v['start']}: {v['tracks']} tracks; events {v['events']}; line crossings {v['crossings']}; "
           f"{v['snapshots']} snapshots" for v in result["runs"]]
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "pipelines.yaml")
    ap.add_argument("--isa", default="native", help="comma list: native, avx2")
    ap.add_argument("--runs", type=int, default=2, help="per variant: the first starts cold, the rest warm")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    flags = open("/proc/cpuinfo").read() if Path("/proc/cpuinfo").exists() else ""
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "isa_flags": "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2",
               "load_before": [round(x, 2) for x in os.getloadavg()]}
    runs = []
    for isa in args.isa.split(","):
        env = dict(os.environ, **(AVX2_ENV if isa == "avx2" else {}))
        cache = Path(tempfile.mkdtemp(prefix=f"vlora-default-{isa}-profiles-"))
        for i in range(args.runs):
            tmp = Path(tempfile.mkdtemp(prefix="vlora-default-"))
            config = pipeline(args.config, tmp, cache, loop=False)
            print(f"{isa}: run {i + 1} of {args.runs} ({'cold' if i == 0 else 'warm'}) ...", flush=True)
            out = run_once(config, env)
            (tmp / "run.log").write_text("\n".join(f"{t:8.2f} {line}" for t, line in out["lines"]) + "\n")
            cfg = yaml.safe_load(config.read_text())
            deadlines = {f"{s['id']}/{t['name']}": float(t["deadline_ms"]) for s in cfg["streams"] for t in s["tasks"]}
            every = [json.loads(line) for line in (tmp / "results.jsonl").read_text().splitlines() if line]
            rows = [r for r in every if is_result(r)]
            run = {"isa": isa, "start": "cold" if i == 0 else "warm", **summarise(out, rows, deadlines),
                   **happened(rows, [r for r in every if not is_result(r)]), "log": str(tmp / "run.log")}
            run["problems"] = verdict(run)
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "tasks"}), flush=True)
    result = {"created": time.strftime("%Y-%m-%d %H:%M"), "machine": machine, "config": str(args.config),
              "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "default_pipeline.json").write_text(json.dumps(result, indent=1))
    (args.out / "default_pipeline.md").write_text(markdown(result))
    print(markdown(result))
    return 1 if any(r["problems"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
