"""A task's frame filter (`tasks[].filter` in pipelines.yaml): when a camera shows nothing new, its frames need not
cross the network nor the backbone.

    filter: {threshold: 2.5, refresh_chunks: 10}

Ingest compares each chunk's frames of the task with the frames it last *sent* for that task (a cheap difference
feature on small grey thumbnails, vlora_va/ingest/filtering.py). Below `threshold`, the task's frames stay at the
camera: ingest sends the task as "reuse chunk N" and the daemon writes the task's row with chunk N's result
(`"reused_chunk": N`, the current chunk's `frame_ts`). At least every `refresh_chunks` chunks the frames are sent
anyway, so no reused result is older than that. The threshold is the feature's unit: the mean absolute difference of
grey levels (0-255) between two 64x64 thumbnails over the 8x8 block where it is largest (one person's worth of the
view: a local change, not diluted by the empty rest of the frame), the largest over the task's frames; sensor noise
is about 0.5-2, a person a second apart 8 or more. It is tuned offline per task for an accuracy target
(`max_loss`), on the camera's busy and quiet footage. Tracked tasks are never filtered: a tracker needs every frame
it is given.

The thresholds live here, in the pipeline file, not in adapter directories: an ingest-only host reads no adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_THRESHOLD = 255.0  # the feature's range (grey levels)
MAX_REFRESH_CHUNKS = 3600


@dataclass(frozen=True)
class FilterConfig:
    threshold: float  # below this difference (mean |grey| of the most-changed block, 0-255): not sent
    refresh_chunks: int = 10  # frames are sent at least every this many chunks (the oldest a reused result gets)
    max_loss: float = 0.02  # the accuracy loss the threshold was tuned for (`vlora-va filter tune`); informative


_KEYS = {"threshold", "refresh_chunks", "max_loss"}


def parse_filter(c, raw: Any, path: str, tracked: bool) -> FilterConfig | None:
    """`tasks[i].filter` (c: config.py's checker, duck typed); None when absent, false, or bad (reported)."""
    if raw is None or raw is False:
        return None
    d = c.mapping(raw, path, _KEYS)
    if d is None:
        return None
    threshold = c.get(d, "threshold", path, float, minimum=0)
    if threshold is not None and threshold > MAX_THRESHOLD:
        c.error(f"{path}.threshold", f"must be at most {MAX_THRESHOLD:g} (grey levels), got {threshold:g}")
        threshold = None
    refresh = c.get(d, "refresh_chunks", path, int, 10, minimum=1)
    if refresh > MAX_REFRESH_CHUNKS:
        c.error(f"{path}.refresh_chunks", f"must be at most {MAX_REFRESH_CHUNKS}, got {refresh}")
    max_loss = c.get(d, "max_loss", path, float, 0.02, minimum=0)
    if max_loss > 1:
        c.error(f"{path}.max_loss", f"must be in [0, 1], got {max_loss:g}")
    if tracked:
        c.error(path, "a tracked task (track: true) is never filtered: its tracker needs every frame it is given")
        return None
    if threshold is None:
        return None
    return FilterConfig(threshold=threshold, refresh_chunks=min(refresh, MAX_REFRESH_CHUNKS), max_loss=max_loss)
