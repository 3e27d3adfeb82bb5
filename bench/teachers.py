"""Each teacher and their fusion on the human-checked set: person and car precision, recall and F1.

    python bench/teachers.py [--tiles 1,2] [--out bench/results/teachers]

Teachers: CenterNet and NanoDet as `vlora-va teachers fetch` converts them (OpenVINO IR, fp32), and their box
fusion (label_fusion.fuse_boxes, equal weights), each read at score >= 0.4 (the label threshold of the shipped
specs), on the whole frame and with 2 x 2 tiles. Ranges: pedestrians.mp4 55-79.5 s (49 frames) and bikes.mp4
(its human frames). Writes JSON and a markdown table; says per class and range whether fusion beats the better
single teacher.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.training.evaluate import HUMAN_SET, evaluate_teacher_on_human, load_human_set  # noqa: E402
from vlora_va.training.spec import Range  # noqa: E402
from vlora_va.testing.host import cpu_name  # noqa: E402
from vlora_va.training.teacher_fetch import fetch  # noqa: E402

TEACHERS = ("centernet", "nanodet", "fused")
CLASSES = ("person", "car")


def measure(tiles: list[int]) -> dict:
    fetch(say=lambda *_: None)
    hs = load_human_set(HUMAN_SET)
    ranges = [Range(ROOT / "sample_videos" / "pedestrians.mp4", 55, 79.5), Range(ROOT / "sample_videos" / "bikes.mp4")]
    rows = []
    for n in tiles:
        for name in TEACHERS:
            t0 = time.monotonic()
            rep = evaluate_teacher_on_human(hs, ranges, tiles=n, persons=False, teacher_name=name)
            for where, r in rep["reports"].items():
                for cls in CLASSES:
                    c = r["human"]["per_class"][cls]
                    rows.append({"teacher": name, "tiles": n, "range": where, "class": cls, "refs": c["refs"],
                                 "precision": c["precision"], "recall": c["recall"], "f1": c["f1"],
                                 "ap50": c["ap50"]})
            print(f"{name} tiles {n}: {time.monotonic() - t0:.0f} s", flush=True)
    return {"rows": rows, "threshold": 0.4, "human_set": hs.describe(), "cpu": cpu_name(),
            "date": time.strftime("%Y-%m-%d"), "machine": platform.machine()}


def verdicts(rows: list[dict]) -> list[dict]:
    """Per (tiles, range, class): does the fusion's F1 beat the better single teacher's?"""
    out = []
    keys = sorted({(r["tiles"], r["range"], r["class"]) for r in rows})
    for tiles, where, cls in keys:
        f1 = {r["teacher"]: r["f1"] for r in rows if (r["tiles"], r["range"], r["class"]) == (tiles, where, cls)}
        best_single = max(f1["centernet"], f1["nanodet"])
        out.append({"tiles": tiles, "range": where, "class": cls, "fused": f1["fused"], "best_single": best_single,
                    "fusion_improves": f1["fused"] > best_single + 1e-9})
    return out


def table(result: dict) -> str:
    lines = [f"# Teachers on the human-checked set ({result['date']}, {result['cpu']})", "",
             f"Boxes scoring ≥ {result['threshold']}; IoU ≥ 0.5. Human set {result['human_set']['sha256'][:12]}.", "",
             "| tiles | range | class | teacher | refs | P | R | F1 | AP50 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['tiles']} | {r['range']} | {r['class']} | {r['teacher']} | {r['refs']} | "
                     f"{r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} | {r['ap50']:.3f} |")
    lines += ["", "| tiles | range | class | fused F1 | better single F1 | fusion improves |", "|---|---|---|---|---|---|"]
    for v in result["verdicts"]:
        lines.append(f"| {v['tiles']} | {v['range']} | {v['class']} | {v['fused']:.3f} | {v['best_single']:.3f} | "
                     f"{'yes' if v['fusion_improves'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", default="1,2")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "teachers")
    args = ap.parse_args()
    result = measure([int(t) for t in args.tiles.split(",")])
    result["verdicts"] = verdicts(result["rows"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    text = table(result)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
