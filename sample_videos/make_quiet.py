"""Make `quiet.mp4`: a quiet camera (an empty scene, with a short walk-through once a minute) built from the real
surveillance recording `pedestrians.mp4`, so that frame filtering and capacity can be measured on a quiet stream
whose noise, light and people all come from real footage.

    python sample_videos/make_quiet.py            # writes quiet.mp4 and quiet.json next to this file

How it is made (every figure is measured on pedestrians.mp4 as decoded by PyAV, printed, and written to quiet.json):

1. **Background.** The per-pixel temporal median (RGB) over every frame of the recording. People move, so each pixel
   shows the empty pavement in most frames; the parked car and van stay, as they are in every frame.
2. **Static region.** A pixel is static when no frame ever differs from the background there by more than
   FG_THRESHOLD (any RGB channel), widened by STATIC_MARGIN_PX: pixels no person ever crossed.
3. **Light.** The mean luma of the static region, per frame, relative to its median over the video: its slow trend
   (centred moving average over LIGHT_SMOOTH_S) and the frame-to-frame flicker around it (std of the residual).
   The quiet video's light factor is that trend, played forwards and backwards (ping-pong, so it never jumps),
   plus Gaussian flicker with the measured std.
4. **Noise.** Per static pixel, the temporal std of luma after the light factor is taken out
   (luma - light(t) * background luma); elsewhere (where people walked) filled from the static pixels around it
   (normalised Gaussian convolution). The same noise value is added to R, G and B: the source's noise is luma noise
   after 4:2:0 chroma subsampling. The source's consecutive-frame difference in the static region (mean |dY|) is
   what a difference filter reads; H.264 removes part of any added noise, so the noise amplitude is scaled by a
   gain, found on a 10-s probe encoded with the final settings, until the decoded probe's mean |dY| matches the
   source's (within CALIBRATE_TOLERANCE).
5. **Walk-throughs.** One per minute: WALK_S seconds of the real recording (WALKS: source start -> quiet start), pasted
   onto the synthetic frames wherever the real frame differs from the background by more than FG_THRESHOLD
   (opened to drop compression specks, dilated by DILATE_PX, edges feathered), so real people cross the quiet scene.
6. **Encoding.** As make_samples.py: PyAV libx264, CRF 30, preset slow, 1-s GOPs, yuv420p, +faststart.
7. **Check.** The written file is decoded again: in the quiet stretches the mean consecutive |dY| and the largest
   BLOCK_PX-block mean |dY| (what a moving person raises and noise does not) are printed beside the source's
   static-region figures, and per walk-through the same figures (tests/ingest/test_quiet_video.py asserts them).

Deterministic: the noise and flicker of frame i come from numpy's generator seeded with (SEED, i).
quiet.json also records the walk-throughs' times in quiet.mp4 and the source seconds they came from.
"""

from __future__ import annotations

import json
import os
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import av
import cv2
import numpy as np
from make_samples import encode_h264  # this folder: the scripts run as `python sample_videos/...`

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "pedestrians.mp4"
OUT_VIDEO = HERE / "quiet.mp4"
OUT_JSON = HERE / "quiet.json"

SEED = 32
FPS = 10
DURATION_S = 180  # 3 minutes: 3 walk-throughs
CRF = 30  # as make_samples.py
WALK_S = 6  # each walk-through lasts this long (whole seconds, so 1-s chunks are all quiet or all walk-through)
# (source start s, quiet start s): one walk-through per minute, in the middle of each minute. The source windows
# lie in the adapters' training range (0-50 s), never in the held-out 55-79.5 s; people are in view throughout the
# recording: these have about 2.1%, 2.1% and 1.0% of the frame covered (40-46 s is the emptiest stretch)
WALKS = ((6, 27), (24, 87), (40, 147))
FG_THRESHOLD = 30  # |frame - background| above this (any RGB channel, 0-255) is a person (or car, shadow...)
STATIC_MARGIN_PX = 4  # static pixels keep this far from anything that ever moved
DILATE_PX = 3  # the pasted person masks are widened this much (their soft edges and shadows)
LIGHT_SMOOTH_S = 5.0  # the light trend is the moving average over this window
CALIBRATE_TOLERANCE = 0.03
PROBE_S = 10  # the noise gain is calibrated on the first PROBE_S seconds (before the first walk-through)
BLOCK_PX = 16  # the "someone moved" figure: the largest mean |dY| over a block of this size
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # BT.601 weights, as the decoder's YUV->RGB uses


# ---------------------------------------------------------------- decoding and measuring the source


def decode_rgb(path: Path) -> np.ndarray:
    """Every frame of `path` as one (T, H, W, 3) uint8 array."""
    with av.open(str(path)) as inp:
        return np.stack([f.to_ndarray(format="rgb24") for f in inp.decode(inp.streams.video[0])])


def luma(rgb: np.ndarray) -> np.ndarray:
    return rgb.astype(np.float32) @ LUMA


def temporal_median(frames: np.ndarray, rows: int = 48) -> np.ndarray:
    """Per-pixel median over time, a strip of rows at a time (keeps the sort's copy small)."""
    out = np.empty(frames.shape[1:], np.float32)
    for y in range(0, frames.shape[1], rows):
        out[y:y + rows] = np.median(frames[:, y:y + rows], axis=0)
    return out


def foreground(frame: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Pixels where any channel differs from the background by more than FG_THRESHOLD (bool H x W)."""
    return (np.abs(frame.astype(np.float32) - background) > FG_THRESHOLD).any(axis=2)


def disk(radius: int) -> np.ndarray:
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))


def static_region(frames: np.ndarray, background: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(static mask, foreground fraction per frame): static = never foreground, with a margin."""
    ever = np.zeros(frames.shape[1:3], bool)
    fractions = np.empty(len(frames))
    for i, f in enumerate(frames):
        fg = foreground(f, background)
        ever |= fg
        fractions[i] = fg.mean()
    static = cv2.dilate(ever.astype(np.uint8), disk(STATIC_MARGIN_PX)) == 0
    return static, fractions


def moving_average(x: np.ndarray, n: int) -> np.ndarray:
    """Centred moving average over n samples, the ends mirrored (no drop at the edges)."""
    pad = n // 2
    padded = np.pad(x, pad, mode="reflect")
    return np.convolve(padded, np.ones(n) / n, mode="valid")[: len(x)]


def measure_light(frames: np.ndarray, static: np.ndarray) -> dict:
    """Mean static-region luma per frame, relative to its median: trend and flicker."""
    level = np.array([luma(f)[static].mean() for f in frames])
    rel = level / np.median(level)
    trend = moving_average(rel, int(LIGHT_SMOOTH_S * FPS) | 1)
    flicker = rel - trend
    minutes = np.arange(len(rel)) / FPS / 60
    return {
        "static_luma_median": float(np.median(level)),
        "relative": rel, "trend": trend,
        "trend_min": float(trend.min()), "trend_max": float(trend.max()),
        "trend_range_pct": float(100 * (trend.max() - trend.min())),
        "linear_drift_pct_per_min": float(100 * np.polyfit(minutes, rel, 1)[0]),
        "flicker_std_pct": float(100 * flicker.std()),
    }


def block_means(d: np.ndarray) -> np.ndarray:
    """Mean of d over BLOCK_PX x BLOCK_PX blocks: noise averages out in a block, a moving person does not."""
    h, w = d.shape[0] // BLOCK_PX, d.shape[1] // BLOCK_PX
    return d[:h * BLOCK_PX, :w * BLOCK_PX].reshape(h, BLOCK_PX, w, BLOCK_PX).mean(axis=(1, 3))


def frame_differences(lumas: Iterator[np.ndarray], region: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per consecutive pair: mean |dY| over `region` and the largest block mean |dY| over the blocks inside it."""
    blocks = block_means(region.astype(np.float32)) == 1  # blocks wholly inside the region
    mads, block_max = [], []
    prev = None
    for y in lumas:
        if prev is not None:
            d = np.abs(y - prev)
            mads.append(d[region].mean())
            block_max.append(block_means(d)[blocks].max())
        prev = y
    return np.array(mads), np.array(block_max)


def measure_noise(frames: np.ndarray, background: np.ndarray, static: np.ndarray, light: np.ndarray) -> dict:
    """Per-pixel temporal luma std in the static region (light taken out), filled elsewhere; consecutive diffs."""
    ybg = luma(background)
    s = np.zeros(static.shape)
    ss = np.zeros(static.shape)
    for f, r in zip(frames, light):
        e = luma(f) - r * ybg
        s += e
        ss += e.astype(np.float64) ** 2
    n = len(frames)
    std = np.sqrt(np.maximum(ss / n - (s / n) ** 2, 0) * n / (n - 1)).astype(np.float32)
    # fill the pixels people walked over from the static pixels around them (normalised convolution)
    w = static.astype(np.float32)
    num = cv2.GaussianBlur(std * w, (0, 0), 15)
    den = cv2.GaussianBlur(w, (0, 0), 15)
    fallback = float(np.median(std[static]))
    std_map = np.where(static, std, np.where(den > 1e-3, num / np.maximum(den, 1e-3), fallback)).astype(np.float32)
    mads, block_max = frame_differences((luma(f) for f in frames), static)
    return {
        "std_map": std_map,
        "luma_std_median": float(np.median(std[static])), "luma_std_mean": float(std[static].mean()),
        "luma_std_p90": float(np.percentile(std[static], 90)),
        "consecutive_mad": float(mads.mean()), "consecutive_mad_p99": float(np.percentile(mads, 99)),
        "consecutive_mad_max": float(mads.max()),
        "block_mad_p99": float(np.percentile(block_max, 99)), "block_mad_max": float(block_max.max()),
    }


# ---------------------------------------------------------------- synthesis


def source_index(t: float, n_source: int) -> int:
    """The source frame whose light the quiet video has at time t: the recording played forwards and back."""
    period = 2 * (n_source - 1)
    k = int(round(t * FPS)) % period
    return k if k < n_source else period - k


def walk_at(i: int) -> tuple[int, int] | None:
    """(walk-through number, source frame) when quiet frame i is inside a walk-through, else None."""
    for w, (src_s, quiet_s) in enumerate(WALKS):
        k = i - quiet_s * FPS
        if 0 <= k < WALK_S * FPS:
            return w, src_s * FPS + k
    return None


def paste(synthetic: np.ndarray, real: np.ndarray, background: np.ndarray) -> tuple[np.ndarray, float]:
    """The real frame's people over the synthetic frame; returns (frame, pasted fraction)."""
    fg = foreground(real, background).astype(np.uint8)
    fg = cv2.morphologyEx(fg, cv2.MORPH_OPEN, disk(1))  # compression specks are not people
    fg = cv2.dilate(fg, disk(DILATE_PX))
    alpha = cv2.GaussianBlur(fg.astype(np.float32), (5, 5), 0)[..., None]  # feathered edge, no cut-out seam
    out = alpha * real.astype(np.float32) + (1 - alpha) * synthetic
    return np.clip(np.rint(out), 0, 255).astype(np.uint8), float(fg.mean())


class Synthesiser:
    """Frame i of the quiet video: background x light(t) + noise, with the walk-throughs pasted in."""

    def __init__(self, frames: np.ndarray, background: np.ndarray, light: dict, noise: dict, gain: float):
        self.frames, self.background = frames, background
        self.trend, self.flicker = light["trend"], light["flicker_std_pct"] / 100
        self.std_map, self.gain = noise["std_map"], gain
        self.pasted: dict[int, list[float]] = {}

    def synthetic(self, i: int) -> np.ndarray:
        rng = np.random.default_rng([SEED, i])
        factor = self.trend[source_index(i / FPS, len(self.frames))] + self.flicker * rng.standard_normal()
        grain = self.gain * self.std_map * rng.standard_normal(self.std_map.shape, dtype=np.float32)
        return self.background * np.float32(factor) + grain[..., None]

    def frame(self, i: int) -> np.ndarray:
        img = self.synthetic(i)
        walk = walk_at(i)
        if walk is None:
            return np.clip(np.rint(img), 0, 255).astype(np.uint8)
        img, fraction = paste(img, self.frames[walk[1]], self.background)
        self.pasted.setdefault(walk[0], []).append(fraction)
        return img


# ---------------------------------------------------------------- encoding


def encode(images: Iterator[np.ndarray], dst: Path) -> int:
    """H.264 MP4 exactly as make_samples.py encodes (its encode_h264, CRF 30)."""
    return encode_h264(images, dst, Fraction(FPS), CRF)


def decoded_mad(synth: Synthesiser, n: int) -> float:
    """Encode the first n quiet frames, decode them, return their mean consecutive |dY| over the whole frame."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.mp4"
        encode((synth.frame(i) for i in range(n)), probe)
        frames = decode_rgb(probe)
    mads, _ = frame_differences((luma(f) for f in frames), np.ones(frames.shape[1:3], bool))
    return float(mads.mean())


def calibrate_gain(frames, background, light, noise) -> tuple[float, list[dict]]:
    """The noise gain whose encoded-and-decoded probe has the source's consecutive-frame difference."""
    target, gain, steps = noise["consecutive_mad"], 1.0, []
    for _ in range(8):
        got = decoded_mad(Synthesiser(frames, background, light, noise, gain), PROBE_S * FPS)
        steps.append({"gain": round(gain, 4), "decoded_consecutive_mad": round(got, 4)})
        print(f"  noise gain {gain:.3f}: decoded probe mean |dY| {got:.3f} (source {target:.3f})")
        if abs(got / target - 1) <= CALIBRATE_TOLERANCE:
            return gain, steps
        gain *= float(np.clip(target / got, 0.5, 4.0))
    raise SystemExit(f"noise gain did not converge: {steps}")


def check_output(path: Path) -> dict:
    """Decode the written video: consecutive-frame figures inside the quiet stretches and inside each walk-through."""
    frames = decode_rgb(path)
    mads, block_max = frame_differences((luma(f) for f in frames), np.ones(frames.shape[1:3], bool))
    walk = np.array([-1 if walk_at(i) is None else walk_at(i)[0] for i in range(len(frames))])
    quiet = (walk[1:] < 0) & (walk[:-1] < 0)
    check = {"quiet_consecutive_mad": float(mads[quiet].mean()),
             "quiet_consecutive_mad_max": float(mads[quiet].max()),
             "quiet_block_mad_max": float(block_max[quiet].max())}
    for k in range(len(WALKS)):
        inside = (walk[1:] == k) & (walk[:-1] == k)
        check[f"walk{k}_consecutive_mad"] = float(mads[inside].mean())
        check[f"walk{k}_block_mad_min"] = float(block_max[inside].min())
    return check


# ---------------------------------------------------------------- main


def rounded(d: dict) -> dict:
    """The scalar figures of d, to 5 significant digits (arrays are left out)."""
    return {k: float(f"{v:.5g}") if isinstance(v, float) else v for k, v in d.items() if not isinstance(v, np.ndarray)}


def main() -> None:
    assert WALKS[0][1] >= PROBE_S, "the calibration probe must be quiet"
    frames = decode_rgb(SOURCE)
    n, h, w = frames.shape[:3]
    print(f"{SOURCE.name}: {n} frames, {w}x{h}, {n / FPS:.1f} s")
    background = temporal_median(frames)
    static, fg_fraction = static_region(frames, background)
    print(f"background: per-pixel median of {n} frames; static region {100 * static.mean():.1f}% of the frame "
          f"(never > {FG_THRESHOLD} from the background, {STATIC_MARGIN_PX}-px margin)")
    light = measure_light(frames, static)
    print(f"light: static luma median {light['static_luma_median']:.1f}; slow trend ({LIGHT_SMOOTH_S:g}-s mean) "
          f"{light['trend_min']:.4f}-{light['trend_max']:.4f} x median (range {light['trend_range_pct']:.2f}%), "
          f"linear drift {light['linear_drift_pct_per_min']:+.2f}%/min, flicker std {light['flicker_std_pct']:.3f}%")
    noise = measure_noise(frames, background, static, light["relative"])
    print(f"noise: per-pixel temporal luma std (static) median {noise['luma_std_median']:.3f}, mean "
          f"{noise['luma_std_mean']:.3f}, p90 {noise['luma_std_p90']:.3f}; consecutive mean |dY| "
          f"{noise['consecutive_mad']:.3f} (p99 {noise['consecutive_mad_p99']:.3f}, max "
          f"{noise['consecutive_mad_max']:.3f}); largest {BLOCK_PX}x{BLOCK_PX}-block mean |dY| p99 "
          f"{noise['block_mad_p99']:.3f}, max {noise['block_mad_max']:.3f}")
    for src, _ in WALKS:
        window = fg_fraction[src * FPS:(src + WALK_S) * FPS]
        print(f"source {src}-{src + WALK_S} s: foreground {100 * window.mean():.2f}% of the frame")
    gain, steps = calibrate_gain(frames, background, light, noise)
    synth = Synthesiser(frames, background, light, noise, gain)
    written = encode((synth.frame(i) for i in range(DURATION_S * FPS)), OUT_VIDEO)
    size = os.path.getsize(OUT_VIDEO)
    print(f"{OUT_VIDEO.name}: {written} frames, {w}x{h}, {FPS} fps, {size / 1e6:.2f} MB")
    check = check_output(OUT_VIDEO)
    print(f"decoded {OUT_VIDEO.name}: quiet stretches mean |dY| {check['quiet_consecutive_mad']:.3f} (max per pair "
          f"{check['quiet_consecutive_mad_max']:.3f}), largest block mean |dY| {check['quiet_block_mad_max']:.3f}")
    for k in range(len(WALKS)):
        print(f"  walk-through {k}: mean |dY| {check[f'walk{k}_consecutive_mad']:.3f}, largest block mean |dY| "
              f"at least {check[f'walk{k}_block_mad_min']:.3f} in every pair")
    walks = [{"quiet_s": [q, q + WALK_S], "source_s": [s, s + WALK_S],
              "pasted_fraction": round(float(np.mean(synth.pasted[k])), 4)} for k, (s, q) in enumerate(WALKS)]
    report = {
        "source": SOURCE.name, "made_by": Path(__file__).name, "seed": SEED,
        "video": {"file": OUT_VIDEO.name, "width": w, "height": h, "fps": FPS, "frames": written,
                  "duration_s": DURATION_S, "bytes": size, "crf": CRF},
        "background": {"method": "per-pixel temporal median (RGB)", "frames": n},
        "static_region": {"fraction": round(float(static.mean()), 4), "fg_threshold": FG_THRESHOLD,
                          "margin_px": STATIC_MARGIN_PX},
        "light": dict(rounded(light), smooth_s=LIGHT_SMOOTH_S),
        "noise": dict(rounded(noise), block_px=BLOCK_PX, gain=round(gain, 4), calibration=steps),
        "walkthroughs": walks,
        "check": rounded(check),
    }
    OUT_JSON.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(walks))


if __name__ == "__main__":
    main()
