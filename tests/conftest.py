"""Shared test fixtures: the sample videos, a real RTSP server on loopback, a tiny backbone and its adapters."""

from __future__ import annotations

import functools
import importlib
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import pytest

from vlora_va.testing.harness import free_port

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_videos"
PEDESTRIANS = SAMPLES / "pedestrians.mp4"  # 768x576, 10 fps, 79.5 s, H.264
BIKES = SAMPLES / "bikes.mp4"  # 640x272, 25 fps, 10 s, H.264

# The RTSP server runs on Debian's Python with Debian's GStreamer bindings (not pip-installable).
SYSTEM_PYTHON = "/usr/bin/python3"
GST_APT_PACKAGES = ("python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base "
                    "gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly")
_GST_PROBE = ("import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0'); "
              "from gi.repository import Gst, GstRtspServer; Gst.init(None); "
              "missing = [e for e in ('filesrc', 'qtdemux', 'h264parse', 'rtph264pay') if not Gst.ElementFactory.find(e)]; "
              "assert not missing, f'missing GStreamer elements: {missing}'")


@functools.cache
def _gstreamer_problem() -> str | None:
    """None when the RTSP server can run here, else why not."""
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} not found"
    try:
        r = subprocess.run([SYSTEM_PYTHON, "-c", _GST_PROBE], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the GStreamer probe timed out"
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["unknown error"])[-1]


class RtspServer:
    """tests/rtsp_server.py in a subprocess; kill() and start() again reuse the same port."""

    def __init__(self, video: Path, port: int):
        self.video, self.port = video, port
        self.url = f"rtsp://127.0.0.1:{port}/stream"
        self.proc: subprocess.Popen | None = None
        self._stderr = None

    def start(self, timeout: float = 30.0) -> None:
        self._close_files()
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: GStreamer may say a lot
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, str(ROOT / "tests" / "rtsp_server.py"), "--port", str(self.port), "--file", str(self.video)],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = self.proc.stdout.readline() if ready else ""
            if line.startswith("READY"):
                return
            if self.proc.poll() is not None:
                self._stderr.seek(0)
                raise RuntimeError(f"RTSP server exited with {self.proc.returncode}: {self._stderr.read()[-2000:]}")
        self.kill()
        raise RuntimeError(f"RTSP server did not become ready on port {self.port} in {timeout} s")

    def kill(self) -> None:
        """Die abruptly, like a camera losing power."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_files()

    def _close_files(self) -> None:
        if self.proc is not None:
            self.proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()


def unavailable(message: str) -> NoReturn:
    """Something a test needs is missing: a skip that says what, except under CI (env CI set), where it is a
    failure. CI sets up as the README says, and that set-up provides everything the tests use: a skip there would
    let a run pass without testing what the README promises."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message, allow_module_level=True)


def import_or_unavailable(module: str, why: str):
    """The module, imported; where it cannot be, `unavailable` with the reason (also at a test module's top)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        unavailable(f"{module} is not installed ({why}): {e}")


def require_default_backbone() -> None:
    """The default backbone in the model cache (`vlora-va models fetch`, which the set-up runs)."""
    from vlora_va.engine.backbones import ModelError, resolve

    try:
        resolve("dinov2-small")
    except ModelError as e:
        unavailable(f"the default backbone is not fetched (`vlora-va models fetch`): {e}")


def require_gstreamer() -> None:
    """GStreamer's RTSP server (CI installs the packages: scripts/setup-test-system.sh)."""
    problem = _gstreamer_problem()
    if problem:
        unavailable(f"RTSP test server unavailable ({problem}); install: apt-get install -y {GST_APT_PACKAGES}")


@pytest.fixture
def rtsp_server_for():
    """start(video) -> a started RtspServer streaming that H.264 MP4 on a free loopback port; every server
    started is stopped at the end of the test."""
    require_gstreamer()
    servers: list[RtspServer] = []

    def start(video: Path) -> RtspServer:
        server = RtspServer(Path(video), free_port())
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def rtsp_server(rtsp_server_for):
    """A started RTSP server streaming pedestrians.mp4 (768x576, 10 fps) on a free loopback port."""
    return rtsp_server_for(PEDESTRIANS)


@pytest.fixture(scope="session")
def tiny_backbone_dir(tmp_path_factory):
    """A tiny random-weight DINOv2 (vlora_va.testing.tiny), saved once per session."""
    from vlora_va.testing.tiny import make_backbone

    return make_backbone(tmp_path_factory.mktemp("tiny-dinov2"))


@pytest.fixture(scope="session")
def tiny_adapters(tmp_path_factory):
    """detect and actions adapters for the tiny backbone."""
    from vlora_va.testing.tiny import make_adapters

    return make_adapters(tmp_path_factory.mktemp("adapters"))


@pytest.fixture
def quiet_machine(monkeypatch):
    """Start-up measurements read the machine as quiet (common/machine_load.py), for the tests whose premise is what
    a quiet start caches: under `make test` other work may share the cores, and a busy reading is not cached (that
    rule has tests of its own, with a real competing process)."""
    from vlora_va.common import machine_load

    monkeypatch.setattr(machine_load, "others_share", lambda fn: (fn(), 0.0))


@pytest.fixture(autouse=True)
def machine_gates(tmp_path_factory, monkeypatch):
    """The accuracy gates measured on this machine (engine/precision_choice.py) in a temporary directory of each test's
    own, not the user's home: what `vlora-va models calibrate` measures in one test must neither open a precision for
    the user's daemon nor for another test (daemons started as subprocesses inherit it)."""
    path = tmp_path_factory.mktemp("machine-gates")
    monkeypatch.setenv("VLORA_VA_GATES", str(path))
    return path


@pytest.fixture(scope="session", autouse=True)
def openvino_cache(tmp_path_factory):
    """OpenVINO's compiled-model cache (engine/backends/openvino.py) in a temporary directory, not the user's home:
    daemons started as subprocesses inherit it."""
    path = tmp_path_factory.mktemp("openvino-cache")
    old = os.environ.get("VLORA_VA_OPENVINO_CACHE")
    os.environ["VLORA_VA_OPENVINO_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("VLORA_VA_OPENVINO_CACHE", None)
    else:
        os.environ["VLORA_VA_OPENVINO_CACHE"] = old
