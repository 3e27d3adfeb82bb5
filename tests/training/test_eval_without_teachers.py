"""`vlora-va eval` on a fresh clone, where the teacher ONNX files (development assets) are not there: the README's
command scores the shipped adapter on the human-checked set, says which teacher-relative figures it skipped and
why, and exits 0."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_default_backbone

ROOT = Path(__file__).resolve().parents[2]
MIN_PERSON_F1 = 0.8  # well under the shipped detector's 0.94 on these frames, well above a broken model's


def readme_eval_command() -> list[str]:
    """The documented `vlora-va eval adapters/detect --on ...` line (README.md, docs/), as arguments after
    `vlora-va`."""
    lines = {line for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             for line in doc.read_text().splitlines() if line.startswith("vlora-va eval adapters/detect --on ")}
    assert len(lines) == 1, lines  # documented once, or the same everywhere
    return lines.pop().split()[1:]


@pytest.mark.slow
def test_the_readme_eval_without_teacher_files_scores_the_human_set_and_says_what_it_skipped(tmp_path):
    require_default_backbone()
    teachers = tmp_path / "teachers"  # where a fresh clone has no teacher files
    teachers.mkdir()
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "vlora_va.cli", *readme_eval_command(), "--json", str(out)],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT,
                          env={**os.environ, "VLORA_VA_TEACHERS": str(teachers)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["reports"]) == ["pedestrians.mp4[55-79.5]", "bikes.mp4[0-end]"]

    # one line per range names the figures skipped and the missing file; none of those figures is reported
    missing = f"teacher 'centernet' not found in {teachers}"
    skipped = [line for line in proc.stdout.splitlines() if "skipped the teacher-relative figures" in line]
    assert [line.split(":")[0] for line in skipped] == list(report["reports"]), proc.stdout
    assert all(missing in line and "vlora-va teachers fetch" in line for line in skipped), skipped
    for rep in report["reports"].values():
        assert "per_class" not in rep and missing in rep["teacher_missing"]

    # the human-checked set needs no teacher: its 49 frames and 339 persons of 55-79.5 s (README) are scored
    human = report["reports"]["pedestrians.mp4[55-79.5]"]["human"]
    person = human["per_class"]["person"]
    assert human["frames"] == 49 and person["refs"] == 339
    assert person["f1"] >= MIN_PERSON_F1, person
    assert f"pedestrians.mp4[55-79.5] [human] person: F1@0.5 {person['f1']:.3f}" in proc.stdout
    assert report["human_set"]["frozen"]
