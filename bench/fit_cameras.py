"""`vlora-va adapters fit` on every camera with human boxes: the real traffic camera, the surveillance camera itself and
the three "new cameras" re-shot from it (bench/make_views.py --fit), each judged by its guard against the human boxes.

    python bench/fit_cameras.py [--cameras traffic-a,surveillance,fit-corner,fit-bright,fit-night-zoom] [--collect]

Each fit: `vlora-va adapters fit VIDEO --out build/fits/NAME --human HUMAN.json` on the whole video (its human-checked
frames after the first 70% of it judge the guard; the ones before are clicks). The general `detect` is the baseline,
scored in the same run on the same frames. --collect only reads build/fits/*/FIT.json (or the refused report) of an
earlier run. Needs build/views/ from `python bench/make_views.py --video sample_videos/pedestrians.mp4 --out build/views
--fit` for the three views, and ../shared/footage/traffic-a.mp4. Writes bench/results/fit_cameras.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.common.host import cpu_name  # noqa: E402
from vlora_va.testing.footage import second_camera  # noqa: E402
from vlora_va.training.fit import refused_path  # noqa: E402

CAMERAS = {  # name: (video, human boxes, what the table scores)
    "traffic-a": (second_camera() or ROOT.parent / "shared" / "footage" / "traffic-a.mp4",
                  ROOT / "adapters/eval/human-traffic-a.json", "vehicle"),
    "surveillance": (ROOT / "sample_videos/pedestrians.mp4", ROOT / "adapters/eval/human-v1.json", "person"),
    **{v: (ROOT / f"build/views/pedestrians-{v}.mp4", ROOT / f"build/views/human-{v}.json", "person")
       for v in ("fit-corner", "fit-bright", "fit-night-zoom")},
}
OUT = ROOT / "build" / "fits"


def run(name: str) -> None:
    video, human, _ = CAMERAS[name]
    subprocess.run([str(ROOT / ".venv" / "bin" / "vlora-va"), "adapters", "fit", str(video), "--out", str(OUT / name),
                    "--human", str(human)], check=False)


def row(name: str) -> dict:
    _, _, what = CAMERAS[name]
    path = OUT / name / "FIT.json"
    report = json.loads(path.read_text()) if path.is_file() else json.loads(refused_path(OUT / name).read_text())
    g = report.get("guard", {})

    def f1(model: str) -> float | None:
        entry = report.get("held_out", {}).get(model, {})
        r = entry.get("human_vehicle") if what == "vehicle" else entry.get("human", {}).get("person")
        return r["f1"] if r else None

    worth = report.get("labels", {}).get("against_human", {})
    return {"camera": name, "scored": what, "general": f1("general"), "fitted": f1("fitted"),
            "guard_kept": g.get("kept"), "guard": g.get("reason", report.get("refused")),
            "pooled_start": g.get("start_f1"), "pooled_fitted": g.get("fitted_f1"), "ci95": g.get("ci95"),
            "judged_frames": g.get("frames"), "teachers_f1": worth.get("teachers", {}).get(what, {}).get("f1"),
            "refined_f1": worth.get("refined", {}).get(what, {}).get("f1"), "seconds": report.get("seconds"),
            "footage_s": report.get("range_s", [0, 0])[1], "date": report.get("date"), "cpu": report.get("cpu")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cameras", default=",".join(CAMERAS))
    ap.add_argument("--collect", action="store_true", help="read the reports of an earlier run, fit nothing")
    args = ap.parse_args()
    names = args.cameras.split(",")
    if not args.collect:
        for name in names:
            run(name)
    rows = [row(n) for n in names]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(), "rows": rows}
    results = ROOT / "bench" / "results"
    (results / "fit_cameras.json").write_text(json.dumps(meta, indent=1) + "\n")
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [f"# adapters fit on every camera with human boxes ({meta['date']}, {meta['cpu']})", "",
             "| camera | scored | teachers / refined labels | general `detect` | fitted "
             "| guard (all classes, 95% interval) | fit time |", "|---|---|---|---:|---:|---|---:|"]
    for r in rows:
        guard = ("kept" if r["guard_kept"] else "refused") + (
            f": {fmt(r['pooled_start'])} -> {fmt(r['pooled_fitted'])} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}], "
            f"{r['judged_frames']} frames" if r["ci95"] else f": {r['guard']}")
        lines.append(f"| {r['camera']} ({r['footage_s']:.0f} s) | {r['scored']} F1 | {fmt(r['teachers_f1'])} / "
                     f"{fmt(r['refined_f1'])} | {fmt(r['general'])} | **{fmt(r['fitted'])}** | {guard} | "
                     f"{(r['seconds'] or 0) / 60:.1f} min |")
    (results / "fit_cameras.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
