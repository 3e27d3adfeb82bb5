"""Frame sources: a video file or an RTSP camera, decoded with PyAV, at a fixed frame rate.

`FrameSource(uri, fps, ...)` is an iterable of `Frame`s whose media timestamps are exactly
`fps` apart and keep increasing across file loops and RTSP reconnects. The layers, one each:

    _open        av.open with RTSP over TCP and bounded open/read timeouts
    _decode      demux + decode packet by packet, so a corrupt packet, a damaged frame or a truncated
                 file is reported clearly
    _timeline    loops files, reopens RTSP with exponential backoff, makes timestamps monotone
    resample     sample-and-hold onto the output grid (repeats frames or skips them)
    _paced       paces files like a live camera when realtime=True

Outages: media time that never arrived (an RTSP reconnect: the wall-clock time between the last frame
before the drop and the first one after it; or a stall: a timestamp gap longer than MAX_HOLD_S) is
skipped, never filled with a stale frame, and the first frame after it says how long it was
(`Frame.outage_s`), so the chunk that carries it can report it.

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

RTSP_OPTIONS = {
    "rtsp_transport": "tcp",  # UDP loses packets on busy hosts and is blocked by NATs
    # FFmpeg's default probe reads ~2 s of a live stream before av.open returns: every (re)connect would start
    # with a burst of frames already 2 s old, and an outage would be measured 2 s too long. H.264 over RTSP
    # carries its parameters in the SDP, so 0.2 s (microseconds here) loses nothing.
    "analyzeduration": "200000",
}
OPEN_TIMEOUT_S = 10.0  # a server that accepts but never answers must not hang the worker
READ_TIMEOUT_S = 5.0
DECODE_THREADS = 1  # two cores are shared with inference; one decode thread per stream is enough
MAX_HOLD_S = 1.0  # a gap longer than this (an outage) restarts the output grid instead of repeating
RTSP_MAX_BAD_PACKETS = 50  # consecutive undecodable packets before an RTSP source is reopened
TRUNCATED_TOLERANCE_S = 0.5  # a file that ends this much before the duration its index declares is truncated


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


def is_rtsp(uri: str) -> bool:
    return uri.startswith(("rtsp://", "rtsps://"))


def describe_av_error(e: BaseException) -> str:
    """The FFmpeg reason without errno noise, e.g. 'Invalid data found when processing input'."""
    return getattr(e, "strerror", None) or str(e)


def hw_device(setting: str) -> str | None:
    """The hardware decoder to ask FFmpeg for: ingest.hw_decode, or with "auto" CUDA where an NVIDIA GPU is
    visible (NVDEC); None = software decoding."""
    if setting == "off":
        return None
    if setting == "auto":
        return "cuda" if os.path.exists("/dev/nvidia0") and "cuda" in av.codec.hwaccel.hwdevices_available() else None
    return setting


def _open(uri: str, hw: str | None = None) -> av.container.InputContainer:
    """Open a container; raise SourceError naming the source and the reason. hw: a hardware decoder type
    (FFmpeg falls back to software where it cannot use it)."""
    if not is_rtsp(uri) and not os.path.isfile(uri):
        raise SourceError(f"cannot open {uri!r}: no such file")
    kw = {"hwaccel": av.codec.hwaccel.HWAccel(hw, allow_software_fallback=True)} if hw else {}
    try:
        if is_rtsp(uri):
            return av.open(uri, options=RTSP_OPTIONS, timeout=(OPEN_TIMEOUT_S, READ_TIMEOUT_S), **kw)
        return av.open(uri, **kw)
    except (av.error.FFmpegError, OSError) as e:
        raise SourceError(f"cannot open {uri!r}: {describe_av_error(e)}") from None


def _video_stream(container: av.container.InputContainer, uri: str, skip_nonref: bool = False) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise SourceError(f"{uri!r} has no video stream")
    stream = container.streams.video[0]
    stream.codec_context.thread_count = DECODE_THREADS
    if skip_nonref:  # frames no other frame refers to are not decoded at all (~1.4x less decode per second)
        stream.codec_context.skip_frame = "NONREF"
    return stream


def _frame_rate(stream: av.video.stream.VideoStream, fallback: float) -> float:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else fallback


def _declared_end(stream) -> float | None:
    """The media time (s) a file's index says its video stream ends at, or None where it does not say
    (the container's duration is not used: an audio track may be longer than the video)."""
    if not (stream.duration and stream.time_base):
        return None
    start = stream.start_time * stream.time_base if stream.start_time else 0
    return float(start + stream.duration * stream.time_base)


def _decode(container: av.container.InputContainer, stream, uri: str) -> Iterator[av.VideoFrame]:
    """Decoded frames in presentation order. A file raises SourceError at an undecodable packet, at a
    frame the decoder had to conceal damage in, and when it ends well before the duration its index
    declares (cut at a packet boundary, a truncated file decodes cleanly up to the cut). An RTSP stream
    tolerates damaged packets (the decoder recovers at the next keyframe) up to a limit."""
    bad = 0
    decoded = 0
    last_time: float | None = None
    rtsp = is_rtsp(uri)
    try:
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.error.FFmpegError as e:
                where = f"at {float(packet.pts * packet.time_base):.2f} s" if packet.pts is not None else "at end"
                if not rtsp:
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
                if not rtsp and frame.is_corrupt:
                    where = f"at {frame.time:.2f} s " if frame.time is not None else ""
                    raise SourceError(f"cannot decode {uri!r}: frame {decoded} {where}is damaged (the decoder had "
                                      f"to conceal errors in it; corrupt file?)")
                decoded += 1
                last_time = frame.time if frame.time is not None else last_time
                yield frame
    except av.error.FFmpegError as e:  # demuxing: truncated file, connection reset, read timeout
        raise SourceError(f"cannot read {uri!r} after {decoded} frames: {describe_av_error(e)}") from None
    if not rtsp and last_time is not None:
        declared = _declared_end(stream)
        rate = _frame_rate(stream, 0.0)
        end = last_time + (1.0 / rate if rate else 0.0)
        if declared is not None and declared - end > TRUNCATED_TOLERANCE_S:
            raise SourceError(f"{uri!r} ends at {end:.2f} s after {decoded} frames, but its index declares "
                              f"{declared:.2f} s (truncated file?)")


def resample(frames: Iterable[Frame], fps: float, max_hold_s: float = MAX_HOLD_S) -> Iterator[Frame]:
    """Sample-and-hold onto a grid of `fps`: output slot k (media time t0 + k/fps) shows the latest
    input frame with ts <= t_k. Faster inputs lose frames, slower ones repeat them. A slot is emitted
    once the next input frame proves nothing newer belongs to it (at most one input frame of delay).

    An outage restarts the grid at the first frame after it instead of repeating a stale frame: a gap
    longer than max_hold_s, or an input frame whose outage_s says media is missing (an RTSP reconnect).
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
    """Frames of one file or RTSP URL at `fps`, as an iterable.

    Files: end at EOF, or loop with timestamps that keep increasing; realtime=True paces them like
    a live camera. Errors raise SourceError. RTSP: a failed open or a dropped connection is retried
    with exponential backoff (reconnect_initial_s doubling up to reconnect_max_s) until `stop` is set;
    `reconnects` counts the successful reopenings."""

    def __init__(self, uri: str, fps: float, *, loop: bool = False, realtime: bool = False,
                 name: str | None = None, stop: threading.Event | None = None,
                 reconnect_initial_s: float = 0.5, reconnect_max_s: float = 10.0, skip_nonref: bool = False,
                 hw_decode: str = "off"):
        """skip_nonref: do not decode non-reference frames (for tasks that look at few frames of a chunk: a
        skipped frame's slot shows the previous decoded one). hw_decode: see `hw_device`."""
        self.uri, self.fps, self.loop, self.realtime = uri, fps, loop, realtime
        self.skip_nonref, self.hw = skip_nonref, hw_device(hw_decode)
        self._hw_failed = False
        self.name = name or uri
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
        rtsp = is_rtsp(self.uri)
        last: tuple[float, float] | None = None  # (media time, wall time) of the last frame of any pass
        delay = self.reconnect_initial_s
        attempt = 0  # failed RTSP attempts since the last good connection
        while not self.stop.is_set():
            passed = 0
            try:
                container = self._open()
                try:
                    stream = _video_stream(container, self.uri, self.skip_nonref)
                    self.source_fps = _frame_rate(stream, self.fps)
                    if last is None:
                        self._log_opened(stream, "opened")
                    elif rtsp:
                        self.reconnects += 1
                        self._log_opened(stream, "reconnected to")
                    else:
                        log.debug("stream %s: looping %s after media time %.2f s", self.name, self.uri, last[0])
                    # A loop continues one frame after the previous pass; a reconnect as much later as
                    # passed on the wall clock (the outage shows as a media-time gap, and says so).
                    after = None if last is None else (last[0], last[1] if rtsp else None)
                    for frame in self._stamped(_decode(container, stream, self.uri), after):
                        passed += 1
                        self.decoded += 1
                        last = frame.ts, frame.wall
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

    def _open(self) -> av.container.InputContainer:
        """Hardware decoding where asked and possible; a device that cannot be opened is said once and the
        source decodes in software from then on."""
        if self.hw and not self._hw_failed:
            try:
                return _open(self.uri, self.hw)
            except SourceError as e:
                self._hw_failed = True
                log.warning("stream %s: hardware decoding (%s) unavailable, decoding in software: %s", self.name,
                            self.hw, e)
        return _open(self.uri)

    def _stamped(self, videos: Iterator[av.VideoFrame], after: tuple[float, float | None] | None) -> Iterator[Frame]:
        """Frames with media time offset + (frame time - first frame time), never decreasing.
        `after`: None for the first pass (offset 0); else (media time of the previous pass's last frame,
        its wall time for an RTSP reconnect or None for a file loop). A loop starts one frame later; a
        reconnect as much later as the wall clock moved between that frame and this pass's first one,
        and that first frame's outage_s is the media time missing in between.
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
