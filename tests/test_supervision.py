"""Issue 14, items 3 and 5, and issue 13's reload: `vlora-va run` (a real supervisor, daemon and ingest processes,
real ZeroMQ sockets, the sample video) on the tiny random-weight backbone, so each test takes seconds, not minutes.

Faults: an ingest worker or the daemon killed with SIGKILL is started again and the streams go on; the rows say
what was lost (nothing is answered twice). Reload: SIGHUP applies the edited pipeline file. Shutdown: SIGTERM
under load answers every request the daemon received and exits 0; a second Ctrl-C drains at once. Every test
that survives a fault ends by checking that the daemon still serves a valid chunk correctly (`probe`)."""

from __future__ import annotations

import math
import os
import re
import signal
import time

import pytest

from tests.pipeline_helpers import Run, accounting, ingest_sent, probe, stopped_counts, tiny_pipeline, write
from vlora_va.testing.messages import make_seeing_detector
from vlora_va.testing.tiny import TINY_IMAGE, make_adapter

DET = [("det", "seeing")]


@pytest.fixture(scope="module")
def seeing(tmp_path_factory):
    """A detector for the tiny backbone whose rows carry detections (results worth comparing)."""
    return make_seeing_detector(tmp_path_factory.mktemp("seeing") / "seeing")


def curve_keys(tmp_path) -> dict:
    """security: for a pipeline that authenticates every ZeroMQ link (`vlora-va keys`)."""
    from vlora_va.contracts.security import create_keys

    k = create_keys(tmp_path / "keys")
    return {"curve": {"server_secret": str(k["server.key_secret"]), "server_public": str(k["server.key"]),
                      "client_secret": str(k["client.key_secret"]), "client_public": str(k["client.key"])}}


def daemon_held_chunks(cfg: dict) -> int:
    """Chunks the daemon may hold read but unanswered: its queue bound (vlora_va/serving/daemon.py QUEUE_BATCHES batches
    of max_batch_images; one image per chunk here), plus one batch being computed."""
    from vlora_va.serving.daemon import QUEUE_BATCHES

    batch = cfg["daemon"].get("max_batch_images", 16)
    return QUEUE_BATCHES * batch + batch


def inflight_bound(cfg: dict) -> int:
    """What one worker's stream can lose, unreported, when the daemon dies (README, Reliability): ZeroMQ's queue
    in the worker (ZMQ_SNDHWM) and in the daemon (RCVHWM 4), the kernel's socket buffers (SNDBUF doubled by
    Linux; an ipc endpoint has no receive buffer of its own), what the daemon had read, and one message cut in
    the middle."""
    from vlora_va.ingest.worker import MIN_SNDBUF, ZMQ_SNDHWM

    chunk = TINY_IMAGE * TINY_IMAGE * 3  # one frame per chunk
    kernel = 2 * max(MIN_SNDBUF, chunk)
    return ZMQ_SNDHWM + 4 + math.ceil(kernel / chunk) + daemon_held_chunks(cfg) + 1


def test_a_killed_ingest_worker_is_restarted_and_its_stream_goes_on(tmp_path, tiny_backbone_dir, seeing):
    adapters = {"seeing": seeing}
    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, adapters, [{"id": "a"}, {"id": "b"}])
    run = Run(write(tmp_path / "pipeline.yaml", cfg))
    try:
        run.wait_rows(lambda r: r["stream"] == "a", 3)
        mark = len(run.log())
        victim, other = run.pid("ingest worker 0"), run.pid("ingest worker 1")
        os.kill(victim, signal.SIGKILL)
        run.wait_log(r"ingest worker 0 \(streams a\) died \(killed by SIGKILL\); restarting it in 0\.5 s", after=mark)
        restarted = run.pid("ingest worker 0", after=mark)
        assert restarted != victim
        # The stream goes on where it was: chunk numbers continue, the time down is reported as an outage.
        resumed = run.wait_rows(lambda r: r["stream"] == "a" and r.get("outage_before_s"))[0]
        run.wait_rows(lambda r: r["stream"] == "a" and r["chunk"] > resumed["chunk"], 3)
        probe(cfg, tiny_backbone_dir, adapters, 0, DET, run)
        assert run.pid("ingest worker 1") == other  # the other worker was not touched
        assert run.finish() == 0
    finally:
        run.close()
    log, rows = run.log(), run.rows()
    a, b = accounting(rows, "a"), accounting(rows, "b")
    assert all(r["status"] == "ok" for r in rows)
    # What the dead worker had made but not sent is reported (dropped_before); only what it had already handed
    # to ZeroMQ can be lost unreported: its queue (ZMQ_SNDHWM) and one message cut in the middle.
    from vlora_va.ingest.worker import ZMQ_SNDHWM

    assert 0 <= a["lost"] <= ZMQ_SNDHWM + 1, a
    assert b["lost"] == 0 and not re.search(r"stream b: resumed", log)  # the other worker was not touched
    assert "supervisor: 0 daemon restart(s), 1 ingest worker restart(s)" in log


def test_a_killed_daemon_is_restarted_and_ingest_reconnects(tmp_path, tiny_backbone_dir, seeing):
    """Worst case for what is in flight: the daemon is frozen (SIGSTOP) for 3 s before the SIGKILL, so ingest has
    filled every queue between them. The counts then say what was dropped: ingest's drops while the daemon was
    down arrive as dropped_before, and what was lost in flight, unreported, stays within the stated bound."""
    adapters = {"seeing": seeing}
    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, adapters, [{"id": "a"}, {"id": "b"}])
    run = Run(write(tmp_path / "pipeline.yaml", cfg))
    try:
        run.wait_rows(lambda r: r["stream"] == "b", 3)
        mark = len(run.log())
        workers = run.pid("ingest worker 0"), run.pid("ingest worker 1")
        daemon = run.pid("daemon")
        before = len(run.rows())
        os.kill(daemon, signal.SIGSTOP)
        time.sleep(3)  # the fault itself: a hung daemon (nothing here waits on it)
        os.kill(daemon, signal.SIGKILL)
        run.wait_log(r"the daemon died \(killed by SIGKILL\)", after=mark)
        run.wait_log(r"daemon restarted and ready \(restart 1\)", after=mark)
        for sid in ("a", "b"):  # both streams are served again, by the new daemon
            run.wait_rows(lambda r, sid=sid: r["stream"] == sid and r.get("dropped_before"), 1)
        assert len(run.rows()) > before
        probe(cfg, tiny_backbone_dir, adapters, 0, DET, run)
        assert (run.pid("ingest worker 0"), run.pid("ingest worker 1")) == workers  # ingest kept running
        assert run.finish() == 0
    finally:
        run.close()
    log, rows = run.log(), run.rows()
    sent = ingest_sent(log)
    bound = inflight_bound(cfg)
    for sid in ("a", "b"):
        acc = accounting(rows, sid)
        assert acc["reported"] > 0, acc  # ingest dropped while the daemon was down, and said so
        assert 0 <= acc["lost"] <= bound, (sid, acc["lost"], bound)
        assert 0 <= sent[sid] - len(acc["chunks"]) <= bound, (sid, sent[sid], len(acc["chunks"]))
    print(f"daemon SIGKILL after 3 s frozen: lost in flight a={accounting(rows, 'a')['lost']}, "
          f"b={accounting(rows, 'b')['lost']} (bound {bound})")
    assert "supervisor: 1 daemon restart(s), 0 ingest worker restart(s)" in log


def test_sighup_applies_streams_and_adapters_and_refuses_an_invalid_file(tmp_path, tiny_backbone_dir, seeing,
                                                                        tiny_adapters):
    extra = make_adapter(tmp_path / "extra", "action", ["standing", "walking"], targets=("attention.q_proj",),
                         seed=21)
    adapters = {"seeing": seeing, "extra": extra}
    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, {"seeing": seeing}, [{"id": "a"}, {"id": "b"}, {"id": "d"}],
                        security=curve_keys(tmp_path))  # the adapters go through the CURVE control socket
    path = write(tmp_path / "pipeline.yaml", cfg)
    run = Run(path)
    try:
        run.wait_rows(lambda r: r["stream"] == "d", 2)
        untouched = run.pid("ingest worker 0")  # stream a
        # 1. add an adapter and a stream that uses it, change b (a second task on the new adapter), remove d
        mark = len(run.log())
        cfg["adapters"]["extra"] = str(extra)
        act = {"name": "act", "adapter": "extra", "frames_per_chunk": 2, "deadline_ms": 30000}
        b, d = cfg["streams"][1], cfg["streams"].pop(2)
        b["tasks"].append(act)
        cfg["streams"].append(dict(d, id="c", tasks=[*d["tasks"], act]))
        write(path, cfg)
        run.send(signal.SIGHUP)
        run.wait_log(r"reloading .*: streams \+\['c'\] -\['d'\] ~\['b'\]; adapters \+\['extra'\] -\[\] ~\[\]", after=mark)
        run.wait_log(r"reload: adapter extra loaded", after=mark)
        run.wait_log(r"ingest worker 2 \(streams d\) stopped \(exit code 0\)", after=mark)
        run.wait_rows(lambda r: r["stream"] == "c" and r["task"] == "act" and r["status"] == "ok", 2)
        run.wait_rows(lambda r: r["stream"] == "b" and r["task"] == "act" and r["status"] == "ok", 2)
        # 2. a file that does not validate is refused, and nothing changes
        mark = len(run.log())
        good = path.read_text()
        path.write_text(good.replace("adapter: extra", "adapter: nosuch", 1))
        run.send(signal.SIGHUP)
        run.wait_log(r"SIGHUP: .*pipeline\.yaml:\d+: streams\[1\]\.tasks\[1\]\.adapter: unknown adapter 'nosuch'.*"
                     r"not reloaded: the running pipeline is unchanged", after=mark)
        n = len(run.rows())
        run.wait_rows(lambda r: True, n + 6)  # still serving
        # 3. remove the adapter again, and what used it
        mark = len(run.log())
        b["tasks"].pop()
        cfg["streams"].pop()  # c
        del cfg["adapters"]["extra"]
        write(path, cfg)
        run.send(signal.SIGHUP)
        run.wait_log(r"reload: adapter extra unloaded", after=mark)
        probe(cfg, tiny_backbone_dir, adapters, 0, DET, run)
        assert run.pid("ingest worker 0") == untouched
        assert run.finish() == 0
    finally:
        run.close()
    log, rows = run.log(), run.rows()
    assert not [r for r in rows if r["status"] != "ok"], [r for r in rows if r["status"] != "ok"][:3]
    sent = ingest_sent(log)
    for sid in ("a", "b", "c", "d"):
        acc = accounting(rows, sid)
        # Stopping and starting workers loses nothing unreported, and no chunk number is used twice (b's new
        # worker went on from where its old one stopped).
        assert acc["lost"] == 0 and len(acc["chunks"]) == sent[sid], (sid, acc["lost"], sent[sid])
    assert not re.search(r"stream a: resumed", log)  # undisturbed (same worker, checked above)
    b_worker = re.findall(r"ingest worker (\d+) \(pid \d+\): streams b", log)
    assert len(set(b_worker)) == 3  # b moved to a new worker with its new task, and again without it
    assert re.search(r"stream b: resumed by a new ingest worker at chunk [1-9]", log)


def test_sigterm_under_load_answers_every_request_and_exits_0(tmp_path, tiny_backbone_dir, seeing):
    """Three streams read as fast as the daemon takes them (best effort) keep it busy, over CURVE; SIGTERM to the
    supervisor alone (as a service manager sends it) must end with every chunk ingest sent received, every request
    the daemon received answered in the flushed sink, and exit code 0."""
    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, {"seeing": seeing},
                        [{"id": f"s{i}", "realtime": False, "fps": 10} for i in range(3)],
                        security=curve_keys(tmp_path))  # ingest as CURVE clients
    run = Run(write(tmp_path / "pipeline.yaml", cfg))
    try:
        run.wait_rows(lambda r: True, 60)
        assert run.finish(signal.SIGTERM, group=False) == 0
    finally:
        run.close()
    log, rows = run.log(), run.rows()
    counts = stopped_counts(log)
    assert counts["requests"] == counts["ok"] + counts["shed"] + counts["errors"] == len(rows) > 60
    assert counts["chunks"] == sum(ingest_sent(log).values())  # received = sent: nothing lost on the way
    assert "SIGTERM received: stopping ingest, then draining the daemon" in log
    assert re.search(r"closed: \d+ rows written, 0 dropped, 0 errors", log)


def test_a_second_ctrl_c_drains_at_once_and_still_answers_what_was_received(tmp_path, tiny_backbone_dir, seeing):
    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, {"seeing": seeing},
                        [{"id": f"s{i}", "realtime": False, "fps": 10} for i in range(2)])
    run = Run(write(tmp_path / "pipeline.yaml", cfg))
    try:
        run.wait_rows(lambda r: True, 20)
        mark = len(run.log())
        run.send(signal.SIGINT, group=True)
        run.wait_log("SIGINT received: stopping ingest", after=mark)
        run.send(signal.SIGINT, group=True)
        assert run.proc.wait(120) == 0
    finally:
        run.close()
    log, rows = run.log(), run.rows()
    assert "SIGINT received again: draining the daemon now" in log
    counts = stopped_counts(log)
    assert counts["requests"] == counts["ok"] + counts["shed"] + counts["errors"] == len(rows)


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_children_stop_themselves_when_the_supervisor_is_killed(tmp_path, tiny_backbone_dir, seeing):
    """No orphans: a `vlora-va run` killed with SIGKILL cannot stop anything itself; its daemon and workers see it
    gone and stop on their own (the daemon drains as usual)."""
    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, {"seeing": seeing}, [{"id": "a"}])
    run = Run(write(tmp_path / "pipeline.yaml", cfg))
    children: tuple[int, ...] = ()
    try:
        run.wait_rows(lambda r: True, 2)
        children = run.pid("daemon"), run.pid("ingest worker 0")
        run.proc.kill()
        run.proc.wait(30)
        deadline = time.monotonic() + 120
        while not all(gone(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(gone(p) for p in children), [p for p in children if not gone(p)]
    finally:
        run.close()
        for p in children:
            if not gone(p):
                os.kill(p, signal.SIGKILL)
    assert "the supervising vlora-va run (pid" in run.log() and "daemon stopped:" in run.log()
