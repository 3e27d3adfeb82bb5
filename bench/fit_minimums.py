"""How little footage a fit can work with: `adapters fit` on the first E seconds of the traffic camera, judged on its 12
human-checked frames (8.5-11.3 s, never trained on), with the up-front minimums lifted so that every length is fitted.

    python bench/fit_minimums.py [--ends 3,6] [--out bench/results/fit_minimums]

For each length: the labelled objects the training frames held, the fit's own guard (on its held-out part, against
the refined labels), and the guard against the human boxes (fit_guard.judge: the general `detect` against the fitted
adapter). training/fit.py's MIN_FOOTAGE_S and MIN_OBJECTS come from this table: the shortest footage whose fit beats
the general adapter on the human boxes beyond the noise, and the objects it held. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.common.host import cpu_name  # noqa: E402
from vlora_va.testing.footage import second_camera  # noqa: E402
from vlora_va.engine.adapters import load_adapter_dir  # noqa: E402
from vlora_va.training import fit as F  # noqa: E402
from vlora_va.training.evaluate import TRAFFIC_SET, detection_predictions, load_human_set, merged_backbone  # noqa: E402
from vlora_va.training.fit_guard import judge  # noqa: E402
from vlora_va.training.frames import read_frames  # noqa: E402

TRAFFIC = second_camera() or ROOT.parent / "shared" / "footage" / "traffic-a.mp4"


def on_human(adapter_dir: Path, frames, refs) -> dict:
    adapter = load_adapter_dir("x", adapter_dir, 384)
    preds = detection_predictions(adapter, merged_backbone("dinov2-small", adapter), frames)
    return {"preds": preds, "threshold": adapter.head.score_threshold}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ends", default="3,6")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fit_minimums"))
    args = ap.parse_args()
    hs = load_human_set(TRAFFIC_SET)
    frames = [f for f in read_frames(TRAFFIC, 8.4) if f.key in hs.boxes]
    refs = {f.key: hs.boxes[f.key] for f in frames}
    general = on_human(F.GENERAL_ADAPTER, frames, refs)
    F.MIN_FOOTAGE_S, F.MIN_OBJECTS, F.MIN_HELD_OUT_OBJECTS = 0.0, 0, 0  # measured here, not applied
    rows = []
    for end in [float(e) for e in args.ends.split(",")]:
        out = ROOT / "build" / "fit-minimums" / f"traffic-a-{end:g}s"
        t0 = time.monotonic()
        report = F.fit(F.FitOptions(str(TRAFFIC), out, end=end, keep_anyway=True, say=lambda *_: None))
        fitted = on_human(out, frames, refs)
        v = judge(general["preds"], fitted["preds"], refs, (general["threshold"], fitted["threshold"]), "human boxes")
        rows.append({"footage_s": end, "train_frames": report["frames"]["train"], "objects": report["objects"]["train"],
                     "own_guard": report["guard"]["kept"], "own_guard_reason": report["guard"]["reason"],
                     "human_general_f1": v.start_f1, "human_fitted_f1": v.fitted_f1, "human_ci95": list(v.ci95),
                     "human_verdict": v.kept, "seconds": round(time.monotonic() - t0)})
        print(json.dumps(rows[-1]), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(), "rows": rows}
    Path(args.out).with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    lines = [f"# Fit minimums on traffic-a ({meta['date']}, {meta['cpu']})", "",
             "| footage | training frames | labelled objects | the fit's own guard | vehicle F1 on the human frames: "
             "general -> fitted (95% interval of the gain) | better beyond the noise |", "|---:|---:|---:|---|---|---|"]
    lines += [f"| {r['footage_s']:g} s | {r['train_frames']} | {r['objects']} | "
              f"{'kept' if r['own_guard'] else 'refused'} "
              f"| {r['human_general_f1']:.3f} -> {r['human_fitted_f1']:.3f} ([{r['human_ci95'][0]:+.3f}, "
              f"{r['human_ci95'][1]:+.3f}]) | {'yes' if r['human_verdict'] else 'no'} |" for r in rows]
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
