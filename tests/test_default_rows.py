"""The default pipeline's results do not change when the code is reorganised: `vlora-va run` on pipelines.yaml (files
read as fast as possible, fp32 backbone) must give the payloads, tracks and events recorded in
tests/fixtures/default_rows.jsonl.

Recorded before the restructuring (issue 28), and again when the default pipeline gained a tracked task, a line and
a zone (issue 29), and when the default tracker gained appearance and re-entry (issue 45), by
`VLORA_VA_RECORD=1 pytest tests/test_default_rows.py`. Only what the heads, the tracker and
the rules computed is compared (boxes, classes, scores, labels, persons, which boxes share a track, events and
their counts), never latencies, batch sizes, LoRA modes, run ids or wall times, which differ from run to run.
Track ids are renamed t1, t2, ... in order of first appearance. Batches form differently from run to run, and a
float sum's order depends on the batch's shape and mode, so numbers may move in their last printed digit: scores
are compared to 2e-4 and box corners to 0.2 px, and nothing may appear or vanish."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.test_pipeline_e2e import ROOT, pipeline, read_events, run

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "default_rows.jsonl"
SCORE_TOL, BOX_TOL = 2e-4, 0.2
PAYLOAD_KEYS = ("type", "stream", "chunk", "task", "adapter", "status", "frame_ts", "frames", "label", "score",
                "scores", "persons", "untrained", "reused_chunk")  # reused_chunk: which chunks frame filtering skipped
EVENT_KEYS = ("type", "event", "phase", "stream", "task", "chunk", "line", "zone", "direction", "track_id", "class",
              "ts", "box", "counts", "dwell_s")


def payloads(rows: list[dict], events: list[dict]) -> list[dict]:
    """Each result row's payload in (stream, chunk, task) order, then the events in (stream, ts, event) order;
    track ids renamed in order of first appearance."""
    out = sorted(({k: r[k] for k in PAYLOAD_KEYS if k in r} for r in rows),
                 key=lambda r: (r["stream"], r["chunk"], r["task"]))
    out += sorted(({k: e[k] for k in EVENT_KEYS if k in e} for e in events),
                  key=lambda e: (e["stream"], e["ts"], e["event"], e.get("line") or e.get("zone") or ""))
    names: dict[str, str] = {}
    for r in out:
        for d in (d for f in r.get("frames", []) for d in f["detections"] if "track_id" in d):
            d["track_id"] = names.setdefault(d["track_id"], f"t{len(names) + 1}")
        if "track_id" in r:
            r["track_id"] = names.setdefault(r["track_id"], f"t{len(names) + 1}")
    return out


def difference(got, want, path: str = "") -> str | None:
    """Where got and want differ beyond the tolerances (None: they agree)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{path}: keys {sorted(got) if isinstance(got, dict) else got!r} != {sorted(want)}"
        return next((d for k in want if (d := difference(got[k], want[k], f"{path}.{k}"))), None)
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{path}: {got!r} != {want!r}"
        return next((d for i, (g, w) in enumerate(zip(got, want)) if (d := difference(g, w, f"{path}[{i}]"))), None)
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        tol = BOX_TOL if ".box" in path else SCORE_TOL
        return None if abs(got - want) <= tol else f"{path}: {got} != {want} (tolerance {tol})"
    return None if got == want else f"{path}: {got!r} != {want!r}"


def test_default_pipeline_rows_are_unchanged(tmp_path):
    path = pipeline(tmp_path, realtime=False)
    cfg = yaml.safe_load(path.read_text())
    cfg["daemon"]["precision"] = "fp32"
    cfg["daemon"]["profile_cache"] = str(tmp_path / "profiles")
    path.write_text(yaml.safe_dump(cfg))
    _, rows = run(path)
    got = payloads(rows, read_events(path.parent))
    results = [r for r in got if r["type"] == "result"]
    assert all(r["status"] == "ok" for r in results), [r for r in results if r["status"] != "ok"][:3]
    if os.environ.get("VLORA_VA_RECORD"):
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in got))
        pytest.skip(f"recorded {len(got)} rows in {FIXTURE.relative_to(ROOT)}")
    want = [json.loads(line) for line in FIXTURE.read_text().splitlines()]

    def key(r):
        return r["type"], r["stream"], r.get("chunk"), r.get("task"), r.get("event")

    assert [key(r) for r in got] == [key(r) for r in want]
    problems = [d for g, w in zip(got, want) if (d := difference(g, w, "/".join(map(str, key(w)))))]
    assert not problems, f"{len(problems)} of {len(want)} rows differ, e.g.:\n" + "\n".join(problems[:10])


def test_the_comparison_sees_a_changed_payload():
    """The tolerance hides the last digit, not a different result; a box moved to another track is a difference."""
    want = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    tracked = next(r for r in want if r.get("frames") and any("track_id" in d for d in r["frames"][0]["detections"]))
    other = json.loads(json.dumps(tracked))
    box = next(d for d in other["frames"][0]["detections"] if "track_id" in d)
    box["track_id"] += "0"
    assert "track_id" in difference(other, tracked)
    events = [r for r in want if r["type"] == "event"]
    assert {"line_crossed", "zone_entered"} <= {e["event"] for e in events}
    recounted = json.loads(json.dumps(events[0]))
    recounted["counts"] = {}
    assert "counts" in difference(recounted, events[0])
    row = next(r for r in want if r.get("frames") and r["frames"][0]["detections"])
    assert difference(json.loads(json.dumps(row)), row) is None
    moved = json.loads(json.dumps(row))
    moved["frames"][0]["detections"][0]["box"][0] += 1.0
    assert "box" in difference(moved, row)
    rescored = json.loads(json.dumps(row))
    rescored["frames"][0]["detections"][0]["score"] += 0.01
    assert "score" in difference(rescored, row)
    fewer = json.loads(json.dumps(row))
    fewer["frames"][0]["detections"].pop()
    assert difference(fewer, row) is not None
