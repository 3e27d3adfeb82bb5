"""Result records: the JSON object written for every request (one JSON Lines row)."""

from __future__ import annotations

from .requests import Request

RESULT_VERSION = 1


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


def result_record(req: Request, result: dict, *, compute_start: float, compute_end: float, batch_images: int,
                  trained: bool) -> dict:
    rec = {
        "v": RESULT_VERSION,
        "stream": req.stream,
        "chunk": req.seq,
        "task": req.task,
        "adapter": req.adapter,
        "frame_ts": [round(t, 4) for t in req.frame_ts],
        **({} if trained else {"untrained": True}),
        **result,
        "latency_ms": {
            "queue": _ms(compute_start - req.received_wall),
            "compute": _ms(compute_end - compute_start),
            "total": _ms(compute_end - req.ready_wall),
        },
        "deadline_ms": _ms(req.deadline_wall - req.ready_wall),
        "deadline_met": compute_end <= req.deadline_wall,
        "batch_images": batch_images,
    }
    if req.dropped_before:
        rec["dropped_before"] = req.dropped_before
    return rec


def error_record(req: Request, message: str, now: float) -> dict:
    """A request that could not be served still gets a row, saying why."""
    return {
        "v": RESULT_VERSION, "stream": req.stream, "chunk": req.seq, "task": req.task, "adapter": req.adapter,
        "frame_ts": [round(t, 4) for t in req.frame_ts], "error": message,
        "latency_ms": {"queue": 0.0, "compute": 0.0, "total": _ms(now - req.ready_wall)},
        "deadline_ms": _ms(req.deadline_wall - req.ready_wall), "deadline_met": False,
    }
