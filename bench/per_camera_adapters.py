"""Per-camera adapters: 8 cameras each with its own detect adapter against 8 cameras sharing one, in one run.

    python bench/per_camera_adapters.py                 # torch fp32 and int8, openvino int8: <= 9.5 min on 2 cores
    python bench/per_camera_adapters.py --quick         # a smoke run: torch fp32 + openvino fp32, 2 rounds, <= 3 min
    python bench/per_camera_adapters.py --configs torch-fp32,openvino-int8,openvino-bf16 --rounds 7 --budget-min 15

The project's claim is many per-camera adapters on ONE backbone. This measures what it costs: one batch of 8 frames,
one frame from each of 8 cameras (detect, 1 frame per chunk), served by the engine (`Engine.execute`: backbone,
detection heads, decoding) with

    own      camera i's request through its own adapter cam_i (8 adapters in 8 slots, 8 heads)
    shared   every camera's request through the same adapter cam_0 (one slot, one head)

The 8 adapters are copies of the shipped adapters/detect (PEFT format) with seeded small Gaussian noise added to
every LoRA A / B tensor and every head tensor (NOISE x the tensor's own std), written to a temporary folder; the
shipped adapter is only read. What a batch costs does not depend on the weights' values (the same shapes, ranks and
layers), only on how many distinct adapters the batch holds; the detections each variant found are counted as a check
that the copies still detect what the shipped adapter does (decoding cost grows with the boxes). Frames are real:
8 frames of sample_videos/pedestrians.mp4 (3, 9, ..., 45 s: 8 different scenes, as 8 cameras would send), letterboxed
to pipelines.yaml's daemon.image_size as ingest does.

Configurations (backend, precision) x LoRA modes (engine/modes.py), as far as the engine has them:

    premerged   rows of each slot through that slot's W + dW (own: 8 runs of 1 frame; shared: 1 run of 8)
    unmerged    base W for all rows, plus each row's LoRA through ATMM (own: 8 LoRA runs; shared: 1)
    mixture     the base weights hold cam_0; the other rows add their own LoRA and subtract cam_0's (deLoRA);
                shared: every row is cam_0's, so nothing is added (it computes what merged does)
    merged      the base weights hold one adapter, every row must be its: shared = one batch, no switch;
                own = the engine cannot serve 8 adapters in one merged batch, so it runs as merge-only serves
                them: 8 batches of 1 frame, a weight switch before each (included in the time)
    openvino    one compiled model per adapter with its LoRA merged in (the LoRA mode does not apply): the shared
                prefix (blocks below the first LoRA block) once for the 8 frames, then one sub-batch per adapter
                (own: 8 calls of 1 frame, 8 compiled heads; shared: one call of 8). int8 needs each adapter's NNCF
                calibrated models: made here (10 frames each) in a temporary cache, so the real cache is untouched

The variants run interleaved round by round (reverse order every other round, a warm-up call each first) with the
engine's weights switched to what the mode needs before each timed call (merged own: to the last camera's, so all
8 switches are timed). Per variant the median of the batch's time: each frame's compute latency (all 8 results come
at the end of the batch), ms per frame (/ 8) and frames/s; own / shared per mode as the ratio of the medians and as
the median of the ratios taken within each round. The machine is shared: during each timed call the cores that other
work took (/proc/stat less this process, the hypervisor's steal included) are recorded, and a round counts as quiet
for a pair when both its calls had the cores to themselves (< QUIET_CORES). After the rounds, a pair with fewer than
MIN_QUIET quiet rounds is timed again (shared and own back to back) whenever the machine is quiet for a second, until
--budget-min. The headline table is medians over quiet rounds (all rounds where a pair has fewer than MIN_QUIET,
marked); a second table gives every timed call, busy ones included, with the other work's cores. Memory per adapter:
the files, the torch engine's per-slot storage (computed: LoRA stacks and premerged weights are allocated for every
slot at start-up; int8 packs one copy per loaded slot) and the openvino backend's compiled models (resident memory
after compiling the shared case's models, then the other 7 adapters' ones). 2 threads (torch and OpenVINO). Writes
bench/results/per_camera_adapters.{json,md,png} (--quick: a temporary folder unless --out says where).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va.contracts.plugins import BACKBONE_BACKENDS  # noqa: E402
from vlora_va.contracts.requests import Request  # noqa: E402
from vlora_va.engine.adapters import ADAPTER_FILES, load_adapter_dir  # noqa: E402
from vlora_va.engine.backbones import load_backbone  # noqa: E402
from vlora_va.engine.executor import Engine  # noqa: E402
from vlora_va.engine.lora import premerge_bytes  # noqa: E402
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode  # noqa: E402
from vlora_va.engine.precision import Capabilities, device_name  # noqa: E402
from vlora_va.ingest.chunker import letterbox  # noqa: E402
from vlora_va.serving.scheduling import make_plan  # noqa: E402
from vlora_va.testing.host import cpu_name, rss_mb  # noqa: E402

CAMERAS = 8
NOISE = 0.05  # each copy: tensor += NOISE * std(tensor) * N(0, 1), seeded per camera
SOURCE = ROOT / "adapters" / "detect"
VIDEO = ROOT / "sample_videos" / "pedestrians.mp4"
FRAME_TIMES = (3.0, 48.0, 6.0)  # start, end, step: 3, 9, ..., 45 s
CALIBRATION = (0.0, 50.0, 5.0)  # openvino int8: 10 frames per model (the values do not change the cost)
CONFIGS = ("torch-fp32", "torch-int8", "openvino-int8")  # openvino int8: what `auto` picks on AVX-512 + VNNI
KNOWN = ("torch-fp32", "torch-bf16", "torch-int8", "openvino-fp32", "openvino-bf16", "openvino-int8")
QUICK_CONFIGS = ("torch-fp32", "openvino-fp32")
TORCH_MODES = ("premerged", "unmerged", "mixture", "merged")
QUIET_CORES = 0.2  # a timed call is quiet when the machine's other work took less than this many cores meanwhile
MIN_QUIET = 3  # quiet rounds a pair needs for its headline figures to be the quiet ones
MIN_ROUNDS = 3  # rounds of every variant, whatever the time budget says


def pipeline_daemon() -> dict:
    return yaml.safe_load((ROOT / "pipelines.yaml").read_text())["daemon"]


# ---------------------------------------------------------------- the adapters and the requests
def make_adapters(work: Path, n: int = CAMERAS, noise: float = NOISE) -> dict[str, Path]:
    """n copies of adapters/detect with seeded noise on every LoRA A / B and head tensor (float tensors only)."""
    from safetensors.torch import load_file, save_file

    out = {}
    for i in range(n):
        path = work / f"cam{i}"
        path.mkdir(parents=True, exist_ok=True)
        g = torch.Generator().manual_seed(1000 + i)
        for name in ADAPTER_FILES:
            if not name.endswith(".safetensors"):
                shutil.copyfile(SOURCE / name, path / name)
                continue
            tensors = load_file(str(SOURCE / name))
            noisy = {}
            for k in sorted(tensors):
                t = tensors[k]
                if t.is_floating_point() and t.numel() > 1:
                    t = t + noise * t.float().std() * torch.randn(t.shape, generator=g).to(t.dtype)
                noisy[k] = t.contiguous()
            save_file(noisy, str(path / name))
        out[f"cam{i}"] = path
    return out


def camera_frames(image_size: int) -> list[tuple]:
    """One real frame per camera, letterboxed as ingest sends it: (frame, letterbox, (w, h), media time)."""
    from vlora_va.training.frames import read_frames

    frames = read_frames(VIDEO, *FRAME_TIMES)[:CAMERAS]
    if len(frames) < CAMERAS:
        raise SystemExit(f"{VIDEO} gave {len(frames)} frames, {CAMERAS} needed")
    out = []
    for f in frames:
        boxed, lb = letterbox(f.rgb, image_size)
        out.append((boxed, lb, (f.rgb.shape[1], f.rgb.shape[0]), f.t))
    return out


def requests(frames: list[tuple], adapters: list[str]) -> list[Request]:
    """One detect request per camera (1 frame), camera i through adapters[i]."""
    now = time.time()
    return [Request(f"cam{i}", 0, "detect", a, [boxed], [t], lb, size, now, now, now + 10.0)
            for i, ((boxed, lb, size, t), a) in enumerate(zip(frames, adapters))]


def count_boxes(results) -> int:
    return sum(len(f.detections) for r in results for f in r.frames)


# ---------------------------------------------------------------- variants
class Variant:
    """One timed thing: `prepare` (untimed: weights switched to what the timed call starts from), then `run`."""

    def __init__(self, config: str, mode: str, case: str, engine: Engine, plans: list, start_slot):
        self.config, self.mode, self.case, self.engine, self.plans = config, mode, case, engine, plans
        self.start = start_slot  # what the base weights hold before the timed call ("rest": the plan's own need)
        self.times: list[float] = []
        self.others: list[float] = []  # cores the machine's other work took during each timed call
        self.boxes = 0

    @property
    def name(self) -> str:
        return f"{self.config} | {self.mode} | {self.case}"

    def prepare(self) -> None:
        want = self.plans[0].mode.weights_slot if self.start == "rest" else self.start
        if self.engine.lora_ctx is not None and self.engine.weights_slot != want:
            self.engine.switch(LoRAMode(MERGED, want) if want is not None else LoRAMode(PREMERGED))

    def run(self) -> list:
        out = []
        for plan in self.plans:
            out += self.engine.execute(plan)
        return out


def variants_of(config: str, engine: Engine, frames: list[tuple]) -> list[Variant]:
    names = sorted(engine.slots, key=lambda n: engine.slots[n])  # cam0 .. cam7
    own, shared = requests(frames, names), requests(frames, [names[0]] * CAMERAS)
    catalog = engine.catalog()
    s0 = engine.slots[names[0]]
    out = []
    if engine.backend_name == "openvino":  # every mode runs each row through its adapter's compiled model
        mode = catalog.resting_mode()
        for case, reqs in (("shared", shared), ("own", own)):
            out.append(Variant(config, "per-adapter models", case, engine, [make_plan(reqs, mode, catalog)], "rest"))
        return out
    for m in TORCH_MODES:
        for case, reqs in (("shared", shared), ("own", own)):
            if m == "premerged":
                plans, start = [make_plan(reqs, LoRAMode(PREMERGED), catalog)], "rest"
            elif m == "unmerged":
                plans, start = [make_plan(reqs, LoRAMode(UNMERGED), catalog)], "rest"
            elif m == "mixture":
                plans, start = [make_plan(reqs, LoRAMode(MIXTURE, s0), catalog)], "rest"
            elif case == "shared":  # merged: one batch, the weights already hold cam0
                plans, start = [make_plan(reqs, LoRAMode(MERGED, s0), catalog)], "rest"
            else:  # merged, own: merge-only's way, one batch per camera, each after a weight switch
                plans = [make_plan([r], LoRAMode(MERGED, engine.slots[r.adapter]), catalog) for r in reqs]
                start = engine.slots[reqs[-1].adapter]
            out.append(Variant(config, m, case, engine, plans, start))
    return out


def build_engine(config: str, adapters: dict[str, Path], daemon: dict, calib_frames: list) -> tuple[Engine, dict]:
    """The engine of a configuration with the 8 camera adapters; openvino: compiled (the shared case's models
    first, then the rest), int8 calibrated first. Returns it and what building it measured."""
    backend, precision = config.split("-")
    loaded = {n: load_adapter_dir(n, p, 384) for n, p in adapters.items()}
    t0 = time.perf_counter()
    engine = Engine(load_backbone(daemon.get("backbone", "dinov2-small")), loaded, int(daemon["image_size"]),
                    max_slots=CAMERAS, premerge_max_mb=int(daemon.get("premerge_max_mb", 1024)),
                    max_batch_images=int(daemon.get("max_batch_images", 16)), precision=precision, backend=backend)
    info = {"engine_s": round(time.perf_counter() - t0, 2), "backend": engine.backend_name,
            "precision": engine.precision, "premerged": engine.premerged}
    if engine.backend_name != backend:
        raise RuntimeError(f"{config}: the engine fell back to {engine.backend_name}")
    if backend == "openvino":
        info.update(openvino_build(engine, calib_frames))
    return engine, info


def openvino_build(engine: Engine, calib_frames: list) -> dict:
    """Calibrate (int8), then compile what the shared case runs (prefix, cam0's suffix and head) and what the own
    case adds (7 suffixes and heads), with the resident memory each step adds."""
    be, size = engine.backend, engine.sizes["cam0"]
    split = be.split([engine.slots[n] for n in engine.slots])
    out = {"split": split}
    if engine.precision == "int8":
        t0 = time.perf_counter()
        px = [x[None].numpy() for x in be.pixels(calib_frames, size)]
        be.calibrate("lower", size, split, None, px, {"bench": "per_camera_adapters"})
        lower = be.lower_model(size, split)
        hidden = [be.infer(lower, p) for p in px]
        for n in sorted(engine.slots, key=engine.slots.get):
            be.calibrate("upper", size, split, engine.slots[n], hidden, {"bench": "per_camera_adapters"})
        be._lower.clear()  # compiled again below, counted with the shared case's memory
        out["calibrate_s"] = round(time.perf_counter() - t0, 1)
    gc.collect()
    before = rss_mb()
    names = sorted(engine.slots, key=engine.slots.get)
    for k, n in enumerate(names):
        slot = engine.slots[n]
        if k == 0:
            be.lower_model(size, split)
        be.upper_model(slot, size, split)
        be.head_forward(slot, engine.adapters[n].head, size)
        if k == 0:
            gc.collect()
            out["rss_shared_mb"] = round(rss_mb() - before, 1)
    gc.collect()
    out["rss_own_mb"] = round(rss_mb() - before, 1)
    out["rss_per_extra_adapter_mb"] = round((out["rss_own_mb"] - out["rss_shared_mb"]) / (CAMERAS - 1), 1)
    out["compile_s"] = {k: round(v, 2) for k, v in be.compile_s.items()}
    out["uncalibrated"] = list(be.uncalibrated)
    return out


def torch_memory(engine: Engine) -> dict:
    """The torch engine's LoRA storage (computed from its tensors): allocated for every slot at start-up, so 8
    adapters take no more than 1 in an engine sized for 8 slots; an engine sized for 1 slot takes 1/8 of it."""
    ctx = engine.lora_ctx
    slots = ctx.num_slots
    stacks = sum(g.A.numel() * g.A.element_size() + g.B.numel() * g.B.element_size() for g in ctx.groups)
    merged = premerge_bytes(engine.backbone) if engine.premerged else 0
    out = {"slots": slots, "max_rank": ctx.max_rank, "lora_stacks_mb_per_slot": round(stacks / slots / 2**20, 1),
           "premerged_mb_per_slot": round(merged / slots / 2**20, 1)}
    if engine.precision == "int8":  # one packed int8 copy per loaded slot of each layer its adapter changes
        slot = engine.slots["cam0"]
        packed = sum(g.W[l].numel() for g in ctx.groups for l in range(len(g.rank_py)) if g.rank_py[l][slot])
        out["int8_packed_mb_per_loaded_slot"] = round(packed / 2**20, 1)
    return out


# ---------------------------------------------------------------- timing
def cpu_counters() -> tuple[float, float]:
    """(CPU seconds the whole machine spent busy, steal included; of those, this process's), now."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), r.ru_utime + r.ru_stime


def timed(v: Variant) -> None:
    """One timed call, and how many cores the machine's other work (other processes, the hypervisor's steal) took
    meanwhile: this is a shared 2-core machine, and a call that shared its cores is not the engine's cost."""
    v.prepare()
    busy0, mine0 = cpu_counters()
    t0 = time.perf_counter()
    v.run()
    wall = time.perf_counter() - t0
    busy1, mine1 = cpu_counters()
    v.times.append(wall)
    v.others.append(max(0.0, (busy1 - busy0) - (mine1 - mine0)) / wall)


def pairs(variants: list[Variant]) -> list[tuple[Variant, Variant]]:
    """(shared, own) per configuration and mode."""
    by = {(v.config, v.mode, v.case): v for v in variants}
    return [(v, by[(v.config, v.mode, "own")]) for v in variants if v.case == "shared"]


def quiet_rounds(shared: Variant, own: Variant) -> list[int]:
    return [r for r in range(min(len(shared.times), len(own.times)))
            if shared.others[r] < QUIET_CORES and own.others[r] < QUIET_CORES]


def quiet_pairs(variants: list[Variant]) -> int:
    """The fewest quiet rounds any own / shared pair has."""
    return min(len(quiet_rounds(sh, own)) for sh, own in pairs(variants))


def machine_others(seconds: float = 1.0) -> float:
    """Cores the machine's other work takes now (over `seconds`, this process idle)."""
    busy0, mine0 = cpu_counters()
    time.sleep(seconds)
    busy1, mine1 = cpu_counters()
    return max(0.0, (busy1 - busy0) - (mine1 - mine0)) / seconds


def interleaved(variants: list[Variant], rounds: int, deadline: float, log) -> dict:
    """Warm-up, then `rounds` rounds of every variant (at least MIN_ROUNDS; no new round once 60% of the time to
    `deadline` is spent), then top-ups until `deadline` (time.perf_counter()): each pair with fewer than MIN_QUIET
    quiet rounds is timed again, shared and own back to back, whenever the machine's other work has left the cores
    free for a second (a busy machine is waited out, not measured)."""
    t0 = time.perf_counter()
    for v in variants:  # warm-up: first calls (allocations, lazily built state) are not timed
        v.prepare()
        v.boxes = count_boxes(v.run())
    r, last = 0, 0.0
    main_end = t0 + 0.6 * (deadline - t0)
    while r < rounds and (r < MIN_ROUNDS or time.perf_counter() + last < main_end):
        t_round = time.perf_counter()
        for v in (variants if r % 2 == 0 else variants[::-1]):
            timed(v)
        last = time.perf_counter() - t_round
        r += 1
        busy = statistics.median(x for v in variants for x in v.others[-1:])
        log(f"round {r}: {last:.1f} s, other work took {busy:.2f} cores (median over calls); "
            f"quiet rounds of the least quiet pair so far: {quiet_pairs(variants)}")
    waited, topups = 0.0, 0
    while True:
        needy = [(sh, own) for sh, own in pairs(variants) if len(quiet_rounds(sh, own)) < MIN_QUIET]
        if not needy:
            break
        sh, own = needy[0]
        need = statistics.median(sh.times) + statistics.median(own.times)
        if time.perf_counter() + need + 1.0 > deadline:
            log(f"top-ups stopped: the time is up ({len(needy)} pair(s) with fewer than {MIN_QUIET} quiet rounds)")
            break
        if machine_others() >= QUIET_CORES:
            waited += 1.0
            continue
        for v in ((sh, own) if len(sh.times) % 2 == 0 else (own, sh)):
            timed(v)
        topups += 1
        log(f"top-up {sh.config} | {sh.mode}: other work {sh.others[-1]:.2f} / {own.others[-1]:.2f} cores, "
            f"{len(quiet_rounds(sh, own))} quiet rounds (waited {waited:.0f} s for quiet so far)")
    log(f"{r} rounds, {topups} top-ups, {waited:.0f} s waited for a quiet machine")
    return {"rounds": r, "topups": topups, "waited_for_quiet_s": waited}


def stats(shared: list[float], own: list[float]) -> dict:
    if not shared:
        return {"rounds": 0}
    ms, mo = statistics.median(shared), statistics.median(own)
    return {"rounds": len(shared), "shared_batch_ms": round(1e3 * ms, 1), "own_batch_ms": round(1e3 * mo, 1),
            "shared_ms_per_frame": round(1e3 * ms / CAMERAS, 1), "own_ms_per_frame": round(1e3 * mo / CAMERAS, 1),
            "shared_frames_per_s": round(CAMERAS / ms, 2), "own_frames_per_s": round(CAMERAS / mo, 2),
            "own_over_shared": round(mo / ms, 3),
            "own_over_shared_per_round": round(statistics.median(o / s for o, s in zip(own, shared)), 3)}


def summarise(variants: list[Variant]) -> list[dict]:
    """Per configuration and mode: medians over every round (`all`) and over the quiet ones (`quiet`: both calls of
    the pair had the cores to themselves); `headline`: quiet where there are MIN_QUIET of them, else all."""
    by = {(v.config, v.mode, v.case): v for v in variants}
    rows = []
    for (config, mode, case), sh in by.items():
        if case != "shared":
            continue
        own = by[(config, mode, "own")]
        q = quiet_rounds(sh, own)
        row = {"config": config, "mode": mode, "own_batches": len(own.plans), "shared_boxes": sh.boxes,
               "own_boxes": own.boxes, "all": stats(sh.times, own.times),
               "quiet": stats([sh.times[r] for r in q], [own.times[r] for r in q]), "quiet_rounds": q,
               "others_cores_median": round(statistics.median(sh.others + own.others), 2),
               "shared_times_s": [round(t, 4) for t in sh.times], "own_times_s": [round(t, 4) for t in own.times],
               "shared_others_cores": [round(x, 2) for x in sh.others],
               "own_others_cores": [round(x, 2) for x in own.others]}
        row["headline"] = "quiet" if len(q) >= MIN_QUIET else "all"
        rows.append(row)
    return rows


def best(rows: list[dict]) -> list[dict]:
    """Per configuration, the cheapest mode for each case (headline figures): what a scheduler choosing by measured
    cost would serve."""
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [(r["mode"], r[r["headline"]]) for r in rows if r["config"] == config]
        s = min(mine, key=lambda m: m[1]["shared_batch_ms"])
        o = min(mine, key=lambda m: m[1]["own_batch_ms"])
        out.append({"config": config, "shared_mode": s[0], "shared_batch_ms": s[1]["shared_batch_ms"],
                    "own_mode": o[0], "own_batch_ms": o[1]["own_batch_ms"],
                    "own_over_shared": round(o[1]["own_batch_ms"] / s[1]["shared_batch_ms"], 3)})
    return out


# ---------------------------------------------------------------- output
def _row(r: dict, fig: dict) -> str:
    return (f"| {r['config']} | {r['mode']}{' (own: 8 batches, a switch each)' if r['own_batches'] > 1 else ''} | "
            f"{fig['shared_batch_ms']:.0f} | {fig['own_batch_ms']:.0f} | {fig['shared_ms_per_frame']:.1f} | "
            f"{fig['own_ms_per_frame']:.1f} | {fig['shared_frames_per_s']:.2f} | {fig['own_frames_per_s']:.2f} | "
            f"**{fig['own_over_shared']:.2f}** | {fig['own_over_shared_per_round']:.2f} |")


def markdown(res: dict) -> str:
    m = res["meta"]
    header = ["| backend, precision | mode | shared: batch ms | own: batch ms | shared ms/frame | own ms/frame | "
              "shared frames/s | own frames/s | own / shared | per round |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines = [f"# Per-camera adapters: 8 cameras with their own detect adapter vs 8 sharing one ({m['date']})", "",
             f"CPU: {m['cpu_model']} (torch capability {m['isa']}, native bf16 {m['native_bf16']}, VNNI {m['vnni']}), "
             f"{m['cores']} cores, {m['threads']} threads, torch {m['torch']}"
             + (f", OpenVINO {m['openvino']} (int8 float parts {m['openvino_int8_float_hint']})"
                if m.get("openvino") else "") + f"; load average at start {m['load_at_start']:.2f}; "
             f"`{m['command']}`, {m['wall_s']} s. One batch = 1 frame from each of {CAMERAS} cameras (pedestrians.mp4 "
             f"at {', '.join(f'{t:g}' for t in m['frame_times'])} s, letterboxed to {m['image_size']} px), detect, "
             f"`Engine.execute` (backbone, heads, decoding), {m['rounds']} interleaved rounds of every variant, then "
             f"{m['topups']} top-ups of pairs short of quiet rounds ({m['waited_for_quiet_s']:.0f} s waited for a "
             "quiet machine). `batch ms` is each "
             f"frame's compute latency (its result comes with the batch's; merged own: the last camera's); ms/frame = "
             f"batch / {CAMERAS}; own / shared = ratio of the medians; per round = median of the ratios within a "
             "round.", "",
             f"The {CAMERAS} adapters are adapters/detect with seeded noise ({m['noise']} x each tensor's std) on "
             "every LoRA A / B and head tensor: **the cost does not depend on the values** (same shapes, ranks, "
             "layers), only on how many distinct adapters a batch holds.", "",
             f"**Quiet rounds** (both calls of the pair had the 2 cores: the machine's other work, steal included, took "
             f"< {QUIET_CORES} cores meanwhile; medians over those rounds, or over all where fewer than {MIN_QUIET}, "
             "marked):", ""] + header
    for r in res["results"]:
        fig = r[r["headline"]]
        line = _row(r, fig)
        lines.append(line.replace(f" | {r['mode']}", f" | {r['mode']} [{fig['rounds']} quiet]", 1)
                     if r["headline"] == "quiet" else line.replace(f" | {r['mode']}", f" | {r['mode']} [all "
                                                                   f"{fig['rounds']}: too few quiet]", 1))
    lines += ["", "**Every timed call** (medians over all rounds and top-ups, busy ones included; `other work`: "
              "cores the machine's other work took during the pair's calls, median):", "",
              header[0].replace("per round |", "per round | other work | boxes own / shared |"),
              header[1] + "---:|---:|"]
    lines += [_row(r, r["all"]) + f" {r['others_cores_median']:.2f} | {r['own_boxes']} / {r['shared_boxes']} |"
              for r in res["results"]]
    lines += ["", "Cheapest mode per case (what a scheduler choosing by measured cost serves; quiet-round figures):",
              "",
              "| backend, precision | shared: mode, batch ms | own: mode, batch ms | own / shared |",
              "|---|---|---|---:|"]
    lines += [f"| {b['config']} | {b['shared_mode']}, {b['shared_batch_ms']:.0f} | {b['own_mode']}, "
              f"{b['own_batch_ms']:.0f} | **{b['own_over_shared']:.2f}** |" for b in res["best"]]
    lines += ["", "Memory per adapter:", "",
              f"- files: {res['memory']['files_mb_per_adapter']:.2f} MB (LoRA {res['memory']['lora_mb']:.2f} MB, "
              f"head {res['memory']['head_mb']:.2f} MB, fp32)."]
    for config, b in res["builds"].items():
        mem = b.get("torch_memory")
        if mem:
            line = (f"- {config}: LoRA slot stacks {mem['lora_stacks_mb_per_slot']} MB and premerged weights "
                    f"{mem['premerged_mb_per_slot']} MB per slot (max_rank {mem['max_rank']}), allocated for all "
                    f"{mem['slots']} slots at start-up: 8 adapters cost no more than 1 in this engine; one sized for "
                    f"1 slot would hold {(mem['lora_stacks_mb_per_slot'] + mem['premerged_mb_per_slot']) * 7:.0f} MB "
                    "less")
            if "int8_packed_mb_per_loaded_slot" in mem:
                line += f"; int8 packs {mem['int8_packed_mb_per_loaded_slot']} MB more per loaded adapter"
            lines.append(line + ".")
        if "rss_shared_mb" in b:
            lines.append(f"- {config}: compiled models, resident memory: shared case (prefix + 1 suffix + 1 head) "
                         f"{b['rss_shared_mb']:.0f} MB, own case (+ 7 suffixes and heads) {b['rss_own_mb']:.0f} MB: "
                         f"**{b['rss_per_extra_adapter_mb']:.0f} MB per extra adapter**"
                         + (f"; calibration (NNCF, 9 parts) {b['calibrate_s']} s" if "calibrate_s" in b else "")
                         + (f"; parts run in float for want of a calibrated model: {len(b['uncalibrated'])}"
                            if b.get("uncalibrated") else "") + ".")
    lines += ["", "Not measured:", ""] + [f"- {x}" for x in res["not_measured"]]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    rows = [{**r[r["headline"]], "config": r["config"], "mode": r["mode"]} for r in res["results"]]
    labels = [f"{r['config']}\n{r['mode']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
    ax.bar([i - 0.2 for i in x], [r["shared_ms_per_frame"] for r in rows], 0.4, label="8 cameras, 1 shared adapter")
    ax.bar([i + 0.2 for i in x], [r["own_ms_per_frame"] for r in rows], 0.4, label="8 cameras, 8 own adapters")
    for i, r in zip(x, rows):
        ax.text(i + 0.2, r["own_ms_per_frame"], f"{r['own_over_shared']:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("ms per frame (batch of 8 / 8), quiet rounds")
    ax.set_title(f"Own vs shared detect adapter, {res['meta']['cpu_model']}, {res['meta']['threads']} threads",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: {', '.join(QUICK_CONFIGS)}, 2 rounds")
    ap.add_argument("--configs", default=None, help=f"backend-precision list (default {','.join(CONFIGS)}); "
                    "openvino-bf16 is skipped on a CPU without native bf16")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds of every variant (default 5; --quick 2)")
    ap.add_argument("--budget-min", type=float, default=None,
                    help=f"nothing is timed past this many minutes from the start, rounds ({MIN_ROUNDS} at least) "
                         f"then quiet top-ups (default 9.5; --quick 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None,
                    help="where the results go (default bench/results; --quick: a temporary folder)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:5.0f}s] {msg}", flush=True)

    configs = (a.configs.split(",") if a.configs else list(QUICK_CONFIGS if a.quick else CONFIGS))
    rounds = a.rounds or (2 if a.quick else 5)
    budget_min = a.budget_min or (3.0 if a.quick else 9.5)
    out_dir = a.out or (Path(tempfile.mkdtemp(prefix="per-camera-quick-")) if a.quick else ROOT / "bench" / "results")
    torch.set_num_threads(a.threads)
    daemon = pipeline_daemon()
    image_size = int(daemon["image_size"])
    caps = Capabilities.detect("cpu")
    not_measured = []
    work = Path(tempfile.mkdtemp(prefix="per-camera-adapters-"))
    old_cache = os.environ.get("VLORA_VA_OPENVINO_CACHE")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu_model": cpu_name(), "cpu": device_name(torch.device("cpu")),
            "cores": os.cpu_count(), "threads": a.threads, "torch": torch.__version__,
            "command": " ".join(["python", "bench/per_camera_adapters.py", *(sys.argv[1:] if argv is None else argv)]),
            "platform": platform.platform(), "load_at_start": os.getloadavg()[0], "image_size": image_size,
            "noise": NOISE, "cameras": CAMERAS, "source_adapter": str(SOURCE.relative_to(ROOT)),
            "isa": caps.isa, "native_bf16": caps.native_bf16, "vnni": caps.vnni}
    try:
        adapters = make_adapters(work / "adapters")
        log(f"{CAMERAS} adapters from {SOURCE.relative_to(ROOT)} (noise {NOISE} x std, seeds 1000-{999 + CAMERAS}) "
            f"in {work / 'adapters'}")
        frames = camera_frames(image_size)
        meta["frame_times"] = [f[3] for f in frames]
        calib = []
        engines, builds, variants = {}, {}, []
        for config in configs:
            backend, precision = config.split("-")
            if backend == "openvino":
                from vlora_va.engine.backends import openvino as ovb
                from vlora_va.engine.backends import openvino_int8

                if precision == "bf16" and not caps.native_bf16:
                    not_measured.append(f"{config}: this CPU has no native bf16 (OpenVINO would emulate it)")
                    continue
                why = BACKBONE_BACKENDS.load(backend).unavailable(torch.device("cpu"), precision)
                if why:
                    not_measured.append(f"{config}: {why}")
                    continue
                if "VLORA_VA_OPENVINO_CACHE" not in os.environ or os.environ["VLORA_VA_OPENVINO_CACHE"] == old_cache:
                    # the float hint the daemon uses here, then a private cache: fresh compiles, int8 calibrated
                    # for the copies without writing the user's cache
                    openvino_int8.HINT_OVERRIDE = ovb.int8_hint()
                    os.environ["VLORA_VA_OPENVINO_CACHE"] = str(work / "openvino")
                    meta["openvino"] = ovb.openvino_version()
                    meta["openvino_int8_float_hint"] = openvino_int8.HINT_OVERRIDE
                if precision == "int8" and not calib:
                    from vlora_va.training.frames import read_frames

                    calib = [letterbox(f.rgb, image_size)[0] for f in read_frames(VIDEO, *CALIBRATION)]
            else:
                why = BACKBONE_BACKENDS.load(backend).unavailable(torch.device("cpu"), precision) or \
                    caps.runs(precision)
                if why:
                    not_measured.append(f"{config}: {why}")
                    continue
            log(f"{config}: building the engine ...")
            engine, info = build_engine(config, adapters, daemon, calib)
            if backend == "torch":
                info["torch_memory"] = torch_memory(engine)
            engines[config], builds[config] = engine, info
            log(f"{config}: built ({json.dumps({k: v for k, v in info.items() if k != 'compile_s'})})")
            variants += variants_of(config, engine, frames)
        log(f"timing {len(variants)} variants x {rounds} rounds (+ a warm-up call each), then quiet top-ups of pairs "
            f"with fewer than {MIN_QUIET} quiet rounds, until {budget_min:g} min from the start ...")
        meta.update(interleaved(variants, rounds, t_start + 60 * budget_min, log))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if old_cache is None:
            os.environ.pop("VLORA_VA_OPENVINO_CACHE", None)
        else:
            os.environ["VLORA_VA_OPENVINO_CACHE"] = old_cache

    rows = summarise(variants)
    left = [c for c in KNOWN if c not in configs]
    if left:
        not_measured.append(f"{', '.join(left)}: not in this run, to keep it short (--configs adds them)")
    not_measured += [
        "merged mode with 8 own adapters in ONE batch: the engine refuses it (merged needs every row on the slot "
        "the weights hold); measured instead as merge-only serves it, 8 one-frame batches with a weight switch each",
        "mixture for the shared case adds nothing (every row is the merged adapter's): it is what merged computes",
        "openvino LoRA modes: the backend has one way (each adapter's LoRA compiled into its own suffix model); "
        "premerged / unmerged / mixture / merged only change how the torch backend computes",
        "GPU (CUDA): this bench runs the CPU engines only",
        "the daemon's scheduling, queueing and ingest: this times the engine on a ready batch, one batch at a time"]
    if any("openvino-int8" == c for c in builds):
        not_measured.append("openvino int8 calibrated here on 10 frames per model (NNCF) in a private cache: "
                            "the values differ from `vlora-va models calibrate`'s 50, the cost does not")
    files = {n: sum((p / f).stat().st_size for f in ADAPTER_FILES) for n, p in {"detect": SOURCE}.items()}
    res = {"meta": {**meta, "wall_s": round(time.perf_counter() - t_start), "quiet_cores": QUIET_CORES,
                    "min_quiet": MIN_QUIET},
           "results": rows, "best": best(rows),
           "memory": {"files_mb_per_adapter": round(files["detect"] / 2**20, 2),
                      "lora_mb": round((SOURCE / "adapter_model.safetensors").stat().st_size / 2**20, 2),
                      "head_mb": round((SOURCE / "head.safetensors").stat().st_size / 2**20, 2)},
           "builds": builds, "not_measured": not_measured}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "per_camera_adapters.json").write_text(json.dumps(res, indent=1) + "\n")
    (out_dir / "per_camera_adapters.md").write_text(markdown(res))
    plot(res, out_dir / "per_camera_adapters.png")
    print(markdown(res))
    log(f"wrote {out_dir / 'per_camera_adapters'}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
