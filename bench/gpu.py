"""The GPU benchmark (issue 12): correctness and speed of every CUDA path, on a machine with a CUDA GPU.

    python bench/gpu.py              # everything (~10 minutes on one H100)
    python bench/gpu.py --skip sweep # without the streams-per-GPU sweep of the real daemon

Parts:
  correctness  each CUDA path against the plain loop (kernels.reference): ATMM Triton over segments and over
               fixed per-image runs, the premerged grouped GEMM, in fp32 / fp16 / bf16; and the whole engine on
               CUDA (bf16, CUDA graphs) against the engine on the CPU (fp32) on held-out frames with the real
               backbone and the shipped adapters: boxes matched by IoU > 0.9, same class, scores, labels
  ops          the LoRA op alone at ViT-S shapes against peft's mixed batch, a dLoRA-style one-hot einsum and a
               per-request loop, each op captured in a CUDA graph (no host time) and eager
  backbone     the whole DINOv2-S forward, 4 adapters r=16 on every linear layer, in each LoRA mode against
               merged weights, bf16, eager and graphed, batch 16 and 64
  sweep        the real daemon on CUDA fed by N synthetic streams (detect + 8-frame activity, 10 fps): streams
               held with >= 99% of chunks in deadline; PyAV decode frames/s per core for the decode limit
Writes bench/results/gpu.json and gpu.md. On a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def skipped(out: Path) -> int:
    print("bench/gpu.py: skipped: no CUDA device here (torch.cuda.is_available() is False)")
    return 0


def cuda_time(fn, repeats: int = 20, graph: bool = False) -> float:
    """Median milliseconds of fn on the GPU (CUDA events), eager or replayed from a CUDA graph."""
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


# ---------------------------------------------------------------- correctness
def correctness_kernels(log) -> dict:
    from vlora_va.kernels import atmm, atmm_images, atmm_reference
    from vlora_va.testing.atmm_cases import CASES, make  # the same cases the CPU tests use
    out = {"cases": 0, "failed": []}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tol = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}[dtype]
        for case in CASES:
            x, y, A, B, scale, ranks, idx = make(case, dtype)
            for delora in (None, 0):
                want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks, delora).float()
                got = atmm(y.clone().cuda(), x.cuda(), A.cuda(), B.cuda(), idx.cuda(), scale, ranks, delora,
                           impl="triton").float().cpu()
                out["cases"] += 1
                err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
                if err > tol:
                    out["failed"].append(f"segments {case[0]} {dtype} delora={delora}: {err:.3g}")
            # fixed per-image runs (what CUDA graphs replay): each element of the case is one image
            elem_slots, T = case[4], case[5]
            if T > 1:
                n = len(elem_slots)
                slot = torch.tensor([max(s, 0) for s in elem_slots], dtype=torch.int32)
                length = torch.tensor([T if s >= 0 else 0 for s in elem_slots], dtype=torch.int32)
                want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks).float()
                got = y.clone().cuda()
                atmm_images(got, x.cuda(), A.cuda(), B.cuda(), slot.cuda(), length.cuda(),
                            torch.as_tensor(scale, dtype=torch.float32).cuda(), torch.as_tensor(ranks, dtype=torch.int32).cuda(), T)
                out["cases"] += 1
                err = (got.float().cpu() - want).abs().max().item() / max(1.0, want.abs().max().item())
                if err > tol:
                    out["failed"].append(f"images {case[0]} {dtype}: {err:.3g}")
    log(f"  kernels: {out['cases']} cases, {len(out['failed'])} failed")
    return out


def correctness_engine(log) -> dict:
    """The engine on CUDA (bf16, graphs) against the engine on the CPU (fp32), real backbone, shipped
    adapters, held-out frames of the surveillance video."""
    try:
        import av  # noqa: F401
    except ImportError:
        return {"skipped": "PyAV not installed: no held-out frames"}
    from vlora_va.contracts.requests import Request
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.executor import Engine
    from vlora_va.engine.heads import box_iou
    from vlora_va.engine.modes import LoRAMode
    from vlora_va.ingest.chunker import letterbox
    from vlora_va.serving.scheduling import make_plan

    frames, ts = [], []
    with av.open(str(ROOT / "sample_videos" / "pedestrians.mp4")) as c:
        s = c.streams.video[0]
        want = [55.5 + 3 * i for i in range(8)]
        for f in c.decode(s):
            t = float(f.pts * s.time_base)
            if want and t >= want[0] - 1e-6:
                img, lb = letterbox(f.to_ndarray(format="rgb24"), 336)
                frames.append(img)
                ts.append(t)
                want.pop(0)
            if not want:
                break

    def engine(device, dtype):
        ads = {n: load_adapter_dir(n, ROOT / "adapters" / n, 384) for n in ("detect", "actions")}
        return Engine(load_backbone("dinov2-small", device=device), ads, 336, premerge_max_mb=1024, device=device,
                      dtype=dtype, max_batch_images=16)

    now = time.time()
    reqs = [Request("p", i, "detect", "detect", [f], [t], lb, (768, 576), now, now, now + 9) for i, (f, t) in
            enumerate(zip(frames, ts))]
    reqs.append(Request("p", 99, "activity", "actions", frames, ts, lb, (768, 576), now, now, now + 9))
    cpu = engine("cpu", torch.float32)
    ref = cpu.execute(make_plan(reqs, LoRAMode("unmerged"), cpu.catalog()))
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        gpu = engine("cuda", dtype)
        for mode in ("premerged", "unmerged"):
            gpu.switch(LoRAMode(mode))
            got = gpu.execute(make_plan(reqs, LoRAMode(mode), gpu.catalog()))
            boxes = matched = 0
            worst = 0.0
            for r, g in zip(ref[:-1], got[:-1]):
                fr, fg = r.frames[0], g.frames[0]
                boxes += len(fr.detections)
                if fr.detections and fg.detections:
                    iou = box_iou(torch.tensor([d.box for d in fr.detections]), torch.tensor([d.box for d in fg.detections]))
                    for i, d in enumerate(fr.detections):
                        j = int(iou[i].argmax())
                        if iou[i, j] > 0.9 and fg.detections[j].cls == d.cls:
                            matched += 1
                            worst = max(worst, abs(fg.detections[j].score - d.score))
            key = f"{str(dtype).removeprefix('torch.')}-{mode}"
            out[key] = {"boxes_cpu": boxes, "matched": matched, "max_score_diff": round(worst, 4),
                        "activity": [ref[-1].label, got[-1].label],
                        "activity_max_prob_diff": round(max(abs(ref[-1].scores[k] - got[-1].scores[k])
                                                            for k in ref[-1].scores), 4)}
            log(f"  engine {key}: {out[key]}")
    return out


# ---------------------------------------------------------------- speed
def ops(log) -> list[dict]:
    import atmm as A  # bench/atmm.py: baselines and the problem grid

    from vlora_va import kernels
    from vlora_va.kernels import tuning

    rows = []
    for n_in, n_out in ((384, 384), (384, 1536), (1536, 384), (4096, 4096)):
        for slots, slot_ranks, label in A.op_grid(full=False):
            y, x, Aw, Bw, seg = tuning.make_problem(n_in, n_out, slots, slot_ranks, A.TOKENS, torch.bfloat16, "cuda")
            scale = [2.0] * len(slot_ranks)
            dev = (torch.tensor(scale, device="cuda"), torch.tensor(slot_ranks, dtype=torch.int32, device="cuda"))
            einsum = A.make_einsum(Aw, Bw, slots, scale, A.TOKENS, x.shape[0])
            peft_layer = A.make_peft_layer(n_in, n_out, Aw.float().cpu(), Bw.float().cpu(), slot_ranks, scale).cuda().to(torch.bfloat16)
            x3 = x.view(len(slots), A.TOKENS, n_in)
            names = [f"s{s}" for s in slots]
            seg.device_tensors(x.device)
            with torch.no_grad():
                t = {"atmm": cuda_time(lambda: kernels.atmm(y, x, Aw, Bw, seg, scale, slot_ranks, impl="triton",
                                                            device_params=dev), graph=True),
                     "atmm_eager": cuda_time(lambda: kernels.atmm(y, x, Aw, Bw, seg, scale, slot_ranks, impl="triton",
                                                                  device_params=dev)),
                     "einsum": cuda_time(lambda: einsum(y, x), graph=True),
                     "loop": cuda_time(lambda: A.naive_per_request(y, x, Aw, Bw, slots, slot_ranks, scale, A.TOKENS),
                                       graph=True),
                     "peft": cuda_time(lambda: peft_layer(x3, adapter_names=names)) - cuda_time(lambda: peft_layer.base_layer(x3))}
            r = {"shape": f"{n_in}x{n_out}", "batch": label, "ms": {k: round(v, 4) for k, v in t.items()},
                 "speedup": {k: round(t[k] / t["atmm"], 2) for k in ("einsum", "loop", "peft")}}
            rows.append(r)
            log(f"  {r['shape']} {label}: atmm {t['atmm']:.4f} ms, x einsum {r['speedup']['einsum']}, "
                f"x loop {r['speedup']['loop']}, x peft {r['speedup']['peft']}")
    return rows


def backbone(log) -> list[dict]:
    import atmm as A

    from vlora_va.engine import lora
    from vlora_va.engine.backends.torch_eager import lower, upper
    from vlora_va.engine.modes import LoRAMode

    base = A.vit_s().cuda().to(torch.bfloat16)
    rows = []
    for batch in (16, 64):
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
        slots = sorted(i * 4 // batch for i in range(batch))

        def forward(m):
            return upper(m, lower(m, x, 0), 0)

        t = {}
        with torch.inference_mode():
            for graph in (False, True):
                tag = "graphed" if graph else "eager"
                t[f"merged-{tag}"] = cuda_time(lambda: forward(base), graph=graph)
                for premerge in (True, False):
                    m, ctx = A.with_atmm(base, A.ALL, [16] * 4, premerge=premerge)
                    layout = lora.DeviceLayout(batch, 257, 4, 64, torch.device("cuda"))
                    mode = LoRAMode("premerged" if premerge else "unmerged")
                    ctx.begin(mode, slots, layout)
                    t[f"{mode.kind}-{tag}"] = cuda_time(lambda: forward(m), graph=graph)
                    ctx.clear()
        for k, v in t.items():
            tag = k.split("-")[1]
            rows.append({"batch": batch, "variant": k, "ms": round(v, 3),
                         "overhead_pct": round(100 * (v / t[f"merged-{tag}"] - 1), 1)})
            log(f"  batch {batch} {k}: {v:.3f} ms ({rows[-1]['overhead_pct']:+.1f}% vs merged)")
    return rows


def decode_fps(log) -> float | None:
    try:
        import av
    except ImportError:
        return None
    t0, n = time.perf_counter(), 0
    with av.open(str(ROOT / "sample_videos" / "pedestrians.mp4")) as c:
        s = c.streams.video[0]
        s.codec_context.thread_count = 1
        for f in c.decode(s):
            f.to_ndarray(format="rgb24")
            n += 1
    fps = n / (time.perf_counter() - t0)
    log(f"  PyAV decode + RGB, 768x576 H.264, one core: {fps:.0f} frames/s")
    return fps


def sweep(log, streams: list[int], duration: float) -> list[dict]:
    """The real daemon on CUDA under N synthetic streams (bench/serving.py's load generator)."""
    import serving as S

    b = S.Backbone("vit-s", 384, 12, 6, 224, 1000.0)
    work = Path("/tmp/vlora-gpu-sweep")
    work.mkdir(exist_ok=True)
    adapters = S.build_adapters(b, "dinov2-small", 2, work)
    rows = []
    for n in streams:
        w = S.Workload(n, 2, 0.5, 1.0)
        cap = 10.0 * n  # 10 images/s per stream: the load is set in absolute terms here
        figures, _ = S.run_point(b, "dinov2-small", adapters, "vlora", w, duration, work, 4, seed=n, capacity=cap,
                                 device="cuda")
        rows.append({"streams": n, **figures})
        log(f"  {n} streams: {figures['streams_held']}/{figures['streams']} held, in deadline "
            f"{figures['in_deadline_per_s']:.0f} img/s, shed {figures['shed_rate']:.1%}")
    return rows


def markdown(res: dict) -> str:
    L = [f"# GPU benchmark ({res['gpu']}, torch {res['torch']})", ""]
    if "correctness" in res:
        k = res["correctness"]["kernels"]
        L += [f"Kernels against the loop: {k['cases']} cases, {len(k['failed'])} failed.", ""]
        for key, v in res["correctness"].get("engine", {}).items():
            L.append(f"- engine {key} vs CPU fp32: {v}")
        L.append("")
    if "backbone" in res:
        L += ["| batch | variant | ms | vs merged |", "|---:|---|---:|---:|"]
        L += [f"| {r['batch']} | {r['variant']} | {r['ms']} | {r['overhead_pct']:+.1f}% |" for r in res["backbone"]]
        L.append("")
    if "ops" in res:
        sp = [r["speedup"] for r in res["ops"]]
        L += [f"LoRA op alone (graphed): median x{statistics.median(s['einsum'] for s in sp):.2f} vs einsum "
              f"(min x{min(s['einsum'] for s in sp):.2f}), x{statistics.median(s['peft'] for s in sp):.2f} vs peft, "
              f"x{statistics.median(s['loop'] for s in sp):.2f} vs the loop.", ""]
    if "sweep" in res:
        L += ["| streams | held | in-deadline img/s | shed | p99 ms |", "|---:|---:|---:|---:|---:|"]
        L += [f"| {r['streams']} | {r['streams_held']}/{r['streams']} | {r['in_deadline_per_s']:.0f} | "
              f"{r['shed_rate']:.1%} | {r['p99_latency_ms']} |" for r in res["sweep"]]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", default="", help="comma list of parts to skip: correctness,ops,backbone,sweep")
    ap.add_argument("--streams", default="16,64,128,200,256")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        return skipped(a.out)
    skip = set(filter(None, a.skip.split(",")))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if "correctness" not in skip:
        log("correctness:")
        res["correctness"] = {"kernels": correctness_kernels(log), "engine": correctness_engine(log)}
    if "ops" not in skip:
        log("LoRA op grid:")
        res["ops"] = ops(log)
    if "backbone" not in skip:
        log("whole backbone:")
        res["backbone"] = backbone(log)
    if "sweep" not in skip:
        log("decode and streams per GPU:")
        res["decode_fps_per_core"] = decode_fps(log)
        res["sweep"] = sweep(log, [int(v) for v in a.streams.split(",")], a.duration)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu.json").write_text(json.dumps(res, indent=1, default=str))
    (a.out / "gpu.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
