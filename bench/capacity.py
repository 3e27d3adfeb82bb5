"""Capacity as streams held (issue 32): how many live cameras this machine serves in deadline, busy or mostly quiet,
with frame filtering at ingest and without, as this CPU runs and capped at AVX2.

    python bench/capacity.py                                     # every run: about 25 min on 2 cores
    python bench/capacity.py --isa native --mix mixed --filtering on --max-streams 4   # one run, a few points

A camera is the issue's surveillance stream: 10 fps, 1-s chunks, paced live and looping, with `detect` (1 frame at
336 px, 2000 ms) and `activity` (8 frames at the actions adapter's 224 px, 3000 ms). A busy camera plays
sample_videos/pedestrians.mp4; a quiet one sample_videos/quiet.mp4 (an empty scene with a real 6-s walk-through
once a minute; sample_videos/make_quiet.py). Mixes: "busy" = N busy cameras; "mixed" = 1 busy + N-1 quiet.
Filtering on: both tasks carry `filter:` with the threshold `vlora-va filter tune` chose for them on the camera's
training footage, busy and quiet (bench/filter_accuracy.py: bench/results/filter_tune-pedestrians-<task>.json, the
1-frame detect's for detect); off: no filter.

One run = one (isa, mix, filtering). One `vlora-va daemon` per ISA serves its runs one after another, as the
default pipeline's daemon does (pipelines.yaml's `backend`, precision auto, 16-image batches, all cores); `--isa avx2`
starts it with torch's kernel libraries capped at AVX2 through their environment variables (engine/precision.py
AVX2_ENV; OpenVINO heeds the same ONEDNN_MAX_CPU_ISA), so it estimates an AVX2-only CPU of this clock. Ingest
runs as it would on the camera host's side of the same machine: one `vlora-va ingest` process per camera, sharing
the cores with the daemon.

A run adds cameras one at a time, one every --step s (26.4 s: 0.44 of quiet.mp4's one-minute walk-through period,
so the cameras' walk-throughs fall at spread-out moments, as independent cameras' would; they all keep running).
After each addition it measures a window of --window s, starting --settle s after the new camera started, from the
rows the daemon's JSON Lines sink wrote (the bench's own books, by each row's captured_at: gpu_streams.books):
a chunk is in deadline when both its tasks' rows are ok within their deadlines (a reused row counts like any
other: it is the result the user gets); a chunk with no row (ingest dropped it) is missed. A point is held when
>= 99% of the window's chunks, over all cameras, are in deadline, in its window or, failing that, in a second
window right after it (the 2 cores are shared with other work: one slow spell should not end a run); the first
point not held ends the run, and `streams_held` is the last held N (0: not even one camera).

Writes bench/results/capacity.json after every point ({"cpu", "runs": [{"isa", "mix", "filtering",
"streams_held", "points": [...]}]}) and capacity.md at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_streams as live  # noqa: E402  (the live-stream machinery: processes, the sink's rows, the books)
from soak import proc_stats  # noqa: E402

from vlora_va.engine.precision import AVX2_ENV  # noqa: E402
from vlora_va.testing.host import cpu_name  # noqa: E402

RESULTS = ROOT / "bench" / "results"
VIDEOS = {"busy": ROOT / "sample_videos" / "pedestrians.mp4", "quiet": ROOT / "sample_videos" / "quiet.mp4"}
TUNED = RESULTS / "filter_tune-pedestrians-{task}.json"  # bench/filter_accuracy.py's tune, per task as run here
TUNE_OF = {"detect": "detect-1", "activity": "activity"}  # this bench's detect sends 1 frame a chunk
FPS = 10
STEP_S = 26.4  # 0.44 of a minute: the k-th camera's walk-throughs fall 26.4 k s (mod 60) after the first's
SETTLE_S = 6.0  # a new camera's process starts (~2 s of a core) and its first chunk comes 1 s later
WINDOW_S = 15.0
DAEMON_READY_TIMEOUT_S = 600.0  # precision auto measures every gated precision at a first start
RUNS = (("busy", False), ("busy", True), ("mixed", False), ("mixed", True))
PRECISION_LINE = re.compile(r"precision|admission", re.IGNORECASE)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- cameras
def default_backend() -> str:
    """The default pipeline's daemon.backend (`auto`: openvino where it measures faster here)."""
    return yaml.safe_load((ROOT / "pipelines.yaml").read_text())["daemon"].get("backend", "torch")


def tuned_threshold(task: str) -> float:
    """The threshold `vlora-va filter tune` chose for the task on the busy video (its report's `chosen`)."""
    path = Path(str(TUNED).format(task=TUNE_OF[task]))
    report = json.loads(path.read_text())
    if not report.get("chosen"):
        raise SystemExit(f"{path}: no threshold kept the loss within max_loss; nothing to filter with")
    return float(report["chosen"]["threshold"])


def camera(sid: str, kind: str, filters: dict[str, float] | None) -> dict:
    """One camera's stream entry (pipelines.yaml's shape). The adapters' names are gpu_streams.TASKS' (detect,
    actions); the tune reports are per task name."""
    tasks = []
    for t in live.TASKS:
        task = dict(t)
        if filters is not None:
            task["filter"] = {"threshold": filters[t["name"]], "refresh_chunks": 10}
        tasks.append(task)
    return {"id": sid, "source": str(VIDEOS[kind]), "fps": FPS, "chunk_seconds": 1.0, "loop": True,
            "realtime": True, "tasks": tasks}


def kinds(mix: str, n: int) -> list[str]:
    return ["busy"] * n if mix == "busy" else ["busy"] + ["quiet"] * (n - 1)


def run_id(mix: str, filtering: bool) -> str:
    return f"{mix}-{'on' if filtering else 'off'}"


# ---------------------------------------------------------------- one run
def sweep(work: Path, daemon_cfg: dict, sink: live.SinkRows, daemon: live.Child, mix: str, filtering: bool,
          filters: dict[str, float], max_streams: int, step: float, settle: float, window: float,
          save, log) -> dict:
    """Add cameras one at a time until a point is not held (or max_streams); every camera stops at the end."""
    rid = run_id(mix, filtering)
    run = {"mix": mix, "filtering": filtering, "filters": filters if filtering else None, "points": [],
           "streams_held": 0}
    cams = kinds(mix, max_streams)
    entries = [camera(f"{rid}-c{k}", cams[k], filters if filtering else None) for k in range(max_streams)]
    cfg = live.pipeline(daemon_cfg, [], sink.path)
    cfg["streams"] = entries
    cfg_path = work / f"ingest-{rid}.json"
    cfg_path.write_text(json.dumps(cfg))
    workers: list[live.Child] = []
    rows: list[dict] = []  # every row of this run's cameras (live.books picks each window's)
    mine = {e["id"] for e in entries}
    t_start = time.time()
    try:
        for k in range(max_streams):
            t_cam = t_start + k * step
            live.wait_until(t_cam, sink, mine, rows)
            sid = entries[k]["id"]
            workers.append(live.Child(["ingest", str(cfg_path), "--streams", sid], work / f"{sid}.log"))
            ids = [e["id"] for e in entries[:k + 1]]
            point = measure(sink, mine, ids, rows, daemon, workers, t_cam, settle, window)
            point.update(streams=k + 1, quiet=cams[:k + 1].count("quiet"))
            held = point.get("fraction", 0.0) >= live.HELD
            log(f"  {rid} {k + 1} cameras ({point['quiet']} quiet): {describe(point)}"
                + ("" if held else " -> not held"))
            if not held and "fraction" in point:  # a second window before giving up: the cores are shared
                again = measure(sink, mine, ids, rows, daemon, workers, time.time(), 0.0, window)
                point["second_window"] = again
                held = again.get("fraction", 0.0) >= live.HELD
                log(f"    second window: {describe(again)}" + (" -> held" if held else " -> not held"))
            point["held"] = held
            run["points"].append(point)
            if held:
                run["streams_held"] = k + 1
            save()
            if not held:
                break
    finally:
        live.stop_all(workers, live.INGEST_STOP_TIMEOUT_S)
        live.wait_sink_quiet(sink, set(), rows)
    return run


def describe(point: dict) -> str:
    if "fraction" not in point:
        return f"failed: {point['failed']}"
    m = point["machine"]
    return (f"{point['chunks_in_deadline']}/{point['chunks_expected']} chunks in deadline ({point['fraction']:.1%}), "
            f"shed {point['shed']}, late {point['late']}, reused {point['reused_rows']}, p50/p99 {point['p50_ms']}/"
            f"{point['p99_ms']} ms, cores busy {m['host_cores_busy']} (daemon {m['daemon_cores']}, ingest "
            f"{m['ingest_cores']})")


def measure(sink: live.SinkRows, mine: set[str], ids: list[str], rows: list[dict], daemon: live.Child,
            workers: list[live.Child], t_cam: float, settle: float, window: float) -> dict:
    """The window [t_cam + settle, + window) of the cameras so far, once its last chunks are past their deadlines."""
    t0, t1 = t_cam + settle, t_cam + settle + window
    deadline = time.monotonic() + live.FIRST_ROW_TIMEOUT_S
    newest = ids[-1]
    while not any(r["stream"] == newest for r in rows):  # the new camera serves before its window counts
        sink.take(mine, rows)
        if daemon.proc.poll() is not None:
            return {"failed": f"the daemon exited {daemon.proc.returncode}"}
        if workers[-1].proc.poll() is not None:
            return {"failed": f"camera {newest}'s ingest exited {workers[-1].proc.returncode}: "
                              + " | ".join(workers[-1].text().splitlines()[-3:])}
        if time.monotonic() > deadline:
            return {"failed": f"no row of {newest} within {live.FIRST_ROW_TIMEOUT_S:.0f} s"}
        time.sleep(0.25)
    live.wait_until(t0, sink, mine, rows)
    with live.Sampler(daemon.proc.pid, [w.proc.pid for w in workers]) as sampler:
        live.wait_until(t1, sink, mine, rows)
    live.wait_until(t1 + live.MAX_DEADLINE_S + 1.0, sink, mine, rows)
    point = live.books(rows, ids, t0, t1)
    point["machine"] = sampler.figures()
    stats = proc_stats(daemon.proc.pid)
    point["daemon_rss_mb"] = stats["rss_mb"] if stats else None
    return point


# ---------------------------------------------------------------- the bench
def daemon_section(work: Path, backbone: str, backend: str) -> dict:
    """The daemon's settings: the default pipeline's (16-image batches, 20 ms wait, precision auto), with `backend`
    given (the configuration's default is torch, the default pipeline's auto: default_backend)."""
    cfg = live.daemon_section(f"ipc://{work}/daemon.sock", backbone, "cpu", 16, "auto")
    return {**cfg, "max_wait_ms": 20, "backend": backend}


def run_isa(isa: str, runs: list[tuple[str, bool]], filters: dict[str, float], args, doc: dict, save) -> None:
    """One daemon for this ISA, then each run's sweep against it."""
    work = Path(tempfile.mkdtemp(prefix=f"vlora-capacity-{isa}-", dir="/tmp"))
    sink_path = work / "results.jsonl"
    daemon_cfg = daemon_section(work, args.backbone, args.backend)
    every = [camera(f"{run_id(m, f)}-c{k}", kinds(m, args.max_streams)[k], filters if f else None)
             for m, f in runs for k in range(args.max_streams)]
    cfg = live.pipeline(daemon_cfg, [], sink_path)
    cfg["streams"] = every
    (work / "daemon.json").write_text(json.dumps(cfg))
    daemon = live.Child(["daemon", str(work / "daemon.json")], work / "daemon.log", AVX2_ENV if isa == "avx2" else None)
    t = time.monotonic()
    try:
        live.wait_daemon_ready(daemon, DAEMON_READY_TIMEOUT_S)
        say(f"{isa}: daemon ready after {time.monotonic() - t:.0f} s")
        startup = [line.split(" ", 3)[-1] for line in daemon.text().splitlines() if PRECISION_LINE.search(line)]
        sink = live.SinkRows(sink_path)
        for mix, filtering in runs:
            run = {"isa": isa, **sweep(work, daemon_cfg, sink, daemon, mix, filtering, filters, args.max_streams,
                                       args.step, args.settle, args.window, save, say),
                   "daemon_startup": startup[-6:]}
            doc["runs"] = [r for r in doc["runs"] if not (r["isa"] == isa and r["mix"] == mix
                                                          and r["filtering"] == filtering)] + [run]
            save()
    finally:
        code = live.stop_all([daemon], live.DAEMON_STOP_TIMEOUT_S)[0]
        if code not in (0, -15):
            doc.setdefault("daemon_exits", {})[isa] = {"code": code, "log_tail": daemon.text().splitlines()[-30:]}
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def table(doc: dict) -> str:
    lines = [f"# Capacity: cameras held ({doc['cpu']}, {doc['date']})", "",
             f"Cameras added one every {doc['step_s']} s until fewer than {live.HELD:.0%} of a {doc['window_s']:g}-s "
             "window's chunks are in deadline (both tasks' rows ok in time). Camera: detect (1 frame, 336 px) + "
             "activity (8 frames, 224 px) per 1-s chunk at 10 fps, live. busy = pedestrians.mp4; mixed = 1 busy + "
             f"quiet.mp4 cameras. Filter thresholds: {doc['filters']}. daemon.backend: {doc.get('backend', 'torch')}; "
             "what it chose per ISA: " + "; ".join(f"{isa}: {what}" for isa, what in chosen(doc).items()) + ".", "",
             "| ISA | mix | filtering | cameras held | at that N: in deadline, rows reused, cores busy "
             "| one more camera: in deadline (window, second window) |",
             "|---|---|---|---:|---|---|"]
    for r in doc["runs"]:
        held = [p for p in r["points"] if p.get("held")]
        at = held[-1] if held else None
        best = at if at is None or at.get("fraction", 0) >= live.HELD else at.get("second_window", at)
        at_text = "—" if at is None else (f"{best['fraction']:.1%} of {best['chunks_expected']}, "
                                          f"{best['reused_rows']} of {best['rows']}, "
                                          f"{best['machine']['host_cores_busy']}")
        nxt = next((p for p in r["points"] if not p.get("held")), None)
        if nxt is None:
            nxt_text = "max reached"
        elif "fraction" not in nxt:
            nxt_text = f"failed: {nxt['failed']}"
        else:
            second = nxt.get("second_window", {})
            nxt_text = f"{nxt['fraction']:.1%}" if "fraction" not in second else (
                f"{nxt['fraction']:.1%}, {second['fraction']:.1%} (shed {nxt['shed']}+{second['shed']}, late "
                f"{nxt['late']}+{second['late']})")
        lines.append(f"| {r['isa']} | {r['mix']} | {'on' if r['filtering'] else 'off'} | **{r['streams_held']}** | "
                     f"{at_text} | {nxt_text} |")
    ratios = doc.get("ratios", {})
    if ratios:
        lines += ["", "Filtering on / off, cameras held: "
                  + "; ".join(f"{k} {v}" for k, v in ratios.items()) + "."]
    return "\n".join(lines) + "\n"


def chosen(doc: dict) -> dict[str, str]:
    """Per ISA, the daemon's start-up line saying which backend and precision serve (its `daemon_startup`)."""
    out = {}
    for r in doc["runs"]:
        line = next((x for x in reversed(r.get("daemon_startup", [])) if "backbone precision" in x), "")
        out[r["isa"]] = line.split("startup: ", 1)[-1].strip() or "not logged"
    return out


def ratios(doc: dict) -> dict:
    held = {(r["isa"], r["mix"], r["filtering"]): r["streams_held"] for r in doc["runs"]}
    out = {}
    for (isa, mix, f), n in held.items():
        if f and (isa, mix, False) in held:
            off = held[(isa, mix, False)]
            out[f"{isa} {mix}"] = round(n / off, 2) if off else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", default="native,avx2")
    ap.add_argument("--mix", default="busy,mixed")
    ap.add_argument("--filtering", default="off,on")
    ap.add_argument("--max-streams", type=int, default=16)
    ap.add_argument("--backbone", default="dinov2-small", help="daemon.backbone (a model cache name or a path)")
    ap.add_argument("--backend", default=default_backend(),
                    help="daemon.backend (default: pipelines.yaml's, so the cameras run as `make run` does)")
    ap.add_argument("--step", type=float, default=STEP_S)
    ap.add_argument("--settle", type=float, default=SETTLE_S)
    ap.add_argument("--window", type=float, default=WINDOW_S)
    ap.add_argument("--thresholds", default="", help="task=threshold,... instead of the tuned ones")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the work dirs (configs, logs, the sink)")
    args = ap.parse_args(argv)
    if args.step < args.settle + args.window + live.MAX_DEADLINE_S + 1:
        ap.error(f"--step must cover settle + window + {live.MAX_DEADLINE_S + 1:g} s (the window's last deadlines)")
    mixes, filt = args.mix.split(","), [v == "on" for v in args.filtering.split(",")]
    runs = [(m, f) for m, f in RUNS if m in mixes and f in filt]
    given = dict(item.split("=") for item in args.thresholds.split(",") if item)  # overrides the tuned ones
    filters = {t["name"]: float(given[t["name"]]) if t["name"] in given else tuned_threshold(t["name"])
               for t in live.TASKS} if any(filt) else {}
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "backend": args.backend,
           "step_s": args.step, "settle_s": args.settle, "window_s": args.window, "held_at": live.HELD,
           "filters": filters, "runs": []}
    path = args.out / "capacity.json"

    def save() -> None:
        doc["ratios"] = ratios(doc)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(path)

    for isa in args.isa.split(","):
        run_isa(isa, runs, filters, args, doc, save)
    save()
    (args.out / "capacity.md").write_text(table(doc))
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
