"""Cluster mode on this machine (issue 30): failover time, and streams held by one and by two daemons; and across
hosts (issue 47: network namespaces, scripts/hosts.sh; root only).

    python bench/cluster.py                       # failover and held
    python bench/cluster.py --part failover --repeats 5
    python bench/cluster.py --part held --streams 1,2,3 --seconds 40
    sudo python bench/cluster.py --part hosts --repeats 3
    sudo python bench/cluster.py --part hosts-held --streams 4,5,6 --seconds 40

failover  A local Ray instance, two daemon actors on the tiny backbone, four streams over two adapters (the test's
          setup). Once rows flow, the daemon serving s0 is killed with SIGKILL. Measured per repeat: the controller
          noticing (kill -> the daemon marked lost), and per moved stream the failover time: kill -> the first ok
          row the surviving daemon served for it (the collector's clock). Also: chunks sent, "daemon lost" rows,
          duplicates (must be 0), chunks without a row (must be 0). Goal: failover <= 10 s.
held      The default pipeline's surveillance stream (pedestrians: tracked detection + 8-frame activity, real
          backbone, the shipped adapters), N copies paced like cameras, on `daemons: 1` (threads 2) and on
          `daemons: 2` (threads 1 each), both through the cluster controller. A count of streams is held when >= 99%
          of its rows met their deadline. Two daemons on one 2-core machine share the same two cores: this measures
          the cost of splitting, not a second machine's gain.
hosts     Four hosts (vlora_va/testing/hosts_topology.py: the run on h0, ingest on h1, daemon a on h2, b on h3).
          Node loss, per repeat: once both daemons serve, every process of h2 is killed; per moved stream the
          failover time: kill -> this bench reads the first ok row daemon b served for it; chunks without a row and
          duplicates (both must be 0). Partition, once: h3's link down for 20 s, then up: when b's streams were
          served by a, when b served again after the heal, "daemon lost" rows, duplicates, chunks without a row.
hosts-held Streams held by one daemon host and by two, each daemon host pinned to a core of its own (hosts.sh cpus:
          h2 on the first CPU, h3 on the second), the run and ingest unpinned on h0 and h1. N live cameras (the
          pedestrians video paced like a camera, 1 frame per 1-s chunk, the shipped detect adapter, OpenVINO int8,
          one thread, deadline 2 s, ingest drop_oldest) on daemon a alone, and 2N on a and b. A count is held when
          >= 99% of the chunks ingest made (sent + dropped, its own books) have an ok row in deadline. On a 2-core
          machine the two daemon hosts take both cores, so ingest and the run compete with them: the ratio is a
          floor for hosts that do not share cores.
Writes bench/results/cluster.json and cluster.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from vlora_va.testing.host import cpu_name

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"




def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def books(rows: list[dict], sent: dict[str, int]) -> dict:
    """Chunks sent, duplicate rows and chunks without a row (harness.row_books, counted), "daemon lost" rows."""
    from vlora_va.testing.harness import row_books

    b = row_books(rows, sent)
    return {"chunks_sent": sum(sent.values()), "duplicates": sum(n - 1 for n in b["duplicates"].values()),
            "missing": sum(len(m) for m in b["missing"].values()),
            "lost_rows": sum(1 for r in rows if r["status"] == "error")}


def run_controller(config, during=None, timeout_s: float = 600.0):
    """Start, watch until the sources end (during(controller) each round), shut down; the controller."""
    from vlora_va.cluster.controller import Controller

    c = Controller(config, "local", log_level="WARNING")
    try:
        c.start()
        deadline = time.monotonic() + timeout_s
        while not c.sources_ended() and time.monotonic() < deadline:
            c.step()
            if during is not None:
                during(c)
            time.sleep(0.1)
        c.last_snapshot = __import__("ray").get(c.collector.snapshot.remote())
        c.shutdown()
    finally:
        c.close()
    return c


# ---------------------------------------------------------------- failover
def failover_once(tmp: Path, backbone: Path, adapters: dict) -> dict:
    from vlora_va.contracts.config import load_config
    from vlora_va.testing.tiny import TINY_IMAGE

    # the tests' setup (tests/cluster/test_cluster.py): the bikes video paced at 4 fps, 0.5-s chunks, one frame each
    streams = [{"id": f"s{i}", "source": str(ROOT / "sample_videos" / "bikes.mp4"), "fps": 4, "chunk_seconds": 0.5,
                "loop": True, "max_chunks": 60,
                "tasks": [{"name": "det", "adapter": "a1" if i < 2 else "a2", "frames_per_chunk": 1,
                           "deadline_ms": 30000}]} for i in range(4)]
    cfg = {"daemon": {"endpoint": "tcp://127.0.0.1:5555", "backbone": str(backbone), "image_size": TINY_IMAGE,
                      "threads": 1, "max_wait_ms": 5, "profile_cache": str(tmp.parent / "profiles")},
           "ingest": {"streams_per_worker": 1, "drop_policy": "block"},
           "adapters": {n: str(p) for n, p in adapters.items()}, "streams": streams,
           "sinks": [{"type": "jsonl", "path": str(tmp / "results.jsonl"), "fsync": "never"}],
           "cluster": {"daemons": 2}}
    (tmp / "pipeline.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    config = load_config(tmp / "pipeline.yaml")
    state: dict = {}

    def during(c):
        import ray

        if "killed" not in state and ray.get(c.collector.snapshot.remote())["rows"] >= 20:
            state["victim"] = c.assignment["s0"]
            state["moved"] = [s for s, d in c.assignment.items() if d == state["victim"]]
            state["killed"] = time.time()
            os.kill(c.daemons[state["victim"]].info["pid"], signal.SIGKILL)
        elif "killed" in state and "noticed" not in state and not c.daemons[state["victim"]].alive:
            state["noticed"] = time.time()

    c = run_controller(config, during)
    snap = c.last_snapshot
    survivor = next(n for n in c.daemons if n != state["victim"])
    failover = {s: snap["first_served"].get(s, {}).get(survivor, float("nan")) - state["killed"]
                for s in state["moved"]}
    results = [r for r in rows_of(tmp / "results.jsonl") if r["type"] == "result"]
    sent = {s: p["stats"]["chunks_sent"] for s, p in c.ingest_report.items()}
    return {"noticed_s": state["noticed"] - state["killed"], "failover_s": failover, **books(results, sent)}


def bench_failover(repeats: int) -> dict:
    import ray

    from vlora_va.testing.tiny import make_adapter, make_backbone

    runs = []
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        backbone = make_backbone(root / "backbone")
        adapters = {"a1": make_adapter(root / "a1", "detection", ["person"], seed=1),
                    "a2": make_adapter(root / "a2", "detection", ["car"], seed=2)}
        ray.init(num_cpus=2, resources={"vlora_daemon": 3}, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False)
        try:
            for i in range(repeats):
                tmp = root / f"run{i}"
                tmp.mkdir()
                runs.append(failover_once(tmp, backbone, adapters))
                print(f"failover run {i}: {runs[-1]}", flush=True)
        finally:
            ray.shutdown()
    per_stream = [t for r in runs for t in r["failover_s"].values()]
    return {"runs": runs, "median_failover_s": statistics.median(per_stream), "max_failover_s": max(per_stream),
            "median_noticed_s": statistics.median(r["noticed_s"] for r in runs), "goal_s": 10.0,
            "met": max(per_stream) <= 10.0 and all(r["duplicates"] == 0 and r["missing"] == 0 for r in runs)}


# ---------------------------------------------------------------- across hosts (issue 47)
def node_loss_once(tmp: Path, backbone: Path, adapters: dict) -> dict:
    from vlora_va.testing import hosts_topology as ht

    run = ht.HostsRun(ht.pipeline(tmp, backbone, adapters, chunks=60))
    try:
        loss = ht.lose_host(run, 2, "a", "b")
        code = run.finish()
    finally:
        run.kill()
        ht.hosts("heal", "2")
    return {"exit": code, "failover_s": {s: round(t, 2) for s, t in loss["failover_s"].items()},
            **books(run.rows, ht.ingest_sent(run.log()))}


def partition_once(tmp: Path, backbone: Path, adapters: dict, seconds: float = 20.0) -> dict:
    from vlora_va.testing import hosts_topology as ht

    run = ht.HostsRun(ht.pipeline(tmp, backbone, adapters, chunks=150, curve=True))
    try:
        cut = ht.cut_host(run, 3, "b", "a", seconds)
        code = run.finish()
    finally:
        run.kill()
    dropped = re.findall(r"collector: \d+ rows to the sinks, (\d+) duplicates dropped", run.log())
    return {"exit": code, "cut_s": seconds, "moved_after_s": cut["moved_after_s"],
            "back_after_heal_s": cut["back_after_heal_s"],
            "duplicates_dropped_by_collector": int(dropped[-1]) if dropped else None,
            **books(run.rows, ht.ingest_sent(run.log()))}


def bench_hosts(repeats: int) -> dict:
    from vlora_va.testing import hosts_topology as ht
    from vlora_va.testing.tiny import make_adapter, make_backbone

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        backbone = make_backbone(root / "backbone")
        adapters = {"a1": make_adapter(root / "a1", "detection", ["person"], seed=1),
                    "a2": make_adapter(root / "a2", "detection", ["car"], seed=2)}
        ht.hosts("up", str(ht.N_HOSTS))
        try:
            runs = []
            for i in range(repeats):
                (root / f"loss{i}").mkdir()
                runs.append(node_loss_once(root / f"loss{i}", backbone, adapters))
                print(f"node loss run {i}: {runs[-1]}", flush=True)
            (root / "cut").mkdir()
            partition = partition_once(root / "cut", backbone, adapters)
            print(f"partition: {partition}", flush=True)
        finally:
            ht.hosts("down")
    per_stream = [t for r in runs for t in r["failover_s"].values()]
    return {"node_loss": runs, "median_failover_s": statistics.median(per_stream), "max_failover_s": max(per_stream),
            "goal_s": 10.0, "partition": partition,
            "met": max(per_stream) <= 10.0 and all(r["duplicates"] == 0 and r["missing"] == 0
                                                   for r in [*runs, partition])}


def hosts_held_once(tmp: Path, streams: int, daemons: int, seconds: int) -> dict:
    """One run of `streams` cameras on `daemons` daemon hosts (h2; h3); what ingest made against the rows."""
    from vlora_va.testing import hosts_topology as ht

    cams = [ht.live_camera(f"cam{i}", ht.PEDESTRIANS, 1, 1, seconds, 2000) for i in range(streams)]
    config = ht.camera_pipeline(tmp, cams, daemons, {"streams_per_worker": 4, "drop_policy": "drop_oldest"})
    run = ht.HostsRun(config)
    try:
        code = run.finish(timeout=seconds + 600)
    finally:
        run.kill()
    made = {sid: sent + dropped for sid, (sent, dropped) in ht.ingest_counts(run.log()).items()}
    good = sum(r["status"] == "ok" and r["deadline_met"] for r in run.rows)
    return {"exit": code, "daemons": daemons, "streams": streams, "made": sum(made.values()), "rows": len(run.rows),
            "in_deadline": good / max(1, sum(made.values())),
            "status": dict(collections.Counter(r["status"] for r in run.rows))}


def bench_hosts_held(counts: list[int], seconds: int) -> dict:
    """Each count on one daemon host, twice it on two: the most held by each."""
    from vlora_va.testing import hosts_topology as ht

    cpus = sorted(os.sched_getaffinity(0))
    ht.hosts("up", str(ht.N_HOSTS))
    try:
        ht.hosts("cpus", "2", str(cpus[0]))
        ht.hosts("cpus", "3", str(cpus[-1]))
        out = {}
        for daemons in (1, 2):
            for n in counts:
                with tempfile.TemporaryDirectory() as d:
                    r = hosts_held_once(Path(d), n * daemons, daemons, seconds)
                out[f"{daemons}x{n * daemons}"] = r
                print(f"hosts-held: {r}", flush=True)
    finally:
        ht.hosts("down")
    return summarise_hosts_held(out, seconds)


def summarise_hosts_held(runs: dict, seconds: int) -> dict:
    """The most streams held by one daemon host and by two: the largest count at >= 99% below which every count
    tried also held (one failed count caps it)."""
    held = {}
    for d in (1, 2):
        tried = sorted((r["streams"], r["in_deadline"] >= 0.99) for r in runs.values() if r["daemons"] == d)
        first_miss = next((n for n, ok in tried if not ok), None)
        held[d] = max([0] + [n for n, ok in tried if ok and (first_miss is None or n < first_miss)])
    return {"runs": runs, "held": held, "seconds": seconds, "ratio": (held[2] / held[1]) if held[1] else None}


# ---------------------------------------------------------------- streams held
def held_config(tmp: Path, streams: int, daemons: int, seconds: int):
    from vlora_va.contracts.config import load_config

    base = yaml.safe_load((ROOT / "pipelines.yaml").read_text())
    cam = next(s for s in base["streams"] if s["id"] == "pedestrians")
    cam = {**cam, "source": str(ROOT / cam["source"]), "loop": True, "max_chunks": seconds, "snapshots": False}
    base["streams"] = [{**cam, "id": f"cam{i}"} for i in range(streams)]
    base["adapters"] = {n: str(ROOT / p) for n, p in base["adapters"].items()}
    base["daemon"].update({"http_port": 0, "threads": 2 // daemons})
    base["sinks"] = [{"type": "jsonl", "path": str(tmp / "results.jsonl"), "fsync": "never"}]
    base["cluster"] = {"daemons": daemons}
    base.pop("snapshots", None)
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return load_config(path)


def bench_held(counts: list[int], seconds: int) -> dict:
    import ray

    out = {}
    for daemons in (1, 2):
        ray.init(num_cpus=2, resources={"vlora_daemon": daemons}, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False)
        try:
            for n in counts:
                with tempfile.TemporaryDirectory() as d:
                    tmp = Path(d)
                    run_controller(held_config(tmp, n, daemons, seconds))
                    results = [r for r in rows_of(tmp / "results.jsonl") if r["type"] == "result"]
                met = sum(r["deadline_met"] for r in results)
                by_status = collections.Counter(r["status"] for r in results)
                out[f"{daemons}x{n}"] = {"daemons": daemons, "streams": n, "rows": len(results),
                                         "in_deadline": met / max(1, len(results)), "status": dict(by_status)}
                print(f"held: {daemons} daemon(s), {n} stream(s): {out[f'{daemons}x{n}']}", flush=True)
        finally:
            ray.shutdown()
    held = {d: max([0] + [r["streams"] for r in out.values() if r["daemons"] == d and r["in_deadline"] >= 0.99])
            for d in (1, 2)}
    return {"runs": out, "held": held, "seconds": seconds,
            "scaling_efficiency": (held[2] / (2 * held[1])) if held[1] else None}


def run_cells(r: dict) -> str:
    """A failover run's table cells: failover per moved stream, chunks sent, 'daemon lost' rows, duplicates,
    chunks without a row."""
    per = ", ".join(f"{s} {t:.2f}" for s, t in sorted(r["failover_s"].items()))
    return f"{per} | {r['chunks_sent']} | {r['lost_rows']} | {r['duplicates']} | {r['missing']}"


def write_results(result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cluster.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Cluster mode on one machine ({result['cpu']}, {result['date']})", ""]
    f = result.get("failover")
    if f:
        lines += ["## Failover (tiny backbone, 2 daemons, 4 streams, one daemon SIGKILLed)", "",
                  "| run | noticed (s) | failover per moved stream (s) | chunks sent | 'daemon lost' rows | "
                  "duplicates | chunks without a row |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(f["runs"]):
            lines.append(f"| {i} | {r['noticed_s']:.2f} | {run_cells(r)} |")
        lines += ["", f"Median failover {f['median_failover_s']:.2f} s (max {f['max_failover_s']:.2f} s; goal <= "
                      f"{f['goal_s']:.0f} s: {'met' if f['met'] else 'NOT met'}); the death noticed after "
                      f"{f['median_noticed_s']:.2f} s (median).", ""]
    hh = result.get("hosts")
    if hh:
        lines += ["## Across hosts (network namespaces: the run on h0, ingest on h1, daemons on h2 and h3)", "",
                  "| node loss run | failover per moved stream (s) | chunks sent | 'daemon lost' rows | duplicates | "
                  "chunks without a row |", "|---|---|---|---|---|---|"]
        for i, r in enumerate(hh["node_loss"]):
            lines.append(f"| {i} | {run_cells(r)} |")
        p = hh["partition"]
        lines += ["", f"Node loss: median failover {hh['median_failover_s']:.2f} s (max {hh['max_failover_s']:.2f} s; "
                      f"goal <= {hh['goal_s']:.0f} s: {'met' if hh['met'] else 'NOT met'}).", "",
                  f"Partition (h3's link down {p['cut_s']:.0f} s, CURVE on every link): its streams served by a "
                  f"{p['moved_after_s']:.1f} s after the cut, {p['lost_rows']} 'daemon lost' rows, "
                  f"{p['duplicates_dropped_by_collector']} late rows dropped by the collector, b serving again "
                  f"{p['back_after_heal_s']:.1f} s after the heal; {p['chunks_sent']} chunks sent, "
                  f"{p['duplicates']} duplicates, {p['missing']} without a row.", ""]
    hs = result.get("hosts_held")
    if hs:
        lines += ["## Streams held across hosts (a core per daemon host; >= 99% of the chunks ingest made answered "
                  f"ok in deadline; {hs['seconds']} s per run, live cameras at 1 frame/s, real backbone)", "",
                  "| daemon hosts | streams | chunks made | rows | in deadline | statuses |", "|---|---|---|---|---|---|"]
        for r in sorted(hs["runs"].values(), key=lambda r: (r["daemons"], r["streams"])):
            lines.append(f"| {r['daemons']} | {r['streams']} | {r['made']} | {r['rows']} | {r['in_deadline']:.1%} | "
                         f"{r['status']} |")
        held = {int(k): v for k, v in hs["held"].items()}
        ratio = hs["ratio"]
        lines += ["", f"Held: one daemon host {held[1]}, two {held[2]} "
                      f"({'n/a' if ratio is None else f'{ratio:.2f}x'}; the run and ingest share the same two cores).",
                  ""]
    h = result.get("held")
    if h:
        lines += [f"## Streams held (>= 99% of rows in deadline; {h['seconds']} s per run, the default surveillance "
                  "stream, real backbone)", "",
                  "| daemons | streams | rows | in deadline | rows in deadline per second | statuses |",
                  "|---|---|---|---|---|---|"]
        for r in h["runs"].values():
            lines.append(f"| {r['daemons']} | {r['streams']} | {r['rows']} | {r['in_deadline']:.1%} | "
                         f"{r['rows'] * r['in_deadline'] / h['seconds']:.2f} | {r['status']} |")
        eff = h["scaling_efficiency"]
        held = {int(k): v for k, v in h["held"].items()}  # JSON keys are strings
        most = max(r["streams"] for r in h["runs"].values())
        served = {r["daemons"]: r["rows"] * r["in_deadline"] / h["seconds"] for r in h["runs"].values()
                  if r["streams"] == most}
        lines += ["", f"Held: one daemon {held[1]}, two daemons {held[2]} (scaling efficiency "
                      f"{'n/a' if eff is None else f'{eff:.0%}'}): both share this machine's 2 cores, so two daemons "
                      f"have one core each."]
        if len(served) == 2 and served[1]:
            lines += [f"Saturated ({most} streams): two daemons serve {served[2]:.2f} rows in deadline per second, one "
                      f"daemon {served[1]:.2f} ({served[2] / served[1]:.2f}x)."]
        lines.append("")
    (RESULTS / "cluster.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("all", "failover", "held", "hosts", "hosts-held"), default="all",
                    help="all: failover and held (hosts and hosts-held need root: ask for them by name)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", default="1,2,3")
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--render", action="store_true", help="only rewrite cluster.md from cluster.json")
    args = ap.parse_args()
    old = json.loads((RESULTS / "cluster.json").read_text()) if (RESULTS / "cluster.json").is_file() else {}
    if args.render:
        write_results(old)
        print((RESULTS / "cluster.md").read_text())
        return 0
    result = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    if args.part in ("all", "failover"):
        result["failover"] = bench_failover(args.repeats)
    elif "failover" in old:
        result["failover"] = old["failover"]
    if args.part == "hosts":
        result["hosts"] = bench_hosts(args.repeats)
    elif "hosts" in old:
        result["hosts"] = old["hosts"]
    if args.part == "hosts-held":
        result["hosts_held"] = bench_hosts_held([int(x) for x in args.streams.split(",")], args.seconds)
        before = old.get("hosts_held")
        if before and before["seconds"] == args.seconds:  # counts tried in an earlier run stay in the table
            result["hosts_held"] = summarise_hosts_held({**before["runs"], **result["hosts_held"]["runs"]},
                                                        args.seconds)
    elif "hosts_held" in old:
        result["hosts_held"] = old["hosts_held"]
    if args.part in ("all", "held"):
        result["held"] = bench_held([int(x) for x in args.streams.split(",")], args.seconds)
    elif "held" in old:
        result["held"] = old["held"]
    write_results(result)
    print((RESULTS / "cluster.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
