"""`AVSource`: the part of a `Source` that PyAV (FFmpeg) opens and decodes, shared by the file and RTSP kinds.

A new FFmpeg-readable kind is one file: a subclass that says how to `av.open` it (`open_container`), whether it is
`live`, and its `kind` for the log. For example a V4L2 camera:

    class V4l2Source(AVSource):
        live, kind = True, "V4L2"

        def open_container(self, hw):
            try:
                return av.open(self.uri.removeprefix("v4l2://"), format="v4l2", **hw_accel(hw))
            except (av.error.FFmpegError, OSError) as e:
                raise SourceError(f"cannot open {self.uri!r}: {describe_av_error(e)}") from None

registered with `SOURCES.register("v4l2", "my.module:V4l2Source")`.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from typing import Iterator

import av

from vlora_va.ingest.source import Pass, Source, SourceError

log = logging.getLogger(__name__)

DECODE_THREADS = 1  # two cores are shared with inference; one decode thread per stream is enough
LIVE_MAX_BAD_PACKETS = 50  # consecutive undecodable packets before a live source is reopened


def describe_av_error(e: BaseException) -> str:
    """The FFmpeg reason without errno noise, e.g. 'Invalid data found when processing input'."""
    return getattr(e, "strerror", None) or str(e)


class AVSource(Source):
    """A source FFmpeg opens: subclasses say how (`open_container`); the video stream, its frame rate and decoding
    are shared. Hardware decoding is tried where asked; a device that cannot be opened is said once and the source
    decodes in software from then on."""

    _hw_failed = False

    @abstractmethod
    def open_container(self, hw: str | None) -> av.container.InputContainer:
        """av.open the source (`**hw_accel(hw)`); SourceError naming the source and the reason."""

    def open(self) -> Pass:
        container = self._open_with_fallback()
        try:
            stream = self._video_stream(container)
        except BaseException:
            container.close()
            raise
        cc = stream.codec_context
        return Pass(self.decode(container, stream), frame_rate(stream), f"{cc.width}x{cc.height}, {cc.name}",
                    container.close)

    def _open_with_fallback(self) -> av.container.InputContainer:
        if self.hw and not self._hw_failed:
            try:
                return self.open_container(self.hw)
            except SourceError as e:
                self._hw_failed = True
                log.warning("stream %s: hardware decoding (%s) unavailable, decoding in software: %s", self.name,
                            self.hw, e)
        return self.open_container(None)

    def _video_stream(self, container: av.container.InputContainer) -> av.video.stream.VideoStream:
        if not container.streams.video:
            raise SourceError(f"{self.uri!r} has no video stream")
        stream = container.streams.video[0]
        stream.codec_context.thread_count = DECODE_THREADS
        if self.skip_nonref:  # frames no other frame refers to are not decoded at all (~1.4x less decode per second)
            stream.codec_context.skip_frame = "NONREF"
        return stream

    def decode(self, container: av.container.InputContainer, stream) -> Iterator[av.VideoFrame]:
        """Decoded frames in presentation order, packet by packet, as a camera needs: damaged packets are
        tolerated (the decoder recovers at the next keyframe) up to LIVE_MAX_BAD_PACKETS in a row. FileSource
        overrides this: in a file, every damage is an error."""
        bad = decoded = 0
        try:
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.error.FFmpegError as e:
                    bad += 1
                    if bad == 1:
                        log.warning("%s: undecodable packet %s: %s", self.uri, packet_time(packet),
                                    describe_av_error(e))
                    if bad >= LIVE_MAX_BAD_PACKETS:
                        raise SourceError(f"{self.uri!r}: {bad} undecodable packets in a row") from None
                    continue
                bad = 0
                for frame in frames:
                    decoded += 1
                    yield frame
        except av.error.FFmpegError as e:  # demuxing: connection reset, read timeout
            raise SourceError(f"cannot read {self.uri!r} after {decoded} frames: {describe_av_error(e)}") from None


def packet_time(packet: av.Packet) -> str:
    """Where a packet lies, for messages: "at 5.16 s" ("at end" for the flush packet)."""
    return f"at {float(packet.pts * packet.time_base):.2f} s" if packet.pts is not None else "at end"


def hw_accel(hw: str | None) -> dict:
    """av.open's keyword arguments for hardware decoder `hw` (FFmpeg falls back to software where it cannot)."""
    return {"hwaccel": av.codec.hwaccel.HWAccel(hw, allow_software_fallback=True)} if hw else {}


def frame_rate(stream: av.video.stream.VideoStream) -> float | None:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else None
