import subprocess
import sys

CLI = [sys.executable, "-m", "vlora_va.cli"]


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
