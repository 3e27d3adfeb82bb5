"""The default pipeline's results do not change when the code is reorganised: `vlora-va run` on pipelines.yaml (files
read as fast as possible, fp32 backbone) must give the payloads recorded in tests/fixtures/default_rows.jsonl.

Recorded before the restructuring (issue 28) by `VLORA_VA_RECORD=1 pytest tests/test_default_rows.py`. Only what
the heads computed is compared (boxes, classes, scores, labels, persons), never latencies, batch sizes or LoRA
modes, which depend on timing. Batches form differently from run to run, and a float sum's order depends on the
batch's shape and mode, so numbers may move in their last printed digit: scores are compared to 2e-4 and box
corners to 0.2 px, and nothing may appear or vanish."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.test_pipeline_e2e import ROOT, pipeline, run

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "default_rows.jsonl"
SCORE_TOL, BOX_TOL = 2e-4, 0.2
PAYLOAD_KEYS = ("stream", "chunk", "task", "adapter", "status", "frame_ts", "frames", "label", "score", "scores",
                "persons", "untrained")


def payloads(rows: list[dict]) -> list[dict]:
    """Each row's payload, in (stream, chunk, task) order."""
    out = [{k: r[k] for k in PAYLOAD_KEYS if k in r} for r in rows]
    return sorted(out, key=lambda r: (r["stream"], r["chunk"], r["task"]))


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
    got = payloads(rows)
    assert all(r["status"] == "ok" for r in got), [r for r in got if r["status"] != "ok"][:3]
    if os.environ.get("VLORA_VA_RECORD"):
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in got))
        pytest.skip(f"recorded {len(got)} rows in {FIXTURE.relative_to(ROOT)}")
    want = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert [(r["stream"], r["chunk"], r["task"]) for r in got] == [(r["stream"], r["chunk"], r["task"]) for r in want]
    problems = [d for g, w in zip(got, want) if (d := difference(g, w, f"{w['stream']}/{w['chunk']}/{w['task']}"))]
    assert not problems, f"{len(problems)} of {len(want)} rows differ, e.g.:\n" + "\n".join(problems[:10])


def test_the_comparison_sees_a_changed_payload():
    """The tolerance hides the last digit, not a different result."""
    want = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
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
