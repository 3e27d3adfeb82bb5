"""Frame sources: the `Source` plug-in interface, and `FrameSource`, which turns a Source into frames at a fixed rate.

A Source is one kind of video source, registered by URI scheme in `vlora_va.contracts.plugins.SOURCES` ("file" ->
file_source.FileSource, "rtsp"/"rtsps" -> rtsp_source.RtspSource). It says what it is with `live`, opens one pass
(`open()`: a file from its start, one connection to a camera: decoded `av.VideoFrame`s in presentation order) and
says what follows a pass (`after_pass`, see `After`). PyAV kinds share `av_source.AVSource`: a V4L2 camera or an
HLS URL would be one more file.

    live = True    a camera: frames come at its own pace (never paced, never best-effort), damaged packets are
                   tolerated, a failed open or a lost connection is retried with backoff until stopped
    live = False   a file: paced like a camera when realtime, loops when asked, every error is final

`FrameSource(uri, fps, ...)` is an iterable of `Frame`s whose media timestamps are exactly 1/fps apart and keep
increasing across loops and reconnects. The layers, one each:

    Source.open   one pass of decoded frames (the kind's own opening and decode tolerance)
    _timeline     reopens as `after_pass` says (at once, or after a backoff wait), makes timestamps monotone
    resample      sample-and-hold onto the output grid (repeats frames or skips them)
    _paced        holds frames of a source that is not live to the wall clock when realtime=True

Outages: media time that never arrived (a reconnect: the wall-clock time between the last frame before the drop
and the first one after it; or a stall: a timestamp gap longer than MAX_HOLD_S) is skipped, never filled with a
stale frame, and the first frame after it says how long it was (`Frame.outage_s`), so the chunk that carries it
can report it.

Frames stay undecoded-to-RGB (`Frame.video`) until someone calls `Frame.to_rgb()`: the chunker converts only the
frames some task needs.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable, ClassVar, Iterable, Iterator

import av
import numpy as np

from vlora_va.contracts.plugins import SOURCES, UnknownPlugin, source_scheme

log = logging.getLogger(__name__)

MAX_HOLD_S = 1.0  # a gap longer than this (an outage) restarts the output grid instead of repeating


class SourceError(RuntimeError):
    """A source that cannot be opened or decoded; the message names the source and the problem."""


@dataclass(frozen=True)
class Frame:
    video: av.VideoFrame  # the decoded frame, still in its native pixel format
    ts: float  # media time in seconds from the start of the stream
    wall: float  # wall-clock time (time.time()) the frame became available
    outage_s: float = 0.0  # media seconds missing just before this frame (a reconnect or a stall), else 0

    @property
    def width(self) -> int:
        return self.video.width

    @property
    def height(self) -> int:
        return self.video.height

    def to_rgb(self) -> np.ndarray:
        """A new H x W x 3 uint8 RGB array."""
        return self.video.to_ndarray(format="rgb24")


def hw_device(setting: str) -> str | None:
    """The hardware decoder to ask FFmpeg for: ingest.hw_decode; None = software decoding. "auto" is software:
    measured on an H200 (2026-11-26, docs/gpus.md), NVDEC through PyAV decoded the 768x576 sample at 220 frames/s
    per host thread against 303 in software (the frames still come back to the host and convert there), and
    each stream opened its own CUDA context (~0.5 GB): 100 streams held 50 GB and 8 of them could not open one."""
    if setting in ("off", "auto"):
        return None
    return setting


# ---------------------------------------------------------------------------------------------- the interface

class After(enum.Enum):
    """What follows a pass of a source."""

    END = "end"  # the source is over
    LOOP = "loop"  # open it again at once; media time goes on one frame after the last
    RECONNECT = "reconnect"  # open it again after a backoff wait; the wall-clock time in between is an outage


@dataclass
class Pass:
    """One opened pass of a source (a file from its start, one connection to a camera)."""

    frames: Iterator[av.VideoFrame]  # decoded, in presentation order; SourceError where decoding fails
    rate: float | None  # the source's frame rate, None where it does not say
    describe: str  # for the log, e.g. "640x272, h264"
    close: Callable[[], None] = lambda: None  # releases what the pass holds (called once, whatever happened)


class Source(ABC):
    """One kind of video source (a `SOURCES` entry). FrameSource makes one per stream and drives it."""

    live: ClassVar[bool] = False  # a camera (see the module docstring); False: a file
    kind: ClassVar[str] = "video"  # what the log calls it: "stream cam: RTSP source ended ..."

    def __init__(self, uri: str, *, name: str, skip_nonref: bool = False, hw: str | None = None):
        """name: the stream, for messages. skip_nonref: do not decode frames no other frame refers to (where the
        kind can). hw: a hardware decoder type to try (see `hw_device`), None for software."""
        self.uri, self.name, self.skip_nonref, self.hw = uri, name, skip_nonref, hw

    @abstractmethod
    def open(self) -> Pass:
        """Open one pass; SourceError (naming the source and the reason) where it cannot be opened."""

    def after_pass(self, frames: int, error: SourceError | None, *, loop: bool) -> After:
        """What follows a pass that delivered `frames` frames and ended with `error` (None: it just ended), or
        raise SourceError to end the stream with that error. A live source reconnects whatever happened; a file
        fails on an error or when nothing decoded, else loops when asked to."""
        if self.live:
            return After.RECONNECT
        if error is not None:
            raise error
        if frames == 0:
            raise SourceError(f"no frames could be decoded from {self.uri!r}")
        return After.LOOP if loop else After.END


# ---------------------------------------------------------------------------------------------- the frames

def resample(frames: Iterable[Frame], fps: float, max_hold_s: float = MAX_HOLD_S) -> Iterator[Frame]:
    """Sample-and-hold onto a grid of `fps`: output slot k (media time t0 + k/fps) shows the latest
    input frame with ts <= t_k. Faster inputs lose frames, slower ones repeat them. A slot is emitted
    once the next input frame proves nothing newer belongs to it (at most one input frame of delay).

    An outage restarts the grid at the first frame after it instead of repeating a stale frame: a gap
    longer than max_hold_s, or an input frame whose outage_s says media is missing (a reconnect).
    That output frame's outage_s is the media time the grid skipped (its ts minus the slot that would
    have come next); every other output frame has outage_s 0."""
    step = 1.0 / fps
    eps = 1e-3 * step  # container timestamps are rationals; absorb float error
    prev: Frame | None = None
    anchor, k = 0.0, 0
    outage = 0.0  # skipped media time not yet reported on an output frame
    for f in frames:
        next_slot = anchor + k * step
        if prev is None or f.outage_s > 0 or f.ts - next_slot > max_hold_s:
            if prev is not None:
                outage += max(0.0, f.ts - next_slot)
            anchor, k = f.ts, 0
        else:
            while anchor + k * step < f.ts - eps:
                yield replace(prev, ts=round(anchor + k * step, 6), wall=time.time(), outage_s=0.0)
                k += 1
        if anchor + k * step <= f.ts + eps:
            yield replace(f, ts=round(anchor + k * step, 6), wall=time.time(), outage_s=round(outage, 6))
            outage = 0.0
            k += 1
        prev = f


class FrameSource:
    """Frames of one source at `fps`, as an iterable: the Source class registered for the URI's scheme
    (`SOURCES.load(source_scheme(uri))`: a file, an RTSP URL, any other registered kind) drives it.

    Not live (files): end, or loop with timestamps that keep increasing; realtime=True paces them like a camera.
    Errors raise SourceError. Live: a failed open or a dropped connection is retried with exponential backoff
    (reconnect_initial_s doubling up to reconnect_max_s) until `stop` is set; `reconnects` counts reopenings."""

    def __init__(self, uri: str, fps: float, *, loop: bool = False, realtime: bool = False,
                 name: str | None = None, stop: threading.Event | None = None,
                 reconnect_initial_s: float = 0.5, reconnect_max_s: float = 10.0, skip_nonref: bool = False,
                 hw_decode: str = "off"):
        """skip_nonref: do not decode non-reference frames (for tasks that look at few frames of a chunk: a
        skipped frame's slot shows the previous decoded one). hw_decode: see `hw_device`."""
        self.uri, self.fps, self.loop, self.realtime = uri, fps, loop, realtime
        self.skip_nonref, self.hw = skip_nonref, hw_device(hw_decode)
        self.name = name or uri
        try:
            source_class = SOURCES.load(source_scheme(uri))
        except UnknownPlugin as e:
            raise SourceError(f"stream {self.name}: {e}") from None
        self.source: Source = source_class(uri, name=self.name, skip_nonref=skip_nonref, hw=self.hw)
        self.stop = stop or threading.Event()
        self.reconnect_initial_s, self.reconnect_max_s = reconnect_initial_s, reconnect_max_s
        self.reconnects = 0
        self.decoded = 0  # source frames decoded so far (before resampling): the decode rate's numerator
        self.source_fps: float | None = None

    def __iter__(self) -> Iterator[Frame]:
        return self._paced(resample(self._timeline(), self.fps))

    # ------------------------------------------------------------------ opening and reopening

    def _timeline(self) -> Iterator[Frame]:
        """Source frames with monotone media timestamps across loops and reconnects."""
        last: tuple[float, float] | None = None  # (media time, wall time) of the last frame of any pass
        then: After | None = None  # what the previous pass's after_pass said: how this pass continues
        delay = self.reconnect_initial_s
        attempt = 0  # failed attempts since the last good connection
        while not self.stop.is_set():
            passed = 0
            error: SourceError | None = None
            try:
                opened = self.source.open()
                try:
                    self.source_fps = opened.rate or self.fps
                    self._log_pass(opened, last, then)
                    # A loop continues one frame after the previous pass; a reconnect as much later as
                    # passed on the wall clock (the outage shows as a media-time gap, and says so).
                    after = None if last is None else (last[0], last[1] if then is After.RECONNECT else None)
                    for frame in self._stamped(opened.frames, after):
                        passed += 1
                        self.decoded += 1
                        last = frame.ts, frame.wall
                        if attempt:  # frames flow again: the next drop starts the backoff afresh
                            attempt, delay = 0, self.reconnect_initial_s
                        yield frame
                        if self.stop.is_set():
                            return
                finally:
                    opened.close()
            except SourceError as e:
                error = e
            if self.stop.is_set():  # a stream being stopped ends quietly, whatever its last pass said
                return
            try:
                then = self.source.after_pass(passed, error, loop=self.loop)
            except SourceError as e:
                raise SourceError(f"stream {self.name}: {e}") from None
            if error is not None:  # survived: said here, the stream goes on
                log.warning("stream %s: %s", self.name, error)
            if then is After.END:
                return
            if then is After.LOOP:
                continue
            attempt += 1
            log.warning("stream %s: %s source %s (%d frames this connection); reconnect attempt %d in %.2f s",
                        self.name, self.source.kind, "ended" if passed else "unavailable", passed, attempt, delay)
            if self.stop.wait(delay):
                return
            delay = min(delay * 2, self.reconnect_max_s)

    def _stamped(self, videos: Iterator[av.VideoFrame], after: tuple[float, float | None] | None) -> Iterator[Frame]:
        """Frames with media time offset + (frame time - first frame time), never decreasing. `after`: None for
        the first pass (offset 0); else (media time of the previous pass's last frame, its wall time for a
        reconnect or None for a loop). A loop starts one frame later; a reconnect as much later as the wall clock
        moved since that frame, and its first frame's outage_s is the media time missing in between.
        A frame without a timestamp (e.g. the first RTSP frame) is placed one frame after the previous."""
        step = 1.0 / (self.source_fps or self.fps)
        offset = 0.0
        base: float | None = None  # source time that maps to `offset`
        last: float | None = None
        for video in videos:
            now = time.time()
            outage = 0.0
            if last is None and after is not None:  # the first frame fixes where this pass lies
                prev_ts, prev_wall = after
                gap = step if prev_wall is None else max(step, now - prev_wall)
                offset, outage = prev_ts + gap, gap - step
            t = video.time
            expected = offset if last is None else last + step
            if t is None:
                ts = expected
            else:
                if base is None:  # the first timed frame lines up with where this pass is
                    base = t - (expected - offset)
                ts = offset + (t - base)
            ts = ts if last is None else max(ts, last)
            last = ts
            yield Frame(video, ts, now, outage_s=outage)

    def _log_pass(self, opened: Pass, last: tuple[float, float] | None, then: After | None) -> None:
        if last is not None and then is After.LOOP:
            log.debug("stream %s: looping %s after media time %.2f s", self.name, self.uri, last[0])
            return
        what = "opened" if last is None else "reconnected to"
        if last is not None:
            self.reconnects += 1
        log.info("stream %s: %s %s (%s, %.3g fps source -> %.3g fps%s%s)", self.name, what, self.uri,
                 opened.describe, self.source_fps, self.fps, ", loop" if self.loop else "",
                 ", realtime" if self._paces() else "")

    # ------------------------------------------------------------------ pacing

    def _paces(self) -> bool:
        """A live source comes at its own pace; anything else is paced like one when realtime."""
        return self.realtime and not self.source.live

    def _paced(self, frames: Iterator[Frame]) -> Iterator[Frame]:
        """Not live, realtime=True: hold each frame until its media time has come on the wall clock.
        When the consumer fell behind by more than a second, jump forward rather than burst to catch up,
        like a live camera would."""
        if not self._paces():
            yield from frames
            return
        origin: float | None = None  # wall time of media time 0
        for f in frames:
            now = time.time()
            if origin is None or now - (origin + f.ts) > 1.0:
                origin = now - f.ts
            wait = origin + f.ts - now
            if wait > 0 and self.stop.wait(wait):
                return
            yield replace(f, wall=time.time())
