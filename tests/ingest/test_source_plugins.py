"""The source plug-in point: a kind of source defined here alone (scheme "pattern": numpy pictures, no file, no
FFmpeg demuxer) and registered in SOURCES is read by FrameSource and by the real ingest worker like a file or a
camera; a scheme nobody registered is refused by the config, naming the known ones."""

from __future__ import annotations

from fractions import Fraction
from urllib.parse import parse_qs, urlsplit

import av
import numpy as np
import pytest

from tests.conftest import BIKES
from tests.ingest.ingest_helpers import IMAGE_SIZE, WorkerThread, pipeline, stream
from vlora_va.contracts.config import ConfigError, TaskConfig, parse_config
from vlora_va.contracts.plugins import SOURCES
from vlora_va.ingest.chunker import PAD_VALUE, Chunker
from vlora_va.ingest.source import FrameSource, Pass, Source, SourceError


def colour(i: int) -> tuple[int, int, int]:
    """The flat RGB colour of pattern frame i (different for every frame of these tests)."""
    return (5 * i) % 256, 255 - (5 * i) % 256, 100


class PatternSource(Source):
    """pattern://WxH?frames=N&rate=R: N frames of W x H at R frames per second, frame i all colour(i)."""

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


class LivePatternSource(PatternSource):
    live = True


PATTERN = "pattern://160x120?frames=40&rate=20"  # 2 s at 20 fps


@pytest.fixture
def pattern_scheme():
    SOURCES.register("pattern", PatternSource)
    SOURCES.register("livepattern", LivePatternSource)
    yield
    SOURCES.unregister("pattern")
    SOURCES.unregister("livepattern")


def flat_colour(rgb: np.ndarray) -> tuple[int, ...]:
    """The one colour of a flat picture (fails where it is not flat)."""
    values = np.unique(rgb.reshape(-1, 3), axis=0)
    assert len(values) == 1, values[:5]
    return tuple(int(v) for v in values[0])


def test_a_registered_source_is_read_at_the_asked_frame_rate(pattern_scheme):
    """20 fps pattern at 10 fps: slot k at k/10 s shows pattern frame 2k; the source's own frame rate is known."""
    source = FrameSource(PATTERN, fps=10, name="pat")
    frames = list(source)
    assert [f.ts for f in frames] == pytest.approx([k / 10 for k in range(20)], abs=1e-6)
    assert [flat_colour(f.to_rgb()) for f in frames] == [colour(2 * k) for k in range(20)]
    assert (frames[0].width, frames[0].height) == (160, 120)
    assert source.decoded == 40 and source.source_fps == 20.0 and not any(f.outage_s for f in frames)


def test_a_registered_source_loops_with_increasing_timestamps(pattern_scheme):
    frames = list(zip(range(50), FrameSource(PATTERN, fps=10, loop=True)))
    assert [f.ts for _, f in frames] == pytest.approx([k / 10 for k in range(50)], abs=1e-6)
    assert [flat_colour(f.to_rgb()) for _, f in frames] == [colour(2 * (k % 20)) for k in range(50)]


def test_a_registered_source_runs_through_the_ingest_worker(pattern_scheme, receiver):
    """run_ingest with `source: pattern://...`: the chunks arrive over a real PULL socket and decode to the
    pattern's pictures, letterboxed, at the expected media times; not live and not paced: best-effort."""
    cfg = pipeline(receiver.endpoint, stream("pat", PATTERN, fps=10))  # det 2 + act 4 frames of 10 a chunk
    w = WorkerThread(cfg)
    w.start()
    chunks = receiver.drain(w, timeout=30)
    stats = w.finish()
    assert stats["pat"]["chunks_sent"] == 2 and stats["pat"]["errors"] == 0
    assert [c.header.seq for c in chunks] == [0, 1]
    pad = (IMAGE_SIZE - 84) // 2  # 160x120 -> 112x84, centred
    for c in chunks:
        h = c.header
        sent = [round(t * 10) for t in h.frame_ts]  # output slots: spread(10, 4) of this chunk's ten
        assert sent == [10 * h.seq + k for k in (0, 3, 6, 9)]
        assert h.orig_size == (160, 120) and all(t.best_effort for t in h.tasks)
        for slot, image in zip(sent, c.frames):
            assert image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
            assert flat_colour(image[pad:IMAGE_SIZE - pad]) == colour(2 * slot)
            assert (image[:pad] == PAD_VALUE).all() and (image[IMAGE_SIZE - pad:] == PAD_VALUE).all()


def test_the_chunker_asks_the_source_kind_whether_it_is_live(pattern_scheme):
    """Only a source that is not live, read as fast as possible, is best-effort: a live kind never is."""
    det = (TaskConfig("det", "detect", 1, 500.0),)
    assert Chunker(stream("a", PATTERN, fps=10, tasks=det), IMAGE_SIZE).best_effort is True
    assert Chunker(stream("b", "livepattern://8x8?frames=1&rate=1", fps=10, tasks=det), IMAGE_SIZE).best_effort is False


CONFIG = ("adapters: {detect: a/detect}\n"
          "streams:\n"
          "  - id: cam\n    source: pattern://160x120?frames=40&rate=20\n    fps: 10\n    tasks:\n"
          "      - {name: det, adapter: detect, frames_per_chunk: 1, deadline_ms: 500}\n")


def test_an_unregistered_scheme_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"streams\[0\]\.source: unknown source scheme 'pattern'") as e:
        parse_config(CONFIG)
    assert "(known: file, rtsp, rtsps" in str(e.value)
    with pytest.raises(SourceError, match=r"stream cam: unknown source scheme 'pattern' \(known: .*rtsp"):
        FrameSource(PATTERN, fps=10, name="cam")


def test_a_registered_scheme_is_accepted_by_the_config(pattern_scheme):
    cfg = parse_config(CONFIG)
    assert cfg.stream("cam").scheme == "pattern" and cfg.stream("cam").source == PATTERN


def test_the_file_scheme_takes_a_plain_path_or_a_file_url():
    """contracts.plugins.source_scheme sends file:///... to FileSource as it sends a plain path."""
    plain = [f.ts for f in FrameSource(str(BIKES), fps=10)]
    url = [f.ts for f in FrameSource(f"file://{BIKES}", fps=10)]
    assert url == plain and len(url) == 100
