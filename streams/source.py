"""Frame sources: a video file or an RTSP camera, decoded with PyAV, at a fixed frame rate.

`FrameSource(uri, fps, ...)` is an iterable of `Frame`s whose media timestamps are exactly
`fps` apart and keep increasing across file loops and RTSP reconnects. The layers, one each:

    _open        av.open with RTSP over TCP and bounded open/read timeouts
    _decode      demux + decode packet by packet, so a corrupt packet is reported clearly
    _timeline    loops files, reopens RTSP with exponential backoff, makes timestamps monotone
    resample     sample-and-hold onto the output grid (repeats frames or skips them)
    _paced       paces files like a live camera when realtime=True

Frames stay undecoded-to-RGB (`Frame.video`) until someone calls `Frame.to_rgb()`: the chunker
converts only the frames some task needs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Iterable, Iterator

import av
import numpy as np

log = logging.getLogger(__name__)

RTSP_OPTIONS = {"rtsp_transport": "tcp"}  # UDP loses packets on busy hosts and is blocked by NATs
OPEN_TIMEOUT_S = 10.0  # a server that accepts but never answers must not hang the worker
READ_TIMEOUT_S = 5.0
DECODE_THREADS = 1  # two cores are shared with inference; one decode thread per stream is enough
MAX_HOLD_S = 1.0  # a gap longer than this (an outage) restarts the output grid instead of repeating
RTSP_MAX_BAD_PACKETS = 50  # consecutive undecodable packets before an RTSP source is reopened


class SourceError(RuntimeError):
    """A source that cannot be opened or decoded; the message names the source and the problem."""


@dataclass(frozen=True)
class Frame:
    video: av.VideoFrame  # the decoded frame, still in its native pixel format
    ts: float  # media time in seconds from the start of the stream
    wall: float  # wall-clock time (time.time()) the frame became available

    @property
    def width(self) -> int:
        return self.video.width

    @property
    def height(self) -> int:
        return self.video.height

    def to_rgb(self) -> np.ndarray:
        """A new H x W x 3 uint8 RGB array."""
        return self.video.to_ndarray(format="rgb24")


def is_rtsp(uri: str) -> bool:
    return uri.startswith(("rtsp://", "rtsps://"))


def describe_av_error(e: BaseException) -> str:
    """The FFmpeg reason without errno noise, e.g. 'Invalid data found when processing input'."""
    return getattr(e, "strerror", None) or str(e)


def _open(uri: str) -> av.container.InputContainer:
    """Open a container; raise SourceError naming the source and the reason."""
    if not is_rtsp(uri) and not os.path.isfile(uri):
        raise SourceError(f"cannot open {uri!r}: no such file")
    try:
        if is_rtsp(uri):
            return av.open(uri, options=RTSP_OPTIONS, timeout=(OPEN_TIMEOUT_S, READ_TIMEOUT_S))
        return av.open(uri)
    except (av.error.FFmpegError, OSError) as e:
        raise SourceError(f"cannot open {uri!r}: {describe_av_error(e)}") from None


def _video_stream(container: av.container.InputContainer, uri: str) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise SourceError(f"{uri!r} has no video stream")
    stream = container.streams.video[0]
    stream.codec_context.thread_count = DECODE_THREADS
    return stream


def _frame_rate(stream: av.video.stream.VideoStream, fallback: float) -> float:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else fallback


def _decode(container: av.container.InputContainer, stream, uri: str) -> Iterator[av.VideoFrame]:
    """Decoded frames in presentation order. A file with an undecodable packet raises SourceError;
    an RTSP stream tolerates damaged packets (the decoder recovers at the next keyframe) up to a limit."""
    bad = 0
    decoded = 0
    try:
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.error.FFmpegError as e:
                where = f"at {float(packet.pts * packet.time_base):.2f} s" if packet.pts is not None else "at end"
                if not is_rtsp(uri):
                    raise SourceError(f"cannot decode {uri!r} {where} after {decoded} frames: "
                                      f"{describe_av_error(e)} (corrupt or truncated file?)") from None
                bad += 1
                if bad == 1:
                    log.warning("%s: undecodable packet %s: %s", uri, where, describe_av_error(e))
                if bad >= RTSP_MAX_BAD_PACKETS:
                    raise SourceError(f"{uri!r}: {bad} undecodable packets in a row") from None
                continue
            bad = 0
            for frame in frames:
                decoded += 1
                yield frame
    except av.error.FFmpegError as e:  # demuxing: truncated file, connection reset, read timeout
        raise SourceError(f"cannot read {uri!r} after {decoded} frames: {describe_av_error(e)}") from None


def resample(frames: Iterable[Frame], fps: float, max_hold_s: float = MAX_HOLD_S) -> Iterator[Frame]:
    """Sample-and-hold onto a grid of `fps`: output slot k (media time t0 + k/fps) shows the latest
    input frame with ts <= t_k. Faster inputs lose frames, slower ones repeat them. A slot is emitted
    once the next input frame proves nothing newer belongs to it (at most one input frame of delay).
    A gap longer than max_hold_s restarts the grid at the new frame instead of repeating a stale one."""
    step = 1.0 / fps
    eps = 1e-3 * step  # container timestamps are rationals; absorb float error
    prev: Frame | None = None
    anchor, k = 0.0, 0
    for f in frames:
        if prev is None or f.ts - (anchor + k * step) > max_hold_s:
            anchor, k = f.ts, 0
        else:
            while anchor + k * step < f.ts - eps:
                yield replace(prev, ts=round(anchor + k * step, 6), wall=time.time())
                k += 1
        if anchor + k * step <= f.ts + eps:
            yield replace(f, ts=round(anchor + k * step, 6), wall=time.time())
            k += 1
        prev = f


class FrameSource:
    """Frames of one file or RTSP URL at `fps`, as an iterable.

    Files: end at EOF, or loop with timestamps that keep increasing; realtime=True paces them like
    a live camera. Errors raise SourceError. RTSP: a failed open or a dropped connection is retried
    with exponential backoff (reconnect_initial_s doubling up to reconnect_max_s) until `stop` is set;
    `reconnects` counts the successful reopenings."""

    def __init__(self, uri: str, fps: float, *, loop: bool = False, realtime: bool = False,
                 name: str | None = None, stop: threading.Event | None = None,
                 reconnect_initial_s: float = 0.5, reconnect_max_s: float = 10.0):
        self.uri, self.fps, self.loop, self.realtime = uri, fps, loop, realtime
        self.name = name or uri
        self.stop = stop or threading.Event()
        self.reconnect_initial_s, self.reconnect_max_s = reconnect_initial_s, reconnect_max_s
        self.reconnects = 0
        self.source_fps: float | None = None

    def __iter__(self) -> Iterator[Frame]:
        return self._paced(resample(self._timeline(), self.fps))

    # ------------------------------------------------------------------ opening and reopening

    def _timeline(self) -> Iterator[Frame]:
        """Source frames with monotone media timestamps across loops and reconnects."""
        rtsp = is_rtsp(self.uri)
        offset = 0.0  # media time where the current pass starts
        last_ts: float | None = None
        last_wall = time.time()
        delay = self.reconnect_initial_s
        attempt = 0  # failed RTSP attempts since the last good connection
        while not self.stop.is_set():
            if last_ts is not None:  # continue just after the previous pass
                gap = time.time() - last_wall if rtsp else 0.0  # an outage shows as a media-time gap
                offset = last_ts + max(1.0 / (self.source_fps or self.fps), gap)
            passed = 0
            try:
                container = _open(self.uri)
                try:
                    stream = _video_stream(container, self.uri)
                    self.source_fps = _frame_rate(stream, self.fps)
                    if last_ts is None:
                        self._log_opened(stream, "opened")
                    elif rtsp:
                        self.reconnects += 1
                        self._log_opened(stream, "reconnected to")
                    else:
                        log.debug("stream %s: looping %s from media time %.2f s", self.name, self.uri, offset)
                    for frame in self._stamped(_decode(container, stream, self.uri), offset):
                        passed += 1
                        last_ts, last_wall = frame.ts, frame.wall
                        if attempt:  # frames flow again: the next drop starts the backoff afresh
                            attempt, delay = 0, self.reconnect_initial_s
                        yield frame
                        if self.stop.is_set():
                            return
                finally:
                    container.close()
            except SourceError as e:
                if not rtsp:
                    raise SourceError(f"stream {self.name}: {e}") from None
                log.warning("stream %s: %s", self.name, e)
            if self.stop.is_set():
                return
            if not rtsp:
                if passed == 0:
                    raise SourceError(f"stream {self.name}: no frames could be decoded from {self.uri!r}")
                if not self.loop:
                    return
                continue
            attempt += 1
            log.warning("stream %s: RTSP source %s (%d frames this connection); reconnect attempt %d in %.2f s",
                        self.name, "ended" if passed else "unavailable", passed, attempt, delay)
            if self.stop.wait(delay):
                return
            delay = min(delay * 2, self.reconnect_max_s)

    def _stamped(self, videos: Iterator[av.VideoFrame], offset: float) -> Iterator[Frame]:
        """Frames with media time offset + (frame time - first frame time), never decreasing.
        A frame without a timestamp (e.g. the first RTSP frame) is placed one frame after the previous."""
        step = 1.0 / (self.source_fps or self.fps)
        base: float | None = None  # source time that maps to `offset`
        last: float | None = None
        for video in videos:
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
            yield Frame(video, ts, time.time())

    def _log_opened(self, stream, what: str) -> None:
        cc = stream.codec_context
        log.info("stream %s: %s %s (%dx%d, %s, %.3g fps source -> %.3g fps%s%s)", self.name, what, self.uri, cc.width, cc.height, cc.name,
                 self.source_fps, self.fps, ", loop" if self.loop else "",
                 ", realtime" if self.realtime and not is_rtsp(self.uri) else "")

    # ------------------------------------------------------------------ pacing

    def _paced(self, frames: Iterator[Frame]) -> Iterator[Frame]:
        """Files with realtime=True: hold each frame until its media time has come on the wall clock.
        When the consumer fell behind by more than a second, jump forward rather than burst to catch up,
        like a live camera would."""
        if not self.realtime or is_rtsp(self.uri):
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
