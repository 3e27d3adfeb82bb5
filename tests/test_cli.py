import os
import re
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "vlora_va.cli"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, cwd=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_validate_accepts_the_default_pipeline():
    proc = run("validate", "pipelines.yaml")
    assert proc.returncode == 0 and "OK (2 streams, 3 tasks, 2 adapters" in proc.stdout


def test_validate_names_the_bad_key_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open("pipelines.yaml").read().replace("adapter: actions", "adapter: actoins"))
    proc = run("validate", str(bad))
    assert proc.returncode == 2
    assert "streams[0].tasks[1].adapter: unknown adapter 'actoins' (known: detect, actions)" in proc.stderr
    assert f"{bad}:" in proc.stderr


def test_run_refuses_an_invalid_pipeline_before_starting_anything(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("daemon: [\n")
    proc = run("run", str(bad))
    assert proc.returncode == 2 and "invalid YAML" in proc.stderr


def test_ingest_rejects_unknown_stream_ids():
    proc = run("ingest", "pipelines.yaml", "--streams", "nosuch")
    assert proc.returncode == 2 and "unknown stream id(s) nosuch" in proc.stderr


def test_delegated_subcommands_get_their_own_help():
    for command in ("tune", "train", "eval"):
        proc = run(command, "--help")
        assert proc.returncode == 0 and f"vlora-va {command}" in proc.stdout, (command, proc.stderr[-500:])


def test_validate_warns_about_missing_videos_and_adapters(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(open("pipelines.yaml").read().replace("sample_videos/bikes.mp4", "/nowhere/bikes.mp4")
                   .replace("adapters/actions", "/nowhere/actions"))
    proc = run("validate", str(cfg))
    assert proc.returncode == 0
    assert "warning: streams[1].source: no such file /nowhere/bikes.mp4" in proc.stderr
    assert "warning: adapters.actions: no adapter_config.json in /nowhere/actions" in proc.stderr
    assert "warning" not in run("validate", "pipelines.yaml").stderr


def test_validate_warns_when_a_task_sends_clips_of_another_length_than_its_adapter_learnt(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(open("pipelines.yaml").read().replace("frames_per_chunk: 8", "frames_per_chunk: 4")
                   .replace("adapters/", f"{__import__('os').getcwd()}/adapters/"))
    proc = run("validate", str(cfg))
    assert proc.returncode == 0
    assert ("warning: streams[0].tasks[1].frames_per_chunk: 4, but adapter 'actions' learnt 8-frame clips"
            in proc.stderr)


def test_ingest_endpoint_override_is_used(tmp_path):
    # Nothing listens there: the worker reports the endpoint it connects to, then its chunks cannot leave.
    cfg = tmp_path / "p.yaml"
    cfg.write_text(open("pipelines.yaml").read().replace("realtime: true", "realtime: false\n    max_chunks: 1")
                   .replace("sample_videos/", f"{__import__('os').getcwd()}/sample_videos/"))
    proc = subprocess.run([*CLI, "ingest", str(cfg), "--streams", "pedestrians", "--endpoint", "tcp://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=120)
    assert "-> tcp://127.0.0.1:1" in proc.stderr


def test_daemon_binds_the_endpoint_override_and_drains_on_sigterm(tmp_path, tiny_backbone_dir):
    """`vlora-va daemon FILE --endpoint E`: it serves on E (not daemon.endpoint), correctly, and SIGTERM ends it
    with exit code 0 after answering what it received."""
    import re
    import signal

    from tests.pipeline_helpers import Run, probe, stopped_counts, tiny_pipeline, write
    from vlora_va.testing.messages import make_seeing_detector

    seeing = make_seeing_detector(tmp_path / "seeing")
    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, {"seeing": seeing}, [{"id": "a"}])
    other = f"ipc://{tmp_path}/other.sock"
    run = Run(write(tmp_path / "pipeline.yaml", cfg), "--endpoint", other, command="daemon")
    try:
        run.wait_log(rf"daemon ready on {re.escape(other)} ")
        probe(dict(cfg, daemon=dict(cfg["daemon"], endpoint=other)), tiny_backbone_dir, {"seeing": seeing}, 0,
              [("det", "seeing")], run)
        assert run.finish(signal.SIGTERM, group=False) == 0
    finally:
        run.close()
    counts = stopped_counts(run.log())
    assert counts["chunks"] == 1 and counts["requests"] == counts["ok"] == 1


def test_draw_command_writes_the_frame_and_says_what_it_drew(tmp_path):
    import json
    import os

    import cv2

    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps({"stream": "bikes", "chunk": 1, "task": "detect", "frames": [
        {"ts": 1.5, "detections": [{"box": [100, 50, 200, 150], "class": "person", "score": 0.9}]}]}) + "\n")
    out = tmp_path / "f.jpg"
    video = os.path.join(os.getcwd(), "sample_videos", "bikes.mp4")
    proc = run("draw", str(results), "--video", video, "--stream", "bikes", "--ts", "1.4", "--out", str(out))
    assert proc.returncode == 0 and proc.stdout.strip() == f"{out}: 1 detection(s) at t=1.50 s", proc.stderr
    assert cv2.imread(str(out)).shape == (272, 640, 3)
    proc = run("draw", str(results), "--video", str(tmp_path / "nosuch.mp4"), "--stream", "bikes", "--out", str(out))
    assert proc.returncode == 1 and "nosuch.mp4" in proc.stderr


def test_validate_and_run_print_every_problem_of_the_file(tmp_path):
    """Three independent mistakes: `validate` prints all three (one line each, in file order) and exits 2; `run`
    (through the commands' shared loader) reports the same three before starting anything."""
    bad = tmp_path / "bad.yaml"
    text = open("pipelines.yaml").read()
    for old, new in (("max_batch_images: 16", "max_batch_images: 0"), ("adapter: actions", "adapter: actoins"),
                     ("type: jsonl", "type: kafka")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    bad.write_text(text)
    lines = text.splitlines()
    at = [next(i + 1 for i, line in enumerate(lines) if key in line) for key in
          ("max_batch_images: 0", "adapter: actoins", "type: kafka")]
    expected = [f"{bad}:{at[0]}: daemon.max_batch_images: must be >= 1, got 0",
                f"{bad}:{at[1]}: streams[0].tasks[1].adapter: unknown adapter 'actoins' (known: detect, actions)",
                f"{bad}:{at[2]}: sinks[0].type: must be one of jsonl, mqtt, stdout, webhook, got 'kafka'"]
    proc = run("validate", str(bad))
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"invalid: {e}" for e in expected], proc.stderr
    proc = run("run", str(bad))
    assert proc.returncode == 2
    assert [line.split("vlora_va: ", 1)[1] for line in proc.stderr.splitlines()] == expected, proc.stderr


MISSING_INPUTS = {  # command line -> the missing thing its one-line message must name
    "validate": (["validate", "missing.yaml"], "missing.yaml"),
    "run": (["run", "missing.yaml"], "missing.yaml"),
    "daemon": (["daemon", "missing.yaml"], "missing.yaml"),
    "ingest": (["ingest", "missing.yaml"], "missing.yaml"),
    "draw": (["draw", "missing.jsonl", "--video", "x.mp4", "--stream", "s", "--out", "o.png"], "missing.jsonl"),
    "train": (["train", "missing.yaml"], "missing.yaml"),
    "eval": (["eval", "missing_dir", "--on", "{root}/sample_videos/pedestrians.mp4"], "missing_dir"),
    "adapters-init": (["adapters", "init", "a-file/adapter", "--task", "detection", "--names", "person",
                       "--backbone", "{tiny_backbone}"], "a-file"),
    # no daemon: nothing listens at its control socket (said at once, not after the request's timeout)
    "adapters-load": (["adapters", "load", "n", "missing_dir", "--control", "ipc://{tmp}/control.sock"],
                      "control.sock"),
    "adapters-load-no-config": (["adapters", "load", "n", "missing_dir"], "pipelines.yaml"),
    "models-fetch": (["models", "fetch", "nosuch-model"], "nosuch-model"),
    "tune": (["tune", "--bogus"], "--bogus"),
}


@pytest.mark.parametrize("case", MISSING_INPUTS)
def test_a_missing_input_is_one_clear_line_and_no_traceback(case, tmp_path, tiny_backbone_dir):
    """Each command run as a new user would, in a fresh directory, on files / directories that are not there:
    a non-zero exit and exactly one line naming the missing thing (once), never a traceback."""
    (tmp_path / "a-file").write_text("a file, not a directory\n")
    args, missing = MISSING_INPUTS[case]
    args = [a.format(root=os.getcwd(), tmp=tmp_path, tiny_backbone=tiny_backbone_dir) for a in args]
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    (line,) = [line for line in out.splitlines() if missing in line]
    assert line.count(missing) == 1, line


def test_validate_refuses_lines_and_zones_outside_a_files_frame(tmp_path):
    """pedestrians.mp4 is 768 x 576: a line point at x = 900 and a zone point below the frame are named."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text(open("pipelines.yaml").read().replace("[[300, 200], [300, 330]]", "[[300, 200], [900, 330]]")
                   .replace("[0, 576]]", "[0, 600]]").replace("sample_videos/", f"{ROOT}/sample_videos/")
                   .replace("adapters/", f"{ROOT}/adapters/"))
    proc = run("validate", str(cfg))
    assert proc.returncode == 2, proc.stderr
    assert "invalid: streams[0] (pedestrians): lines 'path': point(s) [900, 330] outside the 768x576 frame" \
        in proc.stderr
    assert "zones 'lawn': point(s) [0, 600] outside the 768x576 frame" in proc.stderr


def _cluster_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters, cluster=True):
    from tests.pipeline_helpers import tiny_pipeline, write

    adapters = dict(list(tiny_adapters.items())[:2])
    names = list(adapters)
    streams = [{"id": f"s{i}", "tasks": [{"name": "det", "adapter": names[i % 2], "frames_per_chunk": 1,
                                          "deadline_ms": 30000}]} for i in range(4)]
    extra = {"cluster": {"daemons": 2}} if cluster else {}
    return write(tmp_path / "pipeline.yaml", tiny_pipeline(tmp_path, tiny_backbone_dir, adapters, streams, **extra))


def test_validate_profile_reports_each_daemon_and_the_cluster(tmp_path, tiny_backbone_dir, tiny_adapters):
    path = _cluster_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters)
    proc = run("validate", "--profile", str(path))
    assert proc.returncode == 0, proc.stderr
    daemons = [line for line in proc.stdout.splitlines() if line.startswith("cluster: daemon ")]
    assert len(daemons) == 2 and all("2 stream(s)" in line and line.endswith("fits") for line in daemons)
    assert "cluster: 2 daemon(s) need" in proc.stdout


def test_run_cluster_needs_a_cluster_section_and_a_known_address(tmp_path, tiny_backbone_dir, tiny_adapters):
    plain = _cluster_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters, cluster=False)
    proc = run("run", str(plain), "--cluster", "local")
    assert proc.returncode == 2 and "--cluster needs a cluster: section" in proc.stderr
    with_cluster = _cluster_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters)
    proc = run("run", str(with_cluster), "--cluster", "http://head:8265")
    assert proc.returncode == 2 and "expected local, auto or ray://host:port" in proc.stderr


def test_without_cluster_ray_is_never_imported():
    """`vlora-va run` without --cluster: the supervisor, the daemon and ingest import no Ray (the extra is optional)."""
    code = ("import sys, vlora_va.cli, vlora_va.supervisor, vlora_va.outputs.attach, vlora_va.ingest.worker, "
            "vlora_va.serving.daemon, vlora_va.cluster.placement; print('ray' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_run_cluster_local_serves_every_chunk_once_with_token_auth(tmp_path, tiny_backbone_dir, tiny_adapters):
    """`vlora-va run --cluster local` end to end: Ray started by the command, with token authentication (its token
    file private), two daemons, every chunk ingest made answered once in the one JSONL file, exit 0."""
    import json

    import yaml

    pytest.importorskip("ray")
    path = _cluster_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters)
    cfg = yaml.safe_load(path.read_text())
    cfg["daemon"]["endpoint"] = "tcp://127.0.0.1:5555"
    for s in cfg["streams"]:
        s.update(loop=False, max_chunks=6, realtime=False)
    cfg["ingest"]["drop_policy"] = "block"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "HOME": str(tmp_path), "RAY_AUTH_MODE": ""}
    env.pop("RAY_AUTH_MODE")
    proc = subprocess.run([*CLI, "run", "--cluster", "local", str(path)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    token = tmp_path / ".ray" / "auth_token"
    assert token.is_file() and token.stat().st_mode & 0o077 == 0  # made by Ray for the local instance, kept private
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    keys = sorted((r["stream"], r["chunk"]) for r in rows if r["type"] == "result")
    assert keys == sorted((f"s{i}", c) for i in range(4) for c in range(6))  # each chunk once
    assert {r["daemon"] for r in rows if r["type"] == "result"} == {"daemon-0", "daemon-1"}


def test_run_cluster_says_in_one_line_why_a_daemon_cannot_start(tmp_path, tiny_backbone_dir, tiny_adapters):
    import yaml

    pytest.importorskip("ray")
    path = _cluster_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters)
    cfg = yaml.safe_load(path.read_text())
    cfg["daemon"]["backbone"] = str(tmp_path / "no-such-backbone")
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([*CLI, "run", "--cluster", "local", str(path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert re.search(r"daemon daemon-\d could not start: .*cannot load backbone .*no-such-backbone", proc.stderr)
