"""Ingest: decode files and RTSP cameras, cut 1-second chunks, send them to the daemon over ZeroMQ.

    source.py   FrameSource: PyAV decoding, fps resampling, looping, pacing, RTSP reconnects
    chunker.py  Chunker: each task's frames selected and letterboxed into a wire chunk
    worker.py   run_ingest / plan_workers: stream threads, the bounded drop-policy queue, the PUSH socket

This package never imports torch: an ingest process leaves the cores to decoding and inference.
"""

from vlora_va.ingest.worker import plan_workers, run_ingest

__all__ = ["plan_workers", "run_ingest"]
