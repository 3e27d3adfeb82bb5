"""Issue 46, item 3: frame filtering end to end. `vlora-va run` (a real supervisor, ingest worker and daemon, real
ZeroMQ sockets) on the tiny random-weight backbone reads the quiet camera (sample_videos/quiet.mp4: an empty scene
whose light drifts slowly, with real people walking through at 27-33 s) for 40 one-second chunks, with one untracked
detection task that filters its frames.

What is proven, with the books kept from what ingest itself logs (at DEBUG, "sent chunk N (F frames)": F = 0 when
the task reused an earlier chunk), never from the daemon's counters:
- the run ends by itself with exit code 0, and every chunk ingest sent has exactly one row for the task;
- most rows of a quiet camera are reused (`reused_chunk`), yet the walk-through's chunks carry their frames;
- a reused row is the row of a chunk that was served (status ok, itself not reused): the same detections, but its
  own chunk's media times, and never older than refresh_chunks;
- the rows that are not reused are exactly the chunks whose frames ingest sent.

The threshold: thumbnails are taken of the letterboxed model image, here the tiny backbone's 56 px, not 336 px, so
the feature reads differently than on the real model. Measured on this footage (the task's frame of each of the
first 40 chunks, as the chunker takes it): the quiet scene drifts up to 10 grey levels from chunk 0 by chunk 12
(the light), at most 6.4 from a reference no more than 4 chunks older; the walk-through's chunks differ by 22-45.
With threshold 6 and refresh_chunks 5 the filter sends chunks 0, 5, 10, 15, 20, 25, 27-33 and 38 (14) and reuses
the other 26 (65%; threshold 4 would reuse 25, so the share hardly depends on where in the noise it lies).
"""

from __future__ import annotations

import json
import re

import pytest

from tests import pipeline_helpers
from tests.pipeline_helpers import ROOT, Run, ingest_sent, tiny_pipeline, write
from vlora_va.ingest.chunker import spread
from vlora_va.testing.messages import make_seeing_detector

QUIET = ROOT / "sample_videos" / "quiet.mp4"  # 768x576, 10 fps, 180 s
FPS, CHUNK_S, FRAMES = 10, 1.0, 1  # the stream's fps and chunk length, the task's frames per chunk
CHUNKS = 40
THRESHOLD, REFRESH = 6.0, 5
MIN_REUSED_SHARE = 0.5  # measured 26 / 40 = 0.65 (module docstring); a quiet camera's rows are mostly reused


def walk_through_s() -> tuple[float, float]:
    """The first walk-through's seconds in quiet.mp4 (as make_quiet.py recorded them)."""
    meta = json.loads((ROOT / "sample_videos" / "quiet.json").read_text())
    start, end = meta["walkthroughs"][0]["quiet_s"]
    return float(start), float(end)


def media_times(chunk: int) -> list[float]:
    """The media times of the task's frames in `chunk`: the chunker's pick among the chunk's frames."""
    n = round(FPS * CHUNK_S)
    return [(chunk * n + i) / FPS for i in spread(n, FRAMES)]


def filtering_pipeline(tmp_path, backbone, adapter) -> dict:
    """One stream of the quiet camera, read as fast as the daemon takes it, nothing dropped on the way (a dropped
    reference would change what the filter decides), its detection task filtered."""
    task = {"name": "det", "adapter": "seeing", "frames_per_chunk": FRAMES, "deadline_ms": 30000,
            "filter": {"threshold": THRESHOLD, "refresh_chunks": REFRESH}}
    stream = {"id": "cam", "source": str(QUIET), "fps": FPS, "chunk_seconds": CHUNK_S, "loop": False,
              "realtime": False, "max_chunks": CHUNKS, "tasks": [task]}
    return tiny_pipeline(tmp_path, backbone, {"seeing": adapter}, [stream], ingest={"drop_policy": "block"})


def run_to_the_end(path, monkeypatch) -> Run:
    """`vlora-va --log-level DEBUG run PATH` until it ends by itself (max_chunks): at DEBUG, ingest logs each chunk
    it sends with its number of frames."""
    monkeypatch.setattr(pipeline_helpers, "CLI", [*pipeline_helpers.CLI, "--log-level", "DEBUG"])
    run = Run(path)
    try:
        run.wait_for("the run to end by itself", lambda: run.proc.poll() is not None)
        assert run.proc.returncode == 0, run.log()[-4000:]
    finally:
        run.close()
    return run


def frames_sent(log: str, stream: str) -> dict[int, int]:
    """Ingest's own book: chunk -> frames it carried, for every chunk ingest handed to ZeroMQ."""
    out: dict[int, int] = {}
    for seq, frames in re.findall(rf"stream {re.escape(stream)}: sent chunk (\d+) \((\d+) frames\)", log):
        assert int(seq) not in out, f"chunk {seq} sent twice"
        out[int(seq)] = int(frames)
    return out


def rows_by_chunk(rows: list[dict], stream: str, task: str) -> dict[int, dict]:
    """The task's rows by chunk; a chunk answered twice is an error."""
    mine = [r for r in rows if r["stream"] == stream and r["task"] == task]
    by_chunk = {r["chunk"]: r for r in mine}
    assert len(by_chunk) == len(mine), f"a chunk answered twice: {sorted(r['chunk'] for r in mine)}"
    return by_chunk


def check_reused_row(row: dict, rows: dict[int, dict]) -> None:
    """A reused row is the row of a chunk that was served, with its own chunk's times, at most REFRESH - 1 old."""
    chunk, n = row["chunk"], row["reused_chunk"]
    assert 0 < chunk - n < REFRESH, f"chunk {chunk} reuses chunk {n}: older than refresh_chunks {REFRESH}"
    source = rows.get(n)
    assert source is not None, f"chunk {chunk} reuses chunk {n}, which has no row"
    assert source["status"] == "ok" and "reused_chunk" not in source, (chunk, source)
    assert row["status"] == "ok", row
    assert row["frames"] == source["frames"], f"chunk {chunk}'s detections are not chunk {n}'s"
    assert row["frame_ts"] == pytest.approx(media_times(chunk)), (chunk, row["frame_ts"])
    assert row["frame_ts"] != source["frame_ts"], (chunk, n, row["frame_ts"])


def test_a_quiet_camera_reuses_most_rows_and_every_reuse_is_a_served_chunks_result(tmp_path, tiny_backbone_dir,
                                                                                    monkeypatch):
    adapter = make_seeing_detector(tmp_path / "seeing")
    run = run_to_the_end(write(tmp_path / "pipeline.yaml", filtering_pipeline(tmp_path, tiny_backbone_dir, adapter)),
                         monkeypatch)
    log = run.log()

    # 1. every chunk ingest sent has exactly one row for the task
    sent = frames_sent(log, "cam")
    assert ingest_sent(log) == {"cam": CHUNKS} and sorted(sent) == list(range(CHUNKS))
    rows = rows_by_chunk(run.rows(), "cam", "det")
    assert sorted(rows) == sorted(sent)

    # 2. a quiet camera: most rows reused; the people walking through are sent
    reused = {c for c, r in rows.items() if "reused_chunk" in r}
    assert len(reused) >= MIN_REUSED_SHARE * CHUNKS, f"only {len(reused)} of {CHUNKS} rows reused"
    start, end = walk_through_s()
    walking = {c for c in rows if all(start <= t <= end for t in media_times(c))}
    assert walking and not walking & reused, f"walk-through chunks {sorted(walking)} reused: {sorted(reused)}"

    # 3. every reused row is a served chunk's result, with its own times, never older than refresh_chunks
    assert any(f["detections"] for f in rows[0]["frames"])  # a head that sees: equal payloads mean something
    for c in sorted(reused):
        check_reused_row(rows[c], rows)
    served = sorted(set(rows) - reused)
    for c in served:
        assert rows[c]["status"] == "ok" and rows[c]["frame_ts"] == pytest.approx(media_times(c)), rows[c]
    times = [t for c in sorted(rows) for t in rows[c]["frame_ts"]]
    assert times == sorted(set(times)), "frame_ts do not increase with the chunk number"

    # 4. the rows not reused are exactly the chunks that carried frames, by ingest's own word
    assert served == sorted(c for c, frames in sent.items() if frames > 0)
    assert sorted(reused) == sorted(c for c, frames in sent.items() if frames == 0)
