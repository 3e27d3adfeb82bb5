"""`FileSource`: a video file (the "file" scheme: a plain path, or file:///path). Not live: FrameSource paces it
when realtime and loops it when asked, and every problem is final: the file is missing, a packet does not decode,
the decoder had to conceal damage in a frame, or the file ends well before the duration its index declares (cut
at a packet boundary, a truncated file decodes cleanly up to the cut)."""

from __future__ import annotations

import os
from typing import Iterator

import av

from vlora_va.ingest.av_source import AVSource, describe_av_error, frame_rate, hw_accel, packet_time
from vlora_va.ingest.source import SourceError

TRUNCATED_TOLERANCE_S = 0.5  # a file that ends this much before the duration its index declares is truncated


class FileSource(AVSource):
    live = False
    kind = "file"

    @property
    def path(self) -> str:
        return self.uri.removeprefix("file://")

    def open_container(self, hw: str | None) -> av.container.InputContainer:
        if not os.path.isfile(self.path):
            raise SourceError(f"cannot open {self.uri!r}: no such file")
        try:
            return av.open(self.path, **hw_accel(hw))
        except (av.error.FFmpegError, OSError) as e:
            raise SourceError(f"cannot open {self.uri!r}: {describe_av_error(e)}") from None

    def decode(self, container: av.container.InputContainer, stream) -> Iterator[av.VideoFrame]:
        """Decoded frames in presentation order; SourceError at the first damage (see the module docstring)."""
        decoded = 0
        last_time: float | None = None
        try:
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.error.FFmpegError as e:
                    raise SourceError(f"cannot decode {self.uri!r} {packet_time(packet)} after {decoded} frames: "
                                      f"{describe_av_error(e)} (corrupt or truncated file?)") from None
                for frame in frames:
                    if frame.is_corrupt:
                        where = f"at {frame.time:.2f} s " if frame.time is not None else ""
                        raise SourceError(f"cannot decode {self.uri!r}: frame {decoded} {where}is damaged (the "
                                          f"decoder had to conceal errors in it; corrupt file?)")
                    decoded += 1
                    last_time = frame.time if frame.time is not None else last_time
                    yield frame
        except av.error.FFmpegError as e:  # demuxing a truncated file
            raise SourceError(f"cannot read {self.uri!r} after {decoded} frames: {describe_av_error(e)}") from None
        if last_time is not None:
            self._check_complete(stream, last_time, decoded)

    def _check_complete(self, stream, last_time: float, decoded: int) -> None:
        """SourceError where the last frame ends well before the end the file's index declares."""
        declared = _declared_end(stream)
        rate = frame_rate(stream)
        end = last_time + (1.0 / rate if rate else 0.0)
        if declared is not None and declared - end > TRUNCATED_TOLERANCE_S:
            raise SourceError(f"{self.uri!r} ends at {end:.2f} s after {decoded} frames, but its index declares "
                              f"{declared:.2f} s (truncated file?)")


def _declared_end(stream) -> float | None:
    """The media time (s) a file's index says its video stream ends at, or None where it does not say
    (the container's duration is not used: an audio track may be longer than the video)."""
    if not (stream.duration and stream.time_base):
        return None
    start = stream.start_time * stream.time_base if stream.start_time else 0
    return float(start + stream.duration * stream.time_base)
