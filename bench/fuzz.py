"""Long fuzz run (issue 14, item 1): a million hostile messages to a real daemon process, a valid stream between.

    python bench/fuzz.py                          # 1,000,000 messages (~13 min at ~1,300 msg/s on 2 cores)
    python bench/fuzz.py --messages 100000        # a shorter run
    python bench/fuzz.py --seconds 600            # stop after 10 minutes (or the message count, if first)
    python bench/fuzz.py --fresh-stream-rate 0    # valid messages only on a fixed pool of stream ids

The messages come from vlora_va/testing/messages.py (the generator tests/serving/test_fuzz.py sends 10^4 of in CI):
random bytes, truncated and extended headers, wrong types, huge and non-finite numbers in every field, deep
nesting, huge strings and arrays, missing and unknown fields, duplicated tasks, bad frame indices, extra,
missing and wrong-sized parts, too many parts, headers over the limit, parts over ZeroMQ's size limit (sent on
a throwaway socket: ZeroMQ cuts that peer off), unknown adapters, wrong frame sizes, and valid messages with
legal extremes. Every --live-every messages a chunk of the stream "live" is sent and the run waits for its rows.

Valid-wire messages are ~8% of the mix (--ok-weight scales the servable ones, which cost engine time), and by
default 10% of them name a stream id never seen before, so per-stream state in the daemon shows in its RSS.

The daemon runs as its own process (`vlora-va daemon CONFIG`, a tiny random-weight backbone built into a temp
dir), so its RSS (VmRSS / VmHWM), open file descriptors and threads, read from /proc/<pid>, are its alone.
Checked at the end: the daemon's malformed counter (Prometheus) and its log lines equal the malformed messages
sent; every request of every valid-wire message has exactly one row with a status it may have; every live
chunk was answered "ok", in deadline, with the payload a fresh engine computes; the daemon exits 0 on SIGTERM.
Writes bench/results/fuzz.json and bench/results/fuzz.md; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zmq  # noqa: E402

from vlora_va.common.logs import THROTTLE_PERIOD_S  # noqa: E402
from vlora_va.contracts.results import is_result  # noqa: E402
from vlora_va.testing.harness import free_port  # noqa: E402
from vlora_va.testing.messages import (  # noqa: E402
    ERROR_ROWS,
    KINDS,
    MALFORMED,
    OK,
    MessageGen,
    RowTail,
    Sender,
    make_seeing_detector,
    payload_difference,
    reference_payloads,
)

LIVE_TASKS = (("det", "seeing"), ("act", "actions"))
STALL_S = 60.0  # a send blocked this long, or a live chunk unanswered this long: the daemon stalled


# ---------------------------------------------------------------- the daemon process
def build_fixture(root: Path) -> tuple[Path, dict[str, Path]]:
    """The tiny backbone and adapters of vlora_va.testing.tiny, plus a detector whose rows carry detections."""
    from vlora_va.testing.tiny import make_adapters, make_backbone

    make_backbone(root / "backbone")
    adapters = {
        **make_adapters(root),
        "seeing": make_seeing_detector(root / "seeing"),
    }
    return root / "backbone", adapters


def write_config(root: Path, backbone: Path, adapters: dict, image_size: int, http_port: int) -> Path:
    text = f"""
daemon:
  endpoint: ipc://{root}/daemon.sock
  backbone: {backbone}
  image_size: {image_size}
  threads: 1
  max_wait_ms: 5
  http_port: {http_port}
  profile_cache: {root}/profiles
adapters:
""" + "".join(f"  {n}: {p}\n" for n, p in adapters.items()) + f"""
streams:
  - id: live
    source: unused.mp4
    tasks:
      - adapter: seeing
sinks:
  - type: jsonl
    path: {root}/results.jsonl
"""
    path = root / "pipeline.yaml"
    path.write_text(text)
    return path


class DaemonLog:
    """Reads the daemon's stderr on a thread: counts malformed-message lines and the throttle's summaries of
    the ones it did not log ("... and N more malformed messages"), keeps the last lines."""

    def __init__(self, stream):
        self.malformed = self.summarised = self.tracebacks = self.lines = 0
        self.ready = threading.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for raw in stream:
            self.lines += 1
            if b"malformed message rejected" in raw:
                self.malformed += 1
                continue
            line = raw.decode(errors="replace").rstrip()
            if m := re.search(r"\.\.\. and (\d+) more malformed messages", line):
                self.summarised += int(m.group(1))
            self.tail.append(line)
            if "Traceback" in line:
                self.tracebacks += 1
            if "daemon ready on" in line:
                self.ready.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def proc_sample(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    kb = {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
    return {"rss_mb": round(kb["VmRSS"] / 1024, 1), "peak_rss_mb": round(kb["VmHWM"] / 1024, 1),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": threads}


def scrape(port: int) -> dict[str, float]:
    """Sum of each Prometheus series by metric name (labels summed), and sink rows by outcome."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out: dict[str, float] = collections.defaultdict(float)
    for name, labels, value in re.findall(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", text, re.M):
        out[name] += float(value)
        m = re.search(r'outcome="(\w+)"', labels or "")
        if name == "vlora_sink_rows_total" and m:
            out[f"sink_rows_{m.group(1)}"] += float(value)
    return dict(out)


# ---------------------------------------------------------------- the run
def run(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="vlora-fuzz-"))
    backbone, adapters = build_fixture(tmp)
    port = free_port()
    cfg_path = write_config(tmp, backbone, adapters, args.image_size, port)
    gen = MessageGen(args.seed, args.image_size, tuple(adapters), ok_weight=args.ok_weight,
                     fresh_stream_rate=args.fresh_stream_rate)
    ref = reference_payloads(backbone, adapters, args.image_size, gen.live(0, LIVE_TASKS).parts)

    proc = subprocess.Popen([sys.executable, "-m", "vlora_va.cli", "daemon", str(cfg_path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dlog = DaemonLog(proc.stderr)
    try:
        if not dlog.ready.wait(600):
            proc.kill()
            raise SystemExit("daemon did not start:\n" + "\n".join(dlog.tail))
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDTIMEO, int(STALL_S * 1000))
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"ipc://{tmp}/daemon.sock")
        tail = RowTail(tmp / "results.jsonl", keep=False)

        books = Sender(ctx, push, f"ipc://{tmp}/daemon.sock", STALL_S)  # zmq.Again: the daemon stopped reading
        send, expected, allowed, sent = books.send, books.expected, books.allowed, books.sent
        mutations: collections.Counter = collections.Counter()
        live_waits: list[float] = []
        problems: list[str] = []

        def live(seq: int) -> None:
            t0 = time.monotonic()
            send(gen.live(seq, LIVE_TASKS))
            rows = tail.wait_for(seq, len(LIVE_TASKS), STALL_S)
            if len(rows) < len(LIVE_TASKS):
                raise RuntimeError(f"live chunk {seq} unanswered after {STALL_S} s "
                                   f"({sum(sent.values())} messages sent)")
            live_waits.append(time.monotonic() - t0)

        live(0)
        before = proc_sample(proc.pid)
        samples = [{"messages": 0, "s": 0.0, **before}]
        sample_every = max(1, args.messages // 20)
        t0 = time.monotonic()
        n = 0
        error = None
        try:
            while n < args.messages and not (args.seconds and time.monotonic() - t0 >= args.seconds):
                if n % args.live_every == 0 and n:
                    live(n // args.live_every)
                msg = next(gen)
                mutations[msg.mutation] += 1
                send(msg)
                n += 1
                if n % sample_every == 0:
                    samples.append({"messages": n, "s": round(time.monotonic() - t0, 1), **proc_sample(proc.pid)})
                    print(f"{n} messages, {n / (time.monotonic() - t0):.0f}/s, daemon {samples[-1]}", flush=True)
            live(n // args.live_every + 1)  # everything before it has been taken in (one socket: in order)
        except (RuntimeError, AssertionError, zmq.Again) as e:
            error = f"{type(e).__name__}: {e}"
            problems.append(f"the daemon stalled: {error}")
        elapsed = time.monotonic() - t0
        alive = proc.poll() is None
        after = proc_sample(proc.pid) if alive else {}
        metrics = scrape(port) if alive else {}
        seen = -1
        for _ in range(20):  # the log reader may trail the daemon a little
            if dlog.lines == seen:
                break
            seen = dlog.lines
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(180)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 180 s"
        dlog.join(10)
        push.close()
        ctx.term()

        # ---- checks
        if not alive:
            problems.append(f"the daemon died (exit {proc.returncode})")
        if rc != 0:
            problems.append(f"daemon exit status {rc} on SIGTERM")
        counted = int(metrics.get("vlora_messages_malformed_total", -1))
        if counted != sent[MALFORMED]:
            problems.append(f"daemon counted {counted} malformed messages, {sent[MALFORMED]} were sent")
        # Logged, throttled (vlora_va.common.logs.Throttle): a few lines per period and a count of the rest; the last
        # period's count is said only when another malformed message comes, so it may be missing here.
        said = dlog.malformed + dlog.summarised
        unsaid_bound = 2 * THROTTLE_PERIOD_S * sent[MALFORMED] / max(elapsed, 1e-9) + 1  # two periods' worth
        if not dlog.malformed or said > sent[MALFORMED] or said < sent[MALFORMED] - unsaid_bound:
            problems.append(f"daemon logged {dlog.malformed} malformed messages and summarised {dlog.summarised} more, "
                            f"{sent[MALFORMED]} were sent")
        chunks = int(metrics.get("vlora_chunks_received_total", -1))
        if chunks != sent[OK] + sent[ERROR_ROWS]:
            problems.append(f"daemon counted {chunks} chunks, {sent[OK] + sent[ERROR_ROWS]} valid-wire messages sent")
        if dlog.tracebacks:
            problems.append(f"{dlog.tracebacks} traceback(s) in the daemon's log")
        got: collections.Counter = collections.Counter()
        by_status: collections.Counter = collections.Counter()
        wrong_status = live_bad = live_rows = 0
        with open(tmp / "results.jsonl") as f:
            for line in f:
                r = json.loads(line)
                if not is_result(r):
                    continue  # event rows: a stream going offline while the fuzz runs
                key = (r["stream"], r["chunk"], r["task"])
                got[key] += 1
                by_status[r["status"]] += 1
                if r["status"] not in allowed.get(key, ()):
                    wrong_status += 1
                if r["stream"] == "live":
                    live_rows += 1
                    if not (r["status"] == "ok" and r["deadline_met"]) or payload_difference(r, ref[r["task"]]):
                        live_bad += 1
        missing, extra = sum((expected - got).values()), sum((got - expected).values())
        if missing or extra or wrong_status:
            problems.append(f"rows: {missing} missing, {extra} extra, {wrong_status} with a status they may not have")
        if live_bad:
            problems.append(f"{live_bad} live rows not ok, late, or not what a fresh engine computes")
        shutil.rmtree(tmp, ignore_errors=True)
        sink_dropped = int(metrics.get("sink_rows_dropped", 0))
        if sink_dropped:
            problems.append(f"the JSONL sink dropped {sink_dropped} rows")

        waits = sorted(live_waits)
        return {
            "date": time.strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "cpu": platform.processor() or
            platform.machine(), "cpu_count": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "args": vars(args), "messages": n, "seconds": round(elapsed, 1),
            "messages_per_s": round(n / elapsed, 1) if elapsed else None, "bytes_sent": books.bytes,
            "by_kind": {k: sent[k] for k in KINDS}, "by_mutation": dict(mutations.most_common()),
            "daemon": {"alive_at_end": alive, "exit_status": rc, "malformed_counted": counted,
                       "malformed_logged": dlog.malformed, "malformed_summarised": dlog.summarised, "chunks_counted": chunks, "log_lines": dlog.lines,
                       "tracebacks": dlog.tracebacks, "sink_rows_dropped": sink_dropped,
                       "log_tail": list(dlog.tail)[-10:]},
            "rows": {"expected": sum(expected.values()), "got": sum(got.values()), "missing": missing, "extra": extra,
                     "wrong_status": wrong_status, "by_status": dict(by_status)},
            "live": {"chunks": len(live_waits), "rows": live_rows, "bad_rows": live_bad,
                     "answer_ms": {"median": round(statistics.median(waits) * 1000, 1) if waits else None,
                                   "p99": round(waits[int(0.99 * (len(waits) - 1))] * 1000, 1) if waits else None,
                                   "max": round(waits[-1] * 1000, 1) if waits else None}},
            "process": {"before": before, "after": after}, "samples": samples,
            "problems": problems, "passed": not problems,
        }

    finally:  # whatever went wrong here, the daemon process does not outlive the run
        if proc.poll() is None:
            proc.kill()


def markdown(r: dict) -> str:
    b, a = r["process"]["before"], r["process"]["after"] or {}
    k = r["by_kind"]
    lines = [
        f"# Fuzz run ({r['date']}, {r['cpu_count']} cores, load {r['load_avg_1m_at_end']} at the end)", "",
        f"`python bench/fuzz.py --messages {r['args']['messages']} --seed {r['args']['seed']}` "
        f"(image {r['args']['image_size']} px, ok weight {r['args']['ok_weight']}, "
        f"fresh stream ids {r['args']['fresh_stream_rate']:.0%} of valid-wire messages)", "",
        "| messages | msg/s | malformed | error-rows | ok | cut off by ZeroMQ | live chunks (answer ms median / max) "
        "| RSS MB before → after (peak) | fds | threads | checks |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {r['messages']:,} | {r['messages_per_s']:,.0f} | {k['malformed']:,} | {k['error-rows']:,} | {k['ok']:,} "
        f"| {k['disconnect']:,} | {r['live']['chunks']} ({r['live']['answer_ms']['median']} / "
        f"{r['live']['answer_ms']['max']}) | {b['rss_mb']} → {a.get('rss_mb')} ({a.get('peak_rss_mb')}) "
        f"| {b['fds']} → {a.get('fds')} | {b['threads']} → {a.get('threads')} "
        f"| {'all passed' if r['passed'] else '; '.join(r['problems'])} |", "",
        "RSS over the run (MB): " + ", ".join(f"{s['messages']:,}: {s['rss_mb']}" for s in r["samples"]), "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--image-size", type=int, default=56, help="the daemon's image_size (a multiple of 14)")
    ap.add_argument("--live-every", type=int, default=500)
    ap.add_argument("--ok-weight", type=float, default=0.1,
                    help="how often servable messages come, relative to the test's mix (they cost engine time)")
    ap.add_argument("--fresh-stream-rate", type=float, default=0.1,
                    help="share of valid-wire messages with a stream id never seen before")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    r = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fuzz.json").write_text(json.dumps(r, indent=1) + "\n")
    (out / "fuzz.md").write_text(markdown(r))
    print(markdown(r))
    return 0 if r["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
