"""`RtspSource`: an RTSP camera (rtsp:// and rtsps://), over TCP with bounded open and read timeouts. Live: it
comes at its own pace, damaged packets are tolerated (AVSource.decode), and a failed open or a dropped connection
is retried by FrameSource with backoff until the stream is stopped."""

from __future__ import annotations

import av

from vlora_va.ingest.av_source import AVSource, describe_av_error, hw_accel
from vlora_va.ingest.source import SourceError

RTSP_OPTIONS = {
    "rtsp_transport": "tcp",  # UDP loses packets on busy hosts and is blocked by NATs
    # FFmpeg's default probe reads ~2 s of a live stream before av.open returns: every (re)connect would start
    # with a burst of frames already 2 s old, and an outage would be measured 2 s too long. H.264 over RTSP
    # carries its parameters in the SDP, so 0.2 s (microseconds here) loses nothing.
    "analyzeduration": "200000",
}
OPEN_TIMEOUT_S = 10.0  # a server that accepts but never answers must not hang the worker
READ_TIMEOUT_S = 5.0


class RtspSource(AVSource):
    live = True
    kind = "RTSP"

    def open_container(self, hw: str | None) -> av.container.InputContainer:
        try:
            return av.open(self.uri, options=RTSP_OPTIONS, timeout=(OPEN_TIMEOUT_S, READ_TIMEOUT_S), **hw_accel(hw))
        except (av.error.FFmpegError, OSError) as e:
            raise SourceError(f"cannot open {self.uri!r}: {describe_av_error(e)}") from None
