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
