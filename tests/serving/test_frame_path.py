"""A frame's path stays short and one way: one chunk, from the message read off the socket until its row is handed
to the sink, passes through at most 10 files and enters none of them twice. Measured by bench/frame_path.py (its
docstring states the method) on a real daemon; before the restructuring (issue 28) the same measure gave 14 files,
with the plan module entered 16 times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def frame_path(tmp_path, tasks: str) -> dict:
    out = tmp_path / "path.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "frame_path.py"), "--tasks", tasks, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def test_one_chunk_reaches_its_row_through_at_most_ten_files_entering_none_twice(tmp_path):
    path = frame_path(tmp_path, "detect")
    assert path["files"] <= 10, path["path"]
    assert path["entered_twice"] == {}, path["entered_twice"]
    # the stages, in order: the data really went through each layer of the house
    stages = ["serving/transport.py", "contracts/wire.py", "serving/admission.py", "serving/scheduling/base.py",
              "engine/executor.py", "engine/backends/torch_eager.py", "engine/heads/detection.py", "serving/rows.py",
              "outputs/sinks/queued.py"]
    order = [next(i for i, f in enumerate(path["path"]) if f.endswith(s)) for s in stages]
    assert order == sorted(order), path["path"]
