"""Other cameras made from one video: the video re-rendered through fixed camera views (vlora_va/training/views.py)
and the human-checked set carried through each view's geometry, for evaluating on cameras nothing was trained on
(the held-out EVAL_VIEWS) or fitting a per-camera adapter on a "new camera" (--fit: views.fit_views()).

    python bench/make_views.py --video sample_videos/pedestrians.mp4 --out build/views [--views reframed,low-light] [--fit]

Writes, per view, OUT/<video>-<view>.mp4 and OUT/human-<view>.json (loads with evaluate.load_human_set), a contact
sheet OUT/<video>-views-t<T>.png (the source and every view at T seconds, default 60, with the carried human-checked
boxes drawn: green counted, orange don't-care) for a person to check that the boxes land on the people, and
OUT/views.json (each view's parameters, box counts and timings). One thread (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import av
import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.training.evaluate import HUMAN_SET, load_human_set  # noqa: E402
from vlora_va.training.teachers import frame_key  # noqa: E402
from vlora_va.training.views import EVAL_VIEWS, carry_human_set, fit_views, write_view_video  # noqa: E402

TILE_HEIGHT = 360


def frame_at(path: Path, t: float) -> np.ndarray:
    """The decoded frame whose timestamp is t (within 1 ms)."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        c.seek(max(0, int((t - 2) / s.time_base)), stream=s)  # the keyframe before t; decode forward from there
        for f in c.decode(s):
            ft = float(f.pts * s.time_base)
            if abs(ft - t) < 1e-3:
                return f.to_ndarray(format="rgb24")
            if ft > t:
                break
    raise SystemExit(f"{path}: no frame at {t} s")


def tile(rgb: np.ndarray, boxes: list[dict], title: str) -> np.ndarray:
    """The frame with its human-checked boxes (green counted, orange don't-care), scaled to TILE_HEIGHT, titled."""
    img = np.ascontiguousarray(rgb.copy())
    for b in boxes:
        x1, y1, x2, y2 = (int(round(v)) for v in b["box"])
        cv2.rectangle(img, (x1, y1), (x2 - 1, y2 - 1), (255, 150, 0) if b["ignore"] else (0, 255, 0), 2)
    h, w = img.shape[:2]
    img = cv2.resize(img, (round(w * TILE_HEIGHT / h), TILE_HEIGHT), interpolation=cv2.INTER_AREA)
    bar = np.full((28, img.shape[1], 3), 255, np.uint8)
    cv2.putText(bar, title, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
    return np.vstack([bar, img])


def contact_sheet(tiles: list[np.ndarray], columns: int = 3) -> np.ndarray:
    width = max(t.shape[1] for t in tiles)
    height = max(t.shape[0] for t in tiles)
    padded = [cv2.copyMakeBorder(t, 0, height - t.shape[0] + 6, 0, width - t.shape[1] + 6, cv2.BORDER_CONSTANT,
                                 value=(255, 255, 255)) for t in tiles]
    padded += [np.full_like(padded[0], 255)] * (-len(padded) % columns)
    return np.vstack([np.hstack(padded[i:i + columns]) for i in range(0, len(padded), columns)])


def shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--video", type=Path, default=ROOT / "sample_videos" / "pedestrians.mp4")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "views")
    ap.add_argument("--views", default=",".join(EVAL_VIEWS), help=f"comma-separated, of {', '.join(EVAL_VIEWS)}")
    ap.add_argument("--fit", action="store_true", help=f"also the fit views: {', '.join(fit_views())}")
    ap.add_argument("--five-minutes", action="store_true",
                    help="also OUT/five-minutes.mp4: the fit-corner view four times over (the fit timing's footage)")
    ap.add_argument("--human", type=Path, default=HUMAN_SET, help="the human-checked set to carry")
    ap.add_argument("--seed", type=int, default=0, help="noise seed (frame i uses seed + i)")
    ap.add_argument("--sheet-t", type=float, default=60.0, help="media time of the contact sheet's frames")
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)

    names = [n.strip() for n in args.views.split(",") if n.strip()]
    unknown = [n for n in names if n not in EVAL_VIEWS]
    if unknown:
        ap.error(f"unknown view(s) {', '.join(unknown)}; the eval views are {', '.join(EVAL_VIEWS)}")
    views = {n: EVAL_VIEWS[n] for n in names} | (fit_views() if args.fit else {})
    stem = args.video.stem
    human = load_human_set(args.human)
    has_human = any(v == stem for v, _ in human.times.values())
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    key = frame_key(stem, args.sheet_t)
    tiles = [tile(frame_at(args.video, args.sheet_t), human.boxes.get(key, []), f"{stem} (source) @ {args.sheet_t:g} s")]
    manifest = {"video": shown(args.video), "human_set": shown(args.human), "seed": args.seed, "views": {}}
    for name, view in views.items():
        dst = out / f"{stem}-{name}.mp4"
        t0 = time.monotonic()
        video = write_view_video(args.video, dst, view, seed=args.seed)
        record = {"params": view.describe(), "video": shown(dst), **video}
        print(f"wrote {shown(dst)}: {video['frames']} frames {video['size'][0]}x{video['size'][1]}"
              f" (view {video['view_size'][0]}x{video['view_size'][1]}) in {video['seconds']:.1f} s"
              f" ({1000 * video['seconds'] / max(1, video['frames']):.0f} ms/frame), {dst.stat().st_size / 1e6:.1f} MB")
        boxes = []
        if has_human:
            hj = out / f"human-{name}.json"
            t1 = time.monotonic()
            counts = carry_human_set(args.human, view, stem, f"{stem}-{name}", hj, source=shown(dst))
            carried = load_human_set(hj)  # what an evaluation will read
            boxes = carried.boxes.get(frame_key(f"{stem}-{name}", args.sheet_t), [])
            record |= {"human": shown(hj), "human_counts": counts, "human_seconds": round(time.monotonic() - t1, 2)}
            print(f"wrote {shown(hj)}: {counts['images']} images, {counts['boxes']} boxes"
                  f" ({counts['made_ignore']} made don't-care at the edge, {counts['omitted']} outside the view)")
        else:
            print(f"  (no human-checked frames of {stem} in {shown(args.human)}: no human-{name}.json)")
        record["seconds"] = round(time.monotonic() - t0, 2)
        manifest["views"][name] = record
        tiles.append(tile(frame_at(dst, args.sheet_t), boxes, f"{name} @ {args.sheet_t:g} s"))

    sheet = out / f"{stem}-views-t{args.sheet_t:g}.png"
    cv2.imwrite(str(sheet), cv2.cvtColor(contact_sheet(tiles), cv2.COLOR_RGB2BGR))
    print(f"wrote {shown(sheet)}: the source and {len(views)} view(s) at {args.sheet_t:g} s with the human-checked boxes")
    (out / "views.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {shown(out / 'views.json')}")
    if args.five_minutes:
        corner = out / f"{stem}-fit-corner.mp4"
        print(f"wrote {shown(repeated(corner, out / 'five-minutes.mp4', 4))}: {shown(corner)} four times over")


def repeated(src: Path, dst: Path, times: int) -> Path:
    """`src` played `times` times over, one H.264 file (frame after frame, timestamps continued)."""
    with av.open(str(dst), "w") as out:
        stream, n = None, 0
        for _ in range(times):
            with av.open(str(src)) as c:
                vs = c.streams.video[0]
                if stream is None:
                    stream = out.add_stream("libx264", rate=vs.average_rate)
                    stream.width, stream.height = vs.codec_context.width, vs.codec_context.height
                    stream.pix_fmt = "yuv420p"
                    stream.options = {"crf": "23", "preset": "veryfast"}
                for f in c.decode(vs):
                    frame = av.VideoFrame.from_ndarray(f.to_ndarray(format="rgb24"), format="rgb24")
                    frame = frame.reformat(format="yuv420p")
                    frame.pts, n = n, n + 1
                    out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return dst


if __name__ == "__main__":
    main()
