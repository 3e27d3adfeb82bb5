"""The four plug-in points a user extends most, used together from this file alone: a head, a source, a sink and a
scheduling policy, each defined here and registered by name (vlora_va.contracts.plugins), run through the real
ingest worker, real ZeroMQ sockets and the real daemon, in this process and then in `vlora-va run`'s own processes
(the pipeline file names this file under `plugins:`). Nothing of the product is edited for them.

    pattern:// source (flat-colour frames) -> ingest worker -> daemon (policy "arrival", head "brightness")
    -> rows -> "memory" sink

The head reads the model input (the normalised frame) and reports its mean per frame; for a flat frame that is a
number the test computes from the colour alone, so every row is checked against its own reference."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import av
import numpy as np
import pytest
import torch

from vlora_va.contracts.config import ConfigError, parse_config
from vlora_va.contracts.plugins import HEADS, POLICIES, SINKS, SOURCES
from vlora_va.contracts.results import is_result
from vlora_va.engine.adapters import save_adapter_dir
from vlora_va.engine.backends.torch_eager import IMAGENET_MEAN, IMAGENET_STD
from vlora_va.engine.heads import Clip, Features, Head
from vlora_va.ingest.source import Pass, Source
from vlora_va.ingest.worker import run_ingest
from vlora_va.outputs.attach import run_with_outputs
from vlora_va.outputs.sinks import Sink
from vlora_va.serving.daemon import Daemon
from vlora_va.serving.scheduling import Scheduler
from vlora_va.testing.tiny import TINY_IMAGE

ROOT = Path(__file__).resolve().parents[1]
FRAMES = 30  # 3 s at 10 fps: 3 chunks of 1 s
WAIT_S = 120.0


def colour(i: int) -> tuple[int, int, int]:
    """Pattern frame i is all this grey (a different brightness for each of the FRAMES frames). None is darker than
    64 of 255: a darker picture is brightened by ingest's exposure correction (ingest/exposure.py) before any model."""
    return (64 + 6 * i,) * 3


def brightness(rgb: tuple[int, int, int]) -> float:
    """The mean of a flat frame's normalised model input (ImageNet mean and std per channel): the reference."""
    return float(np.mean([(c / 255 - m) / s for c, m, s in zip(rgb, IMAGENET_MEAN, IMAGENET_STD)]))


# ---------------------------------------------------------------- the plug-ins
class PatternSource(Source):
    """pattern://WxH?frames=N&rate=R: N flat frames at R frames per second, frame i all colour(i)."""

    live = False
    kind = "pattern"

    def open(self) -> Pass:
        url = urlsplit(self.uri)
        width, height = (int(v) for v in url.netloc.split("x"))
        query = parse_qs(url.query)
        n, rate = int(query["frames"][0]), Fraction(query["rate"][0])
        return Pass(self._frames(width, height, n, rate), float(rate), f"{width}x{height}, pattern")

    @staticmethod
    def _frames(width: int, height: int, n: int, rate: Fraction):
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), colour(i), np.uint8), format="rgb24")
            frame.pts, frame.time_base = i, 1 / rate
            yield frame


@dataclass(frozen=True)
class Brightness:
    """The brightness head's result for one request: per frame, its time and mean model input."""

    frames: tuple[tuple[float, float], ...]

    def to_json(self) -> dict:
        return {"brightness": [{"ts": round(t, 4), "mean": round(v, 5)} for t, v in self.frames]}


class BrightnessHead(Head):
    """Reads the model input itself (a detail branch of 3 channels asks the engine to keep it): mean per frame."""

    task = "brightness"
    detail = 3

    @classmethod
    def from_config(cls, config: dict, hidden: int) -> "BrightnessHead":
        return cls()

    def serve(self, feats: Features, clips: list[Clip]) -> list[Brightness]:
        means = feats.pixels.float().mean(dim=(1, 2, 3)).tolist()
        out, k = [], 0
        for c in clips:
            out.append(Brightness(tuple(zip(c.frame_ts, means[k:k + c.frames]))))
            k += c.frames
        return out


class MemorySink(Sink):
    """Keeps every row it is given, in order (and appends it to `path` as a JSON line, where one is given)."""

    def __init__(self, label: str, path: str | None = None):
        self.name, self.label, self.path = f"memory:{label}", label, path
        self.rows: list[dict] = []
        self._lock = threading.Lock()
        MemorySink.opened.append(self)

    opened: list["MemorySink"] = []

    @classmethod
    def from_config(cls, cfg) -> "MemorySink":
        return cls(cfg.options["label"], cfg.options.get("path"))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def write(self, records) -> None:
        rows = [r.to_json() for r in records]
        with self._lock:
            self.rows.extend(rows)
            if self.path:
                with open(self.path, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)

    def stats(self) -> dict:
        with self._lock:
            return {"written": len(self.rows), "dropped": 0, "errors": 0, "queue": 0}

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.rows)


class ArrivalOrder(Scheduler):
    """One batch at a time in arrival order, in the engine's resting mode."""

    name = "arrival"
    measured_modes = ("premerged", "unmerged")
    batches: list[list[tuple[str, int]]] = []  # what each planned batch held: (stream, chunk)

    def modes(self, slot):
        return [self.catalog.resting_mode()]

    def options(self, now):
        option = self.fill(sorted(self.queue, key=lambda r: r.received), self.catalog.resting_mode(), now)
        ArrivalOrder.batches.append([(r.stream, r.seq) for r in option.requests])
        return [option]


REGISTERED = ((HEADS, "brightness", BrightnessHead, ()), (SOURCES, "pattern", PatternSource, ()),
              (SINKS, "memory", MemorySink, ("label", "path")), (POLICIES, "arrival", ArrivalOrder, ()))


def register() -> None:
    for registry, name, target, options in REGISTERED:
        registry.register(name, target, options=options)


@pytest.fixture
def plugins():
    register()
    MemorySink.opened.clear()
    ArrivalOrder.batches.clear()
    try:
        yield
    finally:
        for registry, name, _, _ in REGISTERED:
            registry.unregister(name)


def brightness_adapter(path):
    """A head-only adapter whose head_config names the brightness task (the head has no weights)."""
    return save_adapter_dir(path, lora={}, rank=1, alpha=1, target_modules=[], base_model="tiny",
                            head=BrightnessHead(), head_config={"task": "brightness", "trained": True,
                                                                "image_size": TINY_IMAGE})


def wait_for(what: str, condition, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def pipeline_text(tmp_path, backbone, ingest: str, sink: str) -> str:
    """The pipeline both tests run: the pattern source through the brightness head under the arrival policy, into a
    memory sink (`sink`: its keys); `ingest`: extra ingest keys."""
    return f"""
daemon: {{endpoint: "ipc://{tmp_path}/d.sock", backbone: "{backbone}", image_size: {TINY_IMAGE},
          threads: 1, max_wait_ms: 5, profile_cache: "{tmp_path}/profiles", policy: arrival, precision: fp32}}
ingest: {{{ingest}}}
adapters: {{bright: "{brightness_adapter(tmp_path / 'bright')}"}}
streams:
  - id: flat
    source: "pattern://{TINY_IMAGE}x{TINY_IMAGE}?frames={FRAMES}&rate=10"
    fps: 10
    realtime: false
    tasks: [{{name: mean, adapter: bright, frames_per_chunk: 4, deadline_ms: 60000}}]
sinks: [{{type: memory, {sink}}}]
"""


def check_rows(rows: list[dict]) -> None:
    """One ok row per chunk, each frame's mean the reference for the frame its time names."""
    rows = sorted(rows, key=lambda r: r["chunk"])
    assert [(r["stream"], r["chunk"], r["task"], r["status"]) for r in rows] == [("flat", k, "mean", "ok")
                                                                               for k in range(3)]
    for row in rows:  # four frames of each chunk, spread over it (frames 1, 3, 6, 8 of ten)
        assert len(row["brightness"]) == 4
        for frame in row["brightness"]:
            i = round(frame["ts"] * 10)
            assert frame["mean"] == pytest.approx(brightness(colour(i)), abs=1e-4), (row["chunk"], i)


def test_a_head_a_source_a_sink_and_a_policy_from_this_file_run_through_the_daemon(plugins, tmp_path,
                                                                                   tiny_backbone_dir):
    cfg = parse_config(pipeline_text(tmp_path, tiny_backbone_dir, "close_grace_s: 0", "label: here"),
                       "plugins.yaml", tmp_path)
    daemon = Daemon(cfg)
    assert type(daemon.scheduler) is ArrivalOrder and daemon.catalog.adapters["bright"].task == "brightness"
    stop, ready, drained = threading.Event(), threading.Event(), threading.Event()
    serving = threading.Thread(target=run_with_outputs, args=(daemon, stop, ready, drained), daemon=True)
    serving.start()
    assert ready.wait(WAIT_S), "the daemon did not start"
    ingest_stats = run_ingest(cfg)  # the real worker, on this thread: it returns when the pattern has ended
    assert ingest_stats["flat"]["chunks_sent"] == FRAMES // 10 and not ingest_stats["flat"]["errors"]
    sink = MemorySink.opened[0]
    wait_for("the three rows", lambda: len(sink.snapshot()) >= 3)
    stop.set()
    assert drained.wait(WAIT_S)
    serving.join(WAIT_S)

    check_rows(sink.snapshot())
    served = [key for batch in ArrivalOrder.batches for key in batch]
    assert sorted(served) == [("flat", k) for k in range(3)]  # the policy planned every batch
    assert sink.stats()["written"] == 3 and daemon.totals.ok == 3


def test_the_plug_ins_serve_in_vlora_va_run_when_the_pipeline_names_this_file(tmp_path, tiny_backbone_dir):
    """`vlora-va run` starts fresh processes (spawned): the pipeline's `plugins:` entry makes each of them import
    this file, which then registers its plug-ins (below), before anything names them."""
    out = tmp_path / "rows.jsonl"
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"plugins: [\"{Path(__file__).resolve()}\"]\n"
                        + pipeline_text(tmp_path, tiny_backbone_dir, "", f"label: run, path: \"{out}\""))
    proc = subprocess.run([sys.executable, "-m", "vlora_va.cli", "run", str(pipeline)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_rows([r for line in out.read_text().splitlines() if is_result(r := json.loads(line))])


def test_an_unimportable_plug_in_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"plugins\[0\]: cannot import 'no_such_vlora_plugin'"):
        parse_config("plugins: [no_such_vlora_plugin]\n" + MINIMAL, "p.yaml", tmp_path)


MINIMAL = """adapters: {a: x}
streams: [{id: s, source: v.mp4, tasks: [{adapter: a}]}]
"""


def test_the_brightness_reference_is_not_trivially_met():
    """Two frames of the pattern differ in brightness well beyond the tolerance: a row with the wrong frame fails."""
    values = [brightness(colour(i)) for i in range(FRAMES)]
    assert min(abs(a - b) for a, b in zip(values, values[1:])) > 1e-2
    assert torch.tensor(values).std() > 0.1


if __name__.startswith("vlora_va_plugin_"):  # imported as a pipeline's plug-in file (contracts.plugins.load_plugins)
    register()
