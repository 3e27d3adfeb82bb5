"""Ingest: decode sources, cut 1-second chunks, send them to the daemon over ZeroMQ.

    source.py        the Source interface (a plug-in per URI scheme) and FrameSource: loops, reconnects, monotone
                     timestamps, fps resampling, pacing
    av_source.py     what every PyAV source shares (open, hardware decoding, the decode loop)
    file_source.py   files (not live: paced when realtime, looped when asked, errors are final)
    rtsp_source.py   RTSP cameras (live: reconnected with backoff forever)
    chunker.py       Chunker: each task's frames selected and letterboxed into a wire chunk
    worker.py        run_ingest / plan_workers: stream threads, the bounded drop-policy queue, the PUSH socket

This package never imports torch (nor anything of vlora_va but contracts/ and common/): an ingest process leaves the
cores to decoding and inference, and an ingest-only host installs no torch.
"""

from vlora_va.ingest.worker import plan_workers, run_ingest

__all__ = ["plan_workers", "run_ingest"]
