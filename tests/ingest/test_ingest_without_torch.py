"""An ingest-only host: `pip install vlora-va[ingest]` (no torch) runs the real ingest worker, and the daemon's
side (this process, the main venv) decodes what it sends. The venv is .venv-ingest, made by
`INGEST_VENV=1 bash scripts/setup.sh` (what `make test` runs)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

import numpy as np
import pytest
import zmq

from tests.conftest import BIKES, PEDESTRIANS, ROOT, unavailable
from tests.ingest.ingest_helpers import QUIET_S
from vlora_va.contracts.wire import Chunk, TaskRequest, decode_message
from vlora_va.ingest.chunker import PAD_VALUE

INGEST_VENV = ROOT / ".venv-ingest"
PYTHON = INGEST_VENV / "bin" / "python"
CLI = INGEST_VENV / "bin" / "vlora-va"
IMAGE_SIZE = 112
RECEIVE_TIMEOUT_S = 60.0  # a cold start of a fresh interpreter with PyAV and OpenCV, on shared cores


@pytest.fixture(scope="module")
def ingest_venv():
    """Skips where .venv-ingest is missing, except under CI (env CI set), where that is a failure."""
    if not (PYTHON.exists() and CLI.exists()):
        message = (f"{INGEST_VENV} (an ingest-only install without torch) is missing; create it with "
                   f"`INGEST_VENV=1 bash scripts/setup.sh` or "
                   f"`python3 -m venv .venv-ingest && .venv-ingest/bin/pip install -e \".[ingest]\"`")
        unavailable(message)
    return INGEST_VENV


def _env() -> dict:
    """The ingest venv on its own: nothing of this (torch-carrying) venv may leak in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{INGEST_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run_python(code: str, python=PYTHON) -> subprocess.CompletedProcess:
    # cwd outside the checkout: imports must come from the install, not from the current directory
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd,
                              env=_env() if python == PYTHON else None)


def test_the_ingest_venv_has_no_torch(ingest_venv):
    r = _run_python("import torch")
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr, (r.returncode, r.stderr[-500:])
    r = _run_python("import sys; print(sys.prefix)")
    assert r.returncode == 0 and os.path.realpath(r.stdout.strip()) == os.path.realpath(INGEST_VENV)


INGEST_MODULES = ("vlora_va.ingest.worker", "vlora_va.ingest.chunker", "vlora_va.ingest.source",
                  "vlora_va.ingest.av_source", "vlora_va.ingest.file_source", "vlora_va.ingest.rtsp_source",
                  "vlora_va.contracts.config", "vlora_va.contracts.wire")
# What an ingest host must never load: the torch side of the package and the libraries it needs.
FORBIDDEN = ("torch", "transformers", "peft", "triton", "vlora_va.kernels", "vlora_va.engine", "vlora_va.serving",
             "vlora_va.training", "vlora_va.outputs")


def forbidden_after(imports: tuple[str, ...], python=PYTHON) -> list[str]:
    """The forbidden modules loaded once `imports` are imported (in a fresh `python`)."""
    r = _run_python("import importlib, json, sys\n"
                    f"for m in {list(imports)!r}: importlib.import_module(m)\n"
                    "print(json.dumps(sorted(sys.modules)))\n", python)
    assert r.returncode == 0, r.stderr[-2000:]
    modules = json.loads(r.stdout)
    assert set(imports) <= set(modules)
    return [m for m in modules if m in FORBIDDEN or m.startswith(tuple(f + "." for f in FORBIDDEN))]


def test_importing_the_worker_pulls_in_neither_torch_nor_the_daemon(ingest_venv):
    heavy = forbidden_after(INGEST_MODULES)
    assert heavy == [], f"the ingest worker imports {heavy[:10]}"


def test_the_check_sees_ingest_importing_the_engine():
    """Were ingest to import the engine, the check above would say so (run in this venv, which has torch: in the
    ingest venv that import fails outright)."""
    import sys

    heavy = forbidden_after(INGEST_MODULES + ("vlora_va.engine.executor",), python=sys.executable)
    assert "vlora_va.engine.executor" in heavy and "torch" in heavy


def _config(path) -> None:
    """Two streams; the worker is asked for `peds` only. The endpoint is replaced by --endpoint."""
    path.write_text(
        f"daemon:\n  endpoint: tcp://127.0.0.1:9\n  image_size: {IMAGE_SIZE}\n"
        "ingest:\n  close_grace_s: 0.5\n"
        "adapters:\n  detect: adapters/detect\n  actions: adapters/actions\n"
        "streams:\n"
        f"  - id: peds\n    source: {PEDESTRIANS}\n    fps: 10\n    realtime: false\n    max_chunks: 3\n"
        "    priority: 2\n    tasks:\n"
        "      - {name: detect, adapter: detect, frames_per_chunk: 1, deadline_ms: 2000}\n"
        "      - {name: activity, adapter: actions, frames_per_chunk: 8, deadline_ms: 3000, priority: 5}\n"
        f"  - id: bikes\n    source: {BIKES}\n    fps: 10\n    realtime: false\n    max_chunks: 1\n    tasks:\n"
        "      - {adapter: detect}\n")


def test_the_real_ingest_worker_from_the_ingest_venv_feeds_a_real_pull_socket(ingest_venv, tmp_path):
    config = tmp_path / "pipeline.yaml"
    _config(config)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    log = (tmp_path / "ingest.log").open("w+")
    proc = subprocess.Popen(
        [str(CLI), "--log-level", "INFO", "ingest", str(config), "--streams", "peds",
         "--endpoint", f"tcp://127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=_env())
    chunks = []
    try:
        deadline = time.monotonic() + RECEIVE_TIMEOUT_S
        exited: float | None = None
        while time.monotonic() < deadline:  # until the worker has exited and nothing more is pending
            if sock.poll(100):
                message = decode_message(sock.recv_multipart(copy=False))
                if isinstance(message, Chunk):  # heartbeats (SourceStatus) come too
                    chunks.append(message)
            elif proc.poll() is not None:
                exited = exited or time.monotonic()
                if time.monotonic() - exited >= QUIET_S:
                    break
        rc = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
        ctx.term()
        log.seek(0)
        output = log.read()
        log.close()
    assert rc == 0, f"ingest exited with {rc}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]

    # exactly the selected stream's 3 chunks, in order, each complete
    assert [(c.header.stream, c.header.seq) for c in chunks] == [("peds", 0), ("peds", 1), ("peds", 2)], output[-2000:]
    sent = (0, 1, 3, 4, 5, 6, 8, 9)  # spread(10, 8) plus spread(10, 1) == (5,)
    for c in chunks:
        h = c.header
        assert h.fps == 10.0 and h.orig_size == (768, 576) and h.dropped_before == 0
        assert h.frame_shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and len(c.frames) == len(h.frame_ts) == len(sent)
        assert h.frame_ts == pytest.approx([h.seq + i / 10 for i in sent])
        assert h.tasks == (TaskRequest("detect", "detect", (4,), 2000.0, 2, best_effort=True),
                           TaskRequest("activity", "actions", tuple(range(8)), 3000.0, 5, best_effort=True))
        assert h.letterbox.scale == pytest.approx(IMAGE_SIZE / 768)
        assert (h.letterbox.pad_x, h.letterbox.pad_y) == (0, 14)
        assert 0 < h.ready_wall <= h.sent_wall <= time.time()
        for f in c.frames:
            assert f.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and f.dtype == np.uint8
            assert (f[:14] == PAD_VALUE).all() and (f[-14:] == PAD_VALUE).all()  # the letterbox bands
            assert f[14:-14].std() > 10  # a real picture between them
    assert not np.array_equal(chunks[0].frames[0], chunks[2].frames[0])  # the video moves on
