"""CPU backbone compute of the default pipeline: a naive fp32 eager forward against the daemon's way, in one run.

One second of the default pipeline's video (pipelines.yaml) is: detect on 1 frame at 336 px of `pedestrians` and
of `bikes`, activity (`actions`) on 8 frames at 224 px of `pedestrians`. Frames are real (the sample videos at
5 s, letterboxed to daemon.image_size 336 as ingest does, picked as the chunker picks them, so tasks share a
buffer where they share a frame). Compared, interleaved round by round (a burst of other load hits every variant
alike), medians over the rounds:

    naive      the plain Hugging Face DINOv2-small, fp32, eager, one forward per size of the same images
               (frames resized to 224 in advance: the forward only)
    engine/P   `Engine.execute` of the same requests as one premerged batch plan (per-slot W + ΔW, shared prefix
               where sizes match), precision P; "backbone" = its forwards alone, "execute" = with resizing and heads
    options    fewer frames per clip (activity 4 frames) and a shared size (`actions-persons`, 4 frames at 336,
               instead of `actions`): what they would save, for the accuracy report to weigh
               (bench/precision_accuracy.py)

Each engine runs on each backbone backend asked for (`--backends torch,openvino`: daemon.backend). Then threads
(1 vs 2) and batch size: seconds per image of naive fp32 and the engines at 224 and 336; then the peers: the plain
backbone on OpenVINO fp32 / bf16 / int8 (NNCF, installed with the default set-up) at 224 x 8 and 336 x 2 in the
same rounds as the engines, with the worst per-token cosine against torch fp32. The engine's openvino int8 reads
the models `vlora-va models calibrate` makes, calibrated here on pedestrians.mp4 0-50 s (cached). Writes
bench/results/cpu_backbone.json and .md.

    python bench/cpu_backbone.py                 # ~5-10 min on 2 shared cores
    python bench/cpu_backbone.py --rounds 3 --skip threads
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.contracts.geometry import Letterbox  # noqa: E402
from vlora_va.contracts.plugins import BACKBONE_BACKENDS  # noqa: E402
from vlora_va.contracts.requests import Request  # noqa: E402
from vlora_va.engine.adapters import load_adapter_dir  # noqa: E402
from vlora_va.engine.backbones import load_backbone  # noqa: E402
from vlora_va.engine.backends.torch_eager import normalise  # noqa: E402
from vlora_va.engine.executor import Engine  # noqa: E402
from vlora_va.engine.modes import PREMERGED, LoRAMode  # noqa: E402
from vlora_va.engine.precision import AVX2_ENV, Capabilities, cpu_flags  # noqa: E402
from vlora_va.ingest.chunker import letterbox, plan_chunk  # noqa: E402
from vlora_va.serving.scheduling import make_plan  # noqa: E402

IMAGE_SIZE = 336  # pipelines.yaml daemon.image_size
FPS = 10
AT_S = 5.0  # which second of the videos (bikes.mp4 is 10 s long)


class _Task:  # what plan_chunk reads of a TaskConfig
    def __init__(self, name, adapter, k):
        self.name, self.adapter, self.frames_per_chunk = name, adapter, k
        self.track = None  # untracked: frames as the chunker picks them for untracked tasks


def video_second(path: Path, start: float, fps: int = FPS) -> list[np.ndarray]:
    from vlora_va.training.frames import read_frames

    frames = read_frames(path, start, start + 1.0, 1.0 / fps)
    return [f.rgb for f in frames[:fps]]


def chunk_requests(stream: str, frames: list[np.ndarray], tasks: list[_Task]) -> list[Request]:
    """The requests the daemon gets for one chunk: frames letterboxed once, shared by the tasks that pick them."""
    union, picks = plan_chunk(len(frames), tuple(tasks))
    boxed = [letterbox(frames[i], IMAGE_SIZE) for i in union]
    lb = boxed[0][1]
    h, w = frames[0].shape[:2]
    now = time.time()
    return [Request(stream, 0, t.name, t.adapter, [boxed[j][0] for j in p], [0.1 * j for j in p], lb, (w, h),
                    now, now, now + 10) for t, p in zip(tasks, picks)]


def pipelines(videos: dict[str, list[np.ndarray]]) -> dict[str, list[Request]]:
    """Today's default pipeline and the size / frame options, as one second of requests each."""
    ped, bikes = videos["pedestrians"], videos["bikes"]
    bikes_req = chunk_requests("bikes", bikes, [_Task("detect", "detect", 1)])
    return {
        "default": chunk_requests("pedestrians", ped, [_Task("detect", "detect", 1), _Task("activity", "actions", 8)])
                   + bikes_req,
        "activity 4 frames": chunk_requests("pedestrians", ped, [_Task("detect", "detect", 1),
                                                                 _Task("activity", "actions", 4)]) + bikes_req,
        "actions-persons 4@336": chunk_requests("pedestrians", ped, [_Task("detect", "detect", 1),
                                                                     _Task("activity", "actions-persons", 4)])
                                 + bikes_req,
    }


def naive_inputs(reqs: list[Request], sizes: dict[str, int]) -> dict[int, torch.Tensor]:
    """Normalised pixels per size for a naive forward of the same images (each request's frames at its size)."""
    by_size: dict[int, list[torch.Tensor]] = {}
    for r in reqs:
        x = normalise(torch.from_numpy(np.stack(r.frames)))
        s = sizes[r.adapter]
        if s != x.shape[-1]:
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        by_size.setdefault(s, []).append(x)
    return {s: torch.cat(xs) for s, xs in by_size.items()}


def naive_forward(model, inputs: dict[int, torch.Tensor]) -> None:
    with torch.inference_mode():
        for x in inputs.values():
            model(pixel_values=x)


def engine_backbone(engine: Engine, plan) -> None:
    """The plan's backbone forwards alone (what Engine._run_size runs before the heads)."""
    for group in plan.groups:
        frames, slots = [], []
        for i in group.members:
            r = plan.requests[i]
            frames.extend(r.frames)
            slots.extend([engine.slots[r.adapter]] * r.num_images)
        engine.features(frames, slots, plan.mode, group.size, group.prefix)


def interleaved(fns: dict[str, callable], rounds: int, threads: dict[str, int] | None = None) -> dict[str, dict]:
    """{name: {median, min, times}} seconds, all variants once per round (after one warm-up each), in reverse order
    every other round: a variant run right after a twin on the same input finds the caches warm (OpenVINO int8 with
    bf16 float parts measured 5-10% faster than with f32 parts run just before it, and as fast the other way)."""
    threads = threads or {}
    default = torch.get_num_threads()
    for name, fn in fns.items():
        torch.set_num_threads(threads.get(name, default))
        fn()
    times: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(rounds):
        for name, fn in (list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]):
            torch.set_num_threads(threads.get(name, default))
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    torch.set_num_threads(default)
    return {n: {"median": statistics.median(t), "min": min(t), "times": [round(x, 4) for x in t]}
            for n, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the main comparison (default 2)")
    ap.add_argument("--precisions", default="fp32,bf16,int8")
    ap.add_argument("--backends", default="torch,openvino", help="backbone backends (daemon.backend) to time")
    ap.add_argument("--skip", default="",
                    help="comma list of sections to skip: pipelines, options, threads, peers, linears, prefix")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    torch.set_num_threads(args.threads)
    caps = Capabilities.detect("cpu")
    flags = cpu_flags()
    print(f"CPU: {platform.processor() or platform.machine()}, torch {torch.__version__} ({caps.isa}), "
          f"native bf16 {caps.native_bf16}, VNNI {caps.vnni}, int8 kernels {caps.int8_kernels}, "
          f"{os.cpu_count()} cores, {args.threads} threads; load {os.getloadavg()[0]:.1f}", flush=True)
    precisions = [p for p in args.precisions.split(",") if p]

    backbone = load_backbone("dinov2-small")
    names = ["detect", "actions"] + ([] if "options" in skip else ["actions-persons"])
    adapters = {n: load_adapter_dir(n, ROOT / "adapters" / n, 384) for n in names}
    sizes = {n: int(a.head_config.get("image_size", IMAGE_SIZE)) for n, a in adapters.items()}
    videos = {v: video_second(ROOT / "sample_videos" / f"{v}.mp4", AT_S) for v in ("pedestrians", "bikes")}
    reqs = pipelines(videos)
    if "options" in skip:
        reqs = {"default": reqs["default"]}

    naive = copy.deepcopy(backbone).eval()
    engines = {}  # "fp32" (torch) or "openvino fp32": the engine per backend and precision
    for backend in args.backends.split(","):
        for p in precisions:
            key = p if backend == "torch" else f"{backend} {p}"
            if BACKBONE_BACKENDS.load(backend).unavailable(torch.device("cpu"), p):
                print(f"engine {key}: not built ({BACKBONE_BACKENDS.load(backend).unavailable(torch.device('cpu'), p)})")
                continue
            t0 = time.perf_counter()
            engines[key] = Engine(copy.deepcopy(backbone), {n: copy.deepcopy(a) for n, a in adapters.items()},
                                  IMAGE_SIZE, premerge_max_mb=4096, precision=p, backend=backend)
            print(f"engine {key}: built in {time.perf_counter() - t0:.1f} s", flush=True)
            if backend == "openvino" and p == "int8":  # its NNCF models, as `vlora-va models calibrate` makes them
                calibrate(engines[key], {s: int(x.shape[0]) for s, x in naive_inputs(reqs["default"], sizes).items()})
    mode = LoRAMode(PREMERGED)
    catalog = next(iter(engines.values())).catalog()

    # ---- one second of each pipeline: naive fp32 vs the engine per precision
    fns, meta = {}, {}
    for pipe, rs in reqs.items():
        inputs = naive_inputs(rs, sizes)
        fns[f"{pipe} | naive fp32"] = (lambda inputs=inputs: naive_forward(naive, inputs))
        meta[pipe] = {"images": {str(s): int(x.shape[0]) for s, x in inputs.items()},
                      "requests": [[r.stream, r.adapter, r.num_images] for r in rs]}
        for p, e in engines.items():
            plan = make_plan(rs, mode, catalog)
            meta[pipe]["prefix"] = {str(g.size): g.prefix for g in plan.groups}
            fns[f"{pipe} | engine {p} backbone"] = (lambda e=e, plan=plan: engine_backbone(e, plan))
            fns[f"{pipe} | engine {p} execute"] = (lambda e=e, plan=plan: e.execute(plan))
    rows = []
    if "pipelines" in skip:
        fns, reqs = {}, {}
    print(f"timing {len(fns)} variants x {args.rounds} rounds ...", flush=True)
    res = interleaved(fns, args.rounds)
    base = res["default | naive fp32"]["median"] if res else 0.0
    for pipe in reqs:
        own = res[f"{pipe} | naive fp32"]["median"]
        for name in [n for n in res if n.startswith(pipe + " |")]:
            m = res[name]["median"]
            # the ratio within each round (both hit by the same burst of other load), then its median
            paired = statistics.median(a / b for a, b in zip(res[name]["times"], res["default | naive fp32"]["times"]))
            rows.append({"pipeline": pipe, "variant": name.split(" | ")[1], "median_s": round(m, 4),
                         "min_s": round(res[name]["min"], 4), "vs_naive_default": round(m / base, 3),
                         "vs_naive_default_per_round": round(paired, 3),
                         "vs_naive_same_images": round(m / own, 3), "times": res[name]["times"]})
            print(f"  {name:55s} {m:7.3f} s  {m / base:5.2f}x naive(default), per round {paired:5.2f}x  "
                  f"{m / own:5.2f}x naive(same images)", flush=True)

    # ---- threads and batch size
    scaling = []
    if "threads" not in skip:
        frames = [letterbox(videos["pedestrians"][i], IMAGE_SIZE)[0] for i in range(8)]
        for size, batches in ((224, (1, 2, 4, 8)), (336, (1, 2, 4))):
            fns, threads = {}, {}
            for n in batches:
                x = naive_inputs([Request("x", 0, "t", "detect", frames[:n], [0.0] * n, Letterbox(1.0, 0.0, 0.0),
                                          (768, 576), 0, 0, 0)], {"detect": size})
                for t in (1, 2):
                    fns[f"naive fp32|{n}|{t}"] = (lambda x=x: naive_forward(naive, x))
                    threads[f"naive fp32|{n}|{t}"] = t
                    for p, e in engines.items():
                        if p == "fp32":
                            continue
                        k = f"engine {p}|{n}|{t}"
                        fns[k] = (lambda e=e, n=n: e.features(frames[:n], [0] * n, mode, size))
                        threads[k] = t
            print(f"threads x batch at {size} px: {len(fns)} variants x {max(3, args.rounds // 2)} rounds ...", flush=True)
            r = interleaved(fns, max(3, args.rounds // 2), threads)
            for k, v in r.items():
                variant, n, t = k.split("|")
                scaling.append({"size": size, "variant": variant, "images": int(n), "threads": int(t),
                                "median_s": round(v["median"], 4), "s_per_image": round(v["median"] / int(n), 4)})
                print(f"  {size} px {variant:12s} batch {n} threads {t}: {v['median'] / int(n) * 1000:7.1f} ms/image",
                      flush=True)

    peers = [] if "peers" in skip else openvino_peers(backbone, naive, engines, mode, args.rounds)
    linears = [] if "linears" in skip else linear_layers(args.rounds)
    prefix = [] if "prefix" in skip or "actions-persons" not in adapters else \
        shared_prefix(engines, videos, mode, args.rounds)

    out = {"cpu": {"model": platform.processor() or platform.machine(), "isa": caps.isa, "flags_bf16": caps.native_bf16,
                   "vnni": caps.vnni, "int8_kernels": caps.int8_kernels, "cores": os.cpu_count(),
                   "avx512": "avx512f" in flags},
           "torch": torch.__version__, "threads": args.threads, "rounds": args.rounds,
           # how the kernels were capped, if they were (engine/precision.py AVX2_ENV; OpenVINO reads ONEDNN_MAX_CPU_ISA)
           "isa_caps": {k: os.environ[k] for k in AVX2_ENV if k in os.environ},
           "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "pipelines": meta, "results": rows, "scaling": scaling,
           "linears": linears, "prefix": prefix, "peers": peers,
           # what each openvino model took to convert and compile (first use, in the warm-up round)
           "openvino_compile_s": {k: {m: round(t, 2) for m, t in e.backend.compile_s.items()}
                                  for k, e in engines.items() if hasattr(e.backend, "compile_s")},
           # int8 parts that ran in float for want of a calibrated model (must be none for the int8 rows to count)
           "openvino_uncalibrated": {k: e.backend.uncalibrated for k, e in engines.items()
                                     if getattr(e.backend, "precision", "") == "int8"},
           "vs_peer": vs_peer(peers)}
    print("engine openvino int8 / standalone openvino int8 (the same float hint), ms per image: "
          + ", ".join(f"{s} px {r:.2f}x" for s, r in out["vs_peer"].items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_backbone.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "cpu_backbone.md").write_text(markdown(out) + "\n")
    print(f"wrote {args.out / 'cpu_backbone.json'} and .md")
    return 0


def shared_prefix(engines: dict, videos: dict, mode: LoRAMode, rounds: int) -> list[dict]:
    """Two adapters on the same frames: detect and actions-persons (LoRA on blocks 8-11 only, both at 336 px)
    each on the same 4 frames, blocks below their first LoRA block run once per frame (the engine's shared
    prefix) against once per request, per precision. Needs the options section's actions-persons."""
    frames = [letterbox(videos["pedestrians"][i], IMAGE_SIZE)[0] for i in (0, 3, 6, 9)]
    fns, blocks = {}, {}
    for p, e in engines.items():
        info = e.catalog().adapters
        blocks[p] = min(info[n].first_block for n in ("detect", "actions-persons"))
        slots = [e.slots["detect"]] * len(frames) + [e.slots["actions-persons"]] * len(frames)
        for variant, prefix in (("shared", blocks[p]), ("per request", 0)):
            fns[f"{p}|{variant}"] = (lambda e=e, slots=slots, prefix=prefix:
                                     e.features(frames + frames, slots, mode, 336, prefix))
    print(f"shared prefix: {len(fns)} variants x {rounds} rounds ...", flush=True)
    r = interleaved(fns, rounds)
    out = []
    for p in engines:
        shared, alone = r[f"{p}|shared"], r[f"{p}|per request"]
        paired = statistics.median(a / b for a, b in zip(shared["times"], alone["times"]))
        out.append({"precision": p, "prefix_blocks": blocks[p], "frames": len(frames), "adapters": 2,
                    "shared_s": round(shared["median"], 4), "per_request_s": round(alone["median"], 4),
                    "saving_per_round": round(1 - paired, 3)})
        print(f"  {p}: shared prefix ({blocks[p]} blocks) {shared['median']:.3f} s vs {alone['median']:.3f} s "
              f"per request: {100 * (1 - paired):.0f}% less", flush=True)
    return out


CALIBRATION_S = (0.0, 50.0)  # pedestrians.mp4, 1 frame per second: NNCF's calibration frames (the issue: 50)
HELD_OUT_S = (60.0, 68.0)  # 8 later frames, never calibrated on: the accuracy check


def calibrate(engine: Engine, batches: dict[int, int]) -> None:
    """The engine's int8 models from NNCF on CALIBRATION_S of pedestrians.mp4 (cached: a second run reads them), and
    its float hint timed at `batches` (the default pipeline's images per size in one second, as the CLI times it)."""
    from vlora_va.training.calibrate import calibrate_engine, describe
    from vlora_va.training.frames import read_frames

    frames = [letterbox(f.rgb, IMAGE_SIZE)[0] for f in read_frames(ROOT / "sample_videos" / "pedestrians.mp4",
                                                                   *CALIBRATION_S, 1.0)]
    for r in calibrate_engine(engine, {n: frames for n in engine.adapters}, "pedestrians.mp4 0-50 s, 1 per second",
                              batches=batches):
        print(f"  {describe(r)}", flush=True)


def vs_peer(peers: list[dict]) -> dict[str, float]:
    """The acceptance ratio per image size: the engine's openvino int8 (premerged adapter, shared prefix) over the
    plain backbone's standalone OpenVINO int8 with the same float hint, ms per image in the same rounds."""
    from vlora_va.engine.backends.openvino import int8_hint

    peer = f"openvino int8 ({'bf16' if int8_hint() == 'bf16' else 'fp32'} parts)"
    ms = {(r["size"], r["variant"]): r["ms_per_image"] for r in peers}
    return {str(size): round(ms[size, "engine openvino int8"] / ms[size, peer], 3)
            for size in sorted({r["size"] for r in peers}) if (size, "engine openvino int8") in ms and (size, peer) in ms}


def onnxruntime_int8(whole: torch.nn.Module, example: torch.Tensor, size: int) -> dict:
    """ONNX Runtime's dynamic int8 (weights int8 per tensor or per channel, activations quantized per call) of the
    plain backbone, as callables like OpenVINO's compiled models (x -> [out]); {} where onnxruntime or the export is
    missing. Exported by torch's TorchScript exporter (the dynamo one needs onnxscript), opset 17, dynamic batch."""
    import tempfile

    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        print("peers: onnxruntime not installed: no ONNX Runtime int8")
        return {}
    out = {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp32 = Path(tmp) / "fp32.onnx"
        torch.onnx.export(whole, (example,), str(fp32), input_names=["x"], output_names=["y"], opset_version=17,
                          dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}, dynamo=False)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = torch.get_num_threads(), 1
        for name, per_channel in (("onnxruntime int8 (dynamic)", False), ("onnxruntime int8 (dynamic, per channel)",
                                                                         True)):
            q = Path(tmp) / f"q{int(per_channel)}.onnx"
            t0 = time.perf_counter()
            quantize_dynamic(str(fp32), str(q), weight_type=QuantType.QInt8, per_channel=per_channel)
            session = ort.InferenceSession(str(q), opts, providers=["CPUExecutionProvider"])
            out[name] = (lambda x, s=session: s.run(None, {"x": np.ascontiguousarray(x, dtype=np.float32)}))
            print(f"  {size} px: {name} quantized in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def openvino_peers(backbone, naive, engines: dict, mode: LoRAMode, rounds: int) -> list[dict]:
    """The best CPU peer on the plain backbone, in the same run as the engine: OpenVINO fp32, bf16 and int8 (NNCF
    post-training quantization, SmoothQuant for transformers, 50 calibration frames; its float parts with each
    hint), each with INFERENCE_PRECISION_HINT set explicitly, at 224 px batch 8 and 336 px batch 2, against naive
    fp32 and the engine (torch and openvino backends, one adapter served at that size, premerged) on the same
    images. Accuracy: the
    worst per-token cosine of the last hidden state against torch fp32 over 8 held-out frames. ONNX Runtime's
    dynamic int8 too (`onnxruntime_int8`; onnxruntime comes with the test set-up). Without nncf or onnxruntime
    their rows are left out."""
    from vlora_va.engine.backends.openvino import import_openvino
    from vlora_va.training.frames import read_frames

    try:
        ov = import_openvino()  # first: nncf imports openvino too, and the guard must come before
    except ImportError as e:
        print(f"peers: skipped ({e})")
        return []
    try:
        import nncf
    except ImportError:
        nncf = None
        print("peers: nncf not installed (pip install nncf==3.4.0): no OpenVINO int8")
    video = ROOT / "sample_videos" / "pedestrians.mp4"
    calib_frames = [letterbox(f.rgb, IMAGE_SIZE)[0] for f in read_frames(video, *CALIBRATION_S, 1.0)]
    held = [letterbox(f.rgb, IMAGE_SIZE)[0] for f in read_frames(video, *HELD_OUT_S, 1.0)]

    class Whole(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(pixel_values=x).last_hidden_state

    core = ov.Core()
    out = []
    for size, n in ((224, 8), (336, 2)):
        def pixels(frames, size=size):
            return naive_inputs([Request("x", 0, "t", "detect", frames, [0.0] * len(frames), Letterbox(1.0, 0.0, 0.0),
                                         (768, 576), 0, 0, 0)], {"detect": size})[size]
        calib, test = pixels(calib_frames), pixels(held)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ov.convert_model(Whole(naive), example_input=calib[:1],
                                     input=[ov.PartialShape([-1, 3, size, size])])
            reference = naive(pixel_values=test).last_hidden_state.numpy()
        models = {"openvino fp32": (model, "f32"), "openvino bf16": (model, "bf16")}
        if nncf is not None:
            t0 = time.perf_counter()
            q = nncf.quantize(model, nncf.Dataset([x[None].numpy() for x in calib]),
                              model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib))
            print(f"  {size} px: NNCF int8 from {len(calib)} frames in {time.perf_counter() - t0:.0f} s", flush=True)
            models.update({"openvino int8 (fp32 parts)": (q, "f32"), "openvino int8 (bf16 parts)": (q, "bf16")})
        compiled = {}
        for k, (m, h) in models.items():
            try:
                compiled[k] = core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": h,
                                                            "INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                            "PERFORMANCE_HINT": "LATENCY"})
            except RuntimeError as e:  # the bf16 hint under ONEDNN_MAX_CPU_ISA=AVX2 does not compile
                print(f"  {size} px {k}: not compiled here ({str(e).splitlines()[0][:120]})", flush=True)
        compiled.update(onnxruntime_int8(Whole(naive), calib[:1], size))
        x = test[:n]
        frames = held[:n]
        fns = {"naive fp32": (lambda: naive_forward(naive, {size: x}))}
        fns.update({k: (lambda c=c: c(x.numpy())) for k, c in compiled.items()})
        for p, e in engines.items():  # through an adapter served at this size (int8: the one calibrated there)
            slot = next((e.slots[a] for a in sorted(e.sizes) if e.sizes[a] == size), e.slots["detect"])
            fns[f"engine {p}"] = (lambda e=e, slot=slot: e.features(frames, [slot] * n, mode, size))
        print(f"peers at {size} px, batch {n}: {len(fns)} variants x {rounds} rounds ...", flush=True)
        res = interleaved(fns, rounds)
        cos = {}
        for k, c in compiled.items():
            got = np.concatenate([c(test[i:i + n].numpy())[0] for i in range(0, len(test) - len(test) % n, n)])
            want = reference[:len(got)]
            cos[k] = float(((got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))).min())
        for k, v in res.items():
            row = {"size": size, "batch": n, "variant": k, "ms_per_image": round(v["median"] / n * 1e3, 1),
                   "vs_naive": round(v["median"] / res["naive fp32"]["median"], 3),
                   "worst_token_cosine": round(cos[k], 4) if k in cos else None}
            out.append(row)
            print(f"  {size} px {k:28s} {row['ms_per_image']:7.1f} ms/image  {row['vs_naive']:5.2f}x naive"
                  + (f"  worst token cosine {cos[k]:.4f}" if k in cos else ""), flush=True)
    return out


def linear_layers(rounds: int, calls: int = 5) -> list[dict]:
    """One ViT-S linear layer per shape at the rows of the default pipeline's two forwards (2 x 577 tokens at
    336 px, 8 x 257 at 224): fp32 (nn.Linear), bf16 (weights and input bf16), int8 as the engine runs it (fbgemm,
    precision.Int8Linear), and torchao's int8 dynamic-activation / int8-weight linear where torchao is installed
    (it is not a dependency: `pip install torchao`, or PYTHONPATH to a copy)."""
    from vlora_va.engine.precision import Int8Linear

    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        quantize_ = None
    out = []
    for rows_name, n in (("2x336", 2 * 577), ("8x224", 8 * 257)):
        for o, i in ((384, 384), (1536, 384), (384, 1536)):
            lin = torch.nn.Linear(i, o).eval()
            x = torch.randn(n, i)
            bf = copy.deepcopy(lin).to(torch.bfloat16)
            xb = x.to(torch.bfloat16)
            q8 = Int8Linear(copy.deepcopy(lin))
            fns = {"fp32": lambda: lin(x), "bf16": lambda: bf(xb), "int8 fbgemm (engine)": lambda: q8(x)}
            if quantize_ is not None:
                ao = copy.deepcopy(lin)
                quantize_(ao, Int8DynamicActivationInt8WeightConfig())
                fns["int8 torchao"] = lambda: ao(x)

            def many(fn):
                with torch.inference_mode():
                    for _ in range(calls):
                        fn()

            res = interleaved({k: (lambda f=f: many(f)) for k, f in fns.items()}, rounds)
            fp32 = res["fp32"]["median"]
            for k, v in res.items():
                out.append({"rows": rows_name, "shape": f"{i}->{o}", "variant": k, "ms": round(v["median"] / calls * 1e3, 3),
                            "vs_fp32": round(v["median"] / fp32, 3)})
                print(f"  linear {rows_name} {i}->{o} {k:22s} {v['median'] / calls * 1e3:7.2f} ms  {v['median'] / fp32:5.2f}x",
                      flush=True)
    return out


def markdown(out: dict) -> str:
    c = out["cpu"]
    lines = [f"# CPU backbone: naive fp32 eager vs the daemon's way ({out['created']})", "",
             f"CPU {c['model']} ({c['isa']}, native bf16 {c['flags_bf16']}, VNNI {c['vnni']}), {c['cores']} cores, "
             f"torch {out['torch']}, {out['threads']} threads, medians of {out['rounds']} interleaved rounds"
             + (f", kernels capped by {out['isa_caps']}" if out.get("isa_caps") else "") + ". "
             "One second of video per pipeline; `backbone` = the engine's forwards, `execute` = with resize and heads.",
             "`× naive` = median over rounds of the variant / the median of naive fp32 on today's default images; "
             "`per round` = the median of the ratio taken within each round (the two runs a few seconds apart, hit "
             "by the same load).",
             "", "| pipeline | images | variant | median s | × naive fp32 (default images) | per round | "
             "× naive fp32 (same images) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in out["results"]:
        imgs = ", ".join(f"{n}@{s}" for s, n in out["pipelines"][r["pipeline"]]["images"].items())
        lines.append(f"| {r['pipeline']} | {imgs} | {r['variant']} | {r['median_s']:.3f} | {r['vs_naive_default']:.2f} | "
                     f"{r['vs_naive_default_per_round']:.2f} | {r['vs_naive_same_images']:.2f} |")
    if out["scaling"]:
        lines += ["", "Threads and batch size (ms per image; engine = premerged, one adapter):", "",
                  "| size | variant | batch | 1 thread | 2 threads |", "|---|---|---:|---:|---:|"]
        seen = {}
        for r in out["scaling"]:
            seen.setdefault((r["size"], r["variant"], r["images"]), {})[r["threads"]] = r["s_per_image"]
        for (size, variant, n), t in seen.items():
            lines.append(f"| {size} | {variant} | {n} | {t.get(1, 0) * 1000:.0f} | {t.get(2, 0) * 1000:.0f} |")
    if out.get("peers"):
        lines += ["", "The plain backbone on OpenVINO (the best CPU peer; int8 by NNCF from 50 calibration frames) "
                  "against naive fp32 and the engine on the same images; worst per-token cosine of the last hidden "
                  "state against torch fp32 over 8 held-out frames:", "",
                  "| size | batch | variant | ms per image | x naive fp32 | worst token cosine |",
                  "|---:|---:|---|---:|---:|---:|"]
        lines += [f"| {r['size']} | {r['batch']} | {r['variant']} | {r['ms_per_image']:.1f} | {r['vs_naive']:.2f} | "
                  f"{'' if r['worst_token_cosine'] is None else format(r['worst_token_cosine'], '.4f')} |"
                  for r in out["peers"]]
        if out.get("vs_peer"):
            lines += ["", "The engine's openvino int8 (one adapter premerged, its calibrated prefix and suffix) over the "
                      "standalone OpenVINO int8 of the plain backbone with the same float hint, ms per image: "
                      + ", ".join(f"{s} px **{r:.2f}x**" for s, r in out["vs_peer"].items())
                      + f"; int8 parts that ran in float for want of a calibrated model: "
                      f"{sum(len(v) for v in out.get('openvino_uncalibrated', {}).values())}."]
    if out.get("linears"):
        lines += ["", "Linear layers alone (ms per call, × fp32), rows of the default pipeline's forwards:", "",
                  "| rows | shape | variant | ms | × fp32 |", "|---|---|---|---:|---:|"]
        lines += [f"| {r['rows']} | {r['shape']} | {r['variant']} | {r['ms']:.2f} | {r['vs_fp32']:.2f} |"
                  for r in out["linears"]]
    if out.get("prefix"):
        lines += ["", "Shared prefix: detect and actions-persons on the same 4 frames at 336 px (8 images), backbone "
                  "forward (s); blocks below both adapters' first LoRA block once per frame vs once per request:", "",
                  "| precision | prefix blocks | shared s | per request s | less compute (per round) |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['precision']} | {r['prefix_blocks']} | {r['shared_s']:.3f} | {r['per_request_s']:.3f} | "
                  f"{100 * r['saving_per_round']:.0f}% |" for r in out["prefix"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
