"""ATMM benchmark (issue 4): the LoRA part alone vs peft / dLoRA-style einsum / naive loop / fixed config,
the whole ViT-S/14 backbone vs merged weights, and the one-shot ΔW vs a per-layer loop.

    python bench/atmm.py                 # quick grid, ~3 minutes on 2 cores
    python bench/atmm.py --full          # bigger grid, batch 8 and 32 backbone forwards

Timings are medians over repeats, taken interleaved (every method once per round) so that load from other
processes hits all methods alike; compare ratios within one run. Writes bench/results/atmm.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vlora_va import kernels  # noqa: E402
from vlora_va.engine import lora  # noqa: E402
from vlora_va.kernels import cpu, tuning, tuning_tables  # noqa: E402

TOKENS = 257  # 224 px, patch 14: 16x16 patches + CLS
QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = QKVO + ["fc1", "fc2"]
FIXED_STRATEGY = "runs"  # the static baseline: one CPU strategy for every shape


def interleaved(fns: dict, repeats: int, warmup: int = 1, min_sample_s: float = 0.005) -> dict[str, float]:
    """Median seconds per call for each method. Every round runs every method once, in a fresh random
    order, so load from other processes hits all methods alike; a sample loops short calls until it lasts
    min_sample_s."""
    n = {}
    for k, f in fns.items():
        for _ in range(warmup):
            f()
        t0 = time.perf_counter()
        f()
        n[k] = max(1, int(min_sample_s / max(time.perf_counter() - t0, 1e-7)))
    ts = {k: [] for k in fns}
    order = list(fns)
    for _ in range(repeats):
        random.shuffle(order)
        for k in order:
            t0 = time.perf_counter()
            for _ in range(n[k]):
                fns[k]()
            ts[k].append((time.perf_counter() - t0) / n[k])
    return {k: statistics.median(v) for k, v in ts.items()}


# ---- baselines for the LoRA part ----------------------------------------------------------------
def naive_per_request(y, x, A, B, slots, ranks, scale, tokens):
    """One request (image) at a time, out-of-place, as a straightforward server loop would."""
    for i, a in enumerate(slots):
        if a < 0:
            continue
        r = ranks[a]
        rows = slice(i * tokens, (i + 1) * tokens)
        y[rows] += (x[rows] @ A[a, :r].T @ B[a, :, :r].T) * scale[a]


def make_einsum(A, B, slots, scale, tokens, n_rows):
    """dLoRA-style: every adapter on every row (padded to the max rank), selected by a one-hot mask."""
    used = sorted(set(s for s in slots if s >= 0))
    Au, Bu = A[used], B[used]  # [U, R, in], [U, out, R] (gathered once, as a resident adapter set)
    onehot = torch.zeros(len(used), n_rows, dtype=A.dtype, device=A.device)
    for i, a in enumerate(slots):
        if a >= 0:
            onehot[used.index(a), i * tokens:(i + 1) * tokens] = scale[a]

    def run(y, x):
        h = torch.einsum("ni,uri->unr", x, Au) * onehot[:, :, None]
        y += torch.einsum("unr,uor->no", h, Bu)
    return run


def make_peft_layer(n_in, n_out, A, B, ranks, scale):
    """A peft LoRA Linear holding every slot as a named adapter; call with adapter_names=."""
    import peft
    holder = nn.Sequential()
    holder.add_module("lin", nn.Linear(n_in, n_out))
    pm = None
    for s, r in enumerate(ranks):
        cfg = peft.LoraConfig(r=r, lora_alpha=scale[s] * r, target_modules=["lin"])
        if pm is None:
            pm = peft.get_peft_model(holder, cfg, adapter_name=f"s{s}")
        else:
            pm.add_adapter(f"s{s}", cfg)
        layer = pm.base_model.model.lin
        layer.lora_A[f"s{s}"].weight.data.copy_(A[s, :r])
        layer.lora_B[f"s{s}"].weight.data.copy_(B[s, :, :r])
    return pm.base_model.model.lin.eval()


# ---- op-level grid ------------------------------------------------------------------------------
def op_grid(full: bool):
    comps = [  # (images, adapters, ranks, mix)
        (1, 1, [16], "uniform"), (8, 4, [16], "uniform"), (8, 4, [16], "skewed"), (8, 4, [16], "shuffled"),
        (8, 8, [8, 16, 32, 64], "uniform"), (32, 4, [16], "uniform"), (32, 8, [8, 16, 32, 64], "skewed"),
        (32, 8, [8, 16, 32, 64], "shuffled"),
    ]
    if full:
        comps += [(4, 2, [8], "uniform"), (16, 4, [64], "uniform"), (16, 8, [16], "shuffled"),
                  (32, 1, [64], "uniform"), (32, 4, [8, 64], "skewed"), (2, 2, [32], "shuffled")]
    out = []
    for n_img, n_ad, rk, mix in comps:
        grid = tuning.composition_grid(TOKENS, [n_img], [n_ad], [rk], [mix])
        out += grid
    return out


def bench_ops(repeats: int, full: bool, log) -> list[dict]:
    shapes = [(384, 384), (384, 1536), (1536, 384)]
    rows = []
    comps = op_grid(full)
    for n_in, n_out in shapes:
        for slots, slot_ranks, label in comps:
            y, x, A, B, seg = tuning.make_problem(n_in, n_out, slots, slot_ranks, TOKENS)
            scale = [2.0] * len(slot_ranks)
            peft_layer = make_peft_layer(n_in, n_out, A, B, slot_ranks, scale)
            base = peft_layer.base_layer
            x3 = x.view(len(slots), TOKENS, n_in)
            names = [f"s{s}" for s in slots]
            einsum = make_einsum(A, B, slots, scale, TOKENS, x.shape[0])
            choice = cpu.lookup(n_in, n_out, seg, slot_ranks)
            with torch.no_grad():
                fns = {
                    "atmm": lambda: kernels.atmm(y, x, A, B, seg, scale, slot_ranks),
                    "atmm_fixed": lambda: kernels.atmm(y, x, A, B, seg, scale, slot_ranks, config=FIXED_STRATEGY),
                    "naive": lambda: naive_per_request(y, x, A, B, slots, slot_ranks, scale, TOKENS),
                    "einsum": lambda: einsum(y, x),
                    "peft_layer": lambda: peft_layer(x3, adapter_names=names),
                    "linear": lambda: base(x3),
                }
                t = interleaved(fns, repeats, min_sample_s=0.02)
            t["peft"] = max(t.pop("peft_layer") - t["linear"], 1e-7)
            r = {"shape": f"{n_in}x{n_out}", "batch": label, "rows": x.shape[0], "choice": choice,
                 "us": {k: round(v * 1e6, 1) for k, v in t.items()}}
            r["speedup"] = {k: round(t[k] / t["atmm"], 2) for k in ("peft", "einsum", "naive", "atmm_fixed")}
            rows.append(r)
            log(f"  {r['shape']:>9} {label:<32} atmm {r['us']['atmm']:8.0f} us ({choice})  x vs peft "
                f"{r['speedup']['peft']:5.2f} einsum {r['speedup']['einsum']:5.2f} naive {r['speedup']['naive']:5.2f} "
                f"fixed {r['speedup']['atmm_fixed']:4.2f}")
    return rows


# ---- whole backbone -----------------------------------------------------------------------------
def vit_s() -> nn.Module:
    from transformers import Dinov2Config, Dinov2Model
    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                       patch_size=14, image_size=224)
    return Dinov2Model(cfg).eval()


def targets_here(model, targets) -> list[str]:
    """The target entries as the installed transformers names the layers (q_proj -> query before 5.18): without
    this, an older transformers would get LoRA on fc1/fc2 only (seen on the GPU machine, transformers 5.17)."""
    from vlora_va.engine.adapters import fit_target_modules
    from vlora_va.engine.backbones import linear_names

    return fit_target_modules(targets, linear_names(model))


def random_adapters(model, targets, ranks, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in ranks:
        w = {n: (torch.randn(r, m.in_features, generator=g) * 0.01, torch.randn(m.out_features, r, generator=g) * 0.01)
             for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in targets)}
        out.append(w)
    return out


def with_atmm(base, targets, ranks, max_rank=64, premerge=False):
    targets = targets_here(base, targets)
    m = copy.deepcopy(base)
    ctx = lora.inject_lora(m, targets, num_slots=len(ranks), max_rank=max_rank)
    for s, w in enumerate(random_adapters(base, targets, ranks)):
        lora.load_adapter(m, s, w, 2.0)
    if premerge:  # the engine's CPU default: per-slot W + ΔW, each adapter's rows through its own weights
        lora.enable_premerge(m)
    return m, ctx


def with_peft(base, targets, ranks):
    import peft
    pm = None
    for s, r in enumerate(ranks):
        cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, init_lora_weights=False)
        pm = peft.get_peft_model(copy.deepcopy(base), cfg, adapter_name=f"s{s}") if pm is None else pm
        if s:
            pm.add_adapter(f"s{s}", cfg)
    return pm.eval()


def bench_backbone(batches: list[int], repeats: int, with_peft_runs: bool, log) -> list[dict]:
    base = vit_s()
    variants = {  # name: (targets, ranks)
        "qkvo_4ad_r16": (QKVO, [16] * 4),
        "all_4ad_r16": (ALL, [16] * 4),
        "qkvo_8ad_r8-64": (QKVO, [8, 16, 32, 64, 8, 16, 32, 64]),
        "all_8ad_r8-64": (ALL, [8, 16, 32, 64, 8, 16, 32, 64]),
    }
    models = {f"atmm_{k}": with_atmm(base, t, r) for k, (t, r) in variants.items()}
    models.update({f"premerged_{k}": with_atmm(base, t, r, premerge=True) for k, (t, r) in variants.items()})
    peft_models = {k: with_peft(base, variants[k][0], variants[k][1]) for k in ("qkvo_4ad_r16", "all_4ad_r16")} \
        if with_peft_runs else {}
    rows = []
    for batch in batches:
        x = torch.randn(batch, 3, 224, 224)
        fns = {"merged": lambda: base(pixel_values=x)}
        for k, (m, ctx) in models.items():
            n_ad = len(variants[k.split("_", 1)[1]][1])
            slots = torch.tensor(sorted(i * n_ad // batch for i in range(batch)))  # grouped by adapter

            mode = lora.LoRAMode(lora.PREMERGED if k.startswith("premerged") else lora.UNMERGED)

            def run(m=m, ctx=ctx, slots=slots, mode=mode):
                ctx.begin(mode, slots)
                return m(pixel_values=x)
            fns[k] = run
        for k, pm in peft_models.items():
            n_ad = len(variants[k][1])
            names = [f"s{i * n_ad // batch}" for i in range(batch)]
            fns[f"peft_{k}"] = lambda pm=pm, names=names: pm(pixel_values=x, adapter_names=names)
        log(f"  backbone batch {batch}: {len(fns)} variants x {repeats} rounds ...")
        with torch.no_grad():
            t = interleaved(fns, repeats)
        for k, v in t.items():
            rows.append({"batch": batch, "variant": k, "ms": round(v * 1e3, 1),
                         "overhead_pct": round(100 * (v / t["merged"] - 1), 1)})
            log(f"    {k:<24} {v * 1e3:8.1f} ms  {100 * (v / t['merged'] - 1):+6.1f}% vs merged")
    return rows


def bench_delta(repeats: int, log) -> dict:
    base = vit_s()
    m, ctx = with_atmm(base, ALL, [16] * 2)
    layers = {n: mod for n, mod in m.named_modules() if isinstance(mod, lora.LoRALinear)}

    def loop():  # per-layer Python loop of small ops
        return {n: 2.0 * mod.lora_B[1, :, :16] @ mod.lora_A[1, :16] for n, mod in layers.items()}
    peft_m = with_peft(base, ALL, [16])
    with torch.no_grad():
        t = interleaved({"grouped_bmm": lambda: lora.slot_delta_weights(m, 1), "per_layer_loop": loop,
                         "merge_slot": lambda: lora.merge_slot(m, 1), "unmerge": lambda: lora.unmerge(m),
                         "peft_merge": peft_m.merge_adapter, "peft_unmerge": peft_m.unmerge_adapter}, repeats)
    r = {k: round(v * 1e3, 2) for k, v in t.items()}
    r["layers"] = len(layers)
    log(f"  ΔW all {len(layers)} layers: grouped {r['grouped_bmm']} ms vs per-layer loop {r['per_layer_loop']} ms; "
        f"merge {r['merge_slot']} / unmerge {r['unmerge']} ms (peft {r['peft_merge']} / {r['peft_unmerge']} ms)")
    return r


# ---- report -------------------------------------------------------------------------------------
def summarize(ops: list[dict]) -> dict:
    med = lambda v: round(statistics.median(v), 2)  # noqa: E731
    s = {f"median_x_vs_{k}": med([r["speedup"][k] for r in ops]) for k in ("peft", "einsum", "naive", "atmm_fixed")}
    s["median_x_vs_best_of_einsum_naive"] = med([min(r["speedup"]["einsum"], r["speedup"]["naive"]) for r in ops])
    s["min_x_vs_any_baseline"] = round(min(min(r["speedup"][k] for k in ("peft", "einsum", "naive")) for r in ops), 2)
    # Adaptive vs fixed: where the table picks the fixed strategy both run identical code (ratio = noise).
    other = [r["speedup"]["atmm_fixed"] for r in ops if r["choice"] != FIXED_STRATEGY]
    s["adaptive_points_other_choice"] = len(other)
    s["median_x_vs_fixed_where_choice_differs"] = med(other) if other else None
    same = [r["speedup"]["atmm_fixed"] for r in ops if r["choice"] == FIXED_STRATEGY]
    s["min_x_vs_fixed_same_choice"] = round(min(same, default=1.0), 2)
    return s


def markdown(res: dict) -> str:
    L = [f"# ATMM benchmark ({res['machine']})", "", f"torch {res['torch']}, {res['threads']} threads, fp32, "
         f"{TOKENS} tokens/image; medians of {res['repeats']} interleaved rounds. Ratios = baseline time / ATMM time.", ""]
    L += ["## Whole ViT-S/14 forward (224 px) vs merged weights", "", "| batch | variant | ms | vs merged |",
          "|---:|---|---:|---:|"]
    L += [f"| {r['batch']} | {r['variant']} | {r['ms']} | {r['overhead_pct']:+.1f}% |" for r in res["backbone"]]
    s = res["summary"]
    L += ["", "## LoRA part alone (per layer call)", "",
          f"Median over the grid: **{s['median_x_vs_peft']}x** faster than peft mixed batch, "
          f"{s['median_x_vs_einsum']}x vs dLoRA-style einsum, {s['median_x_vs_naive']}x vs naive per-request loop "
          f"({s['median_x_vs_best_of_einsum_naive']}x vs the better of those two), {s['median_x_vs_atmm_fixed']}x vs "
          f"the fixed '{FIXED_STRATEGY}' strategy; worst point vs peft / einsum / naive: {s['min_x_vs_any_baseline']}x.", "",
          f"Adaptive vs fixed: the table picks another strategy than '{FIXED_STRATEGY}' on {s['adaptive_points_other_choice']} "
          f"of {len(res['ops'])} points, median gain there {s['median_x_vs_fixed_where_choice_differs']}x; where it "
          f"picks '{FIXED_STRATEGY}' too, both columns time identical code, so their ratio shows the timing noise "
          f"(lowest {s['min_x_vs_fixed_same_choice']}x).", "",
          "| shape | batch | ATMM us | choice | x peft | x einsum | x naive | x fixed |", "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in res["ops"]:
        sp = r["speedup"]
        L.append(f"| {r['shape']} | {r['batch']} | {r['us']['atmm']:.0f} | {r['choice']} | {sp['peft']} | "
                 f"{sp['einsum']} | {sp['naive']} | {sp['atmm_fixed']} |")
    d = res["delta"]
    L += ["", "## Mode switch", "", f"ΔW for all {d['layers']} linear layers of one slot: grouped batched GEMM "
          f"{d['grouped_bmm']} ms vs per-layer loop {d['per_layer_loop']} ms. merge_slot {d['merge_slot']} ms, "
          f"unmerge {d['unmerge']} ms (peft merge_adapter {d['peft_merge']} ms, unmerge_adapter {d['peft_unmerge']} ms).", ""]
    return "\n".join(L)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=9, help="rounds for the op grid (backbone: --bb-repeats)")
    p.add_argument("--bb-repeats", type=int, default=7)
    p.add_argument("--batches", default="8", help="backbone batch sizes, e.g. 8,32")
    p.add_argument("--full", action="store_true", help="bigger op grid and backbone batches 8,32")
    p.add_argument("--no-peft-backbone", action="store_true", help="skip peft whole-backbone forwards")
    p.add_argument("--skip", default="", help="comma list of parts to skip: ops,backbone,delta")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = p.parse_args(argv)
    if a.full:
        a.batches = "8,32"
    skip = set(filter(None, a.skip.split(",")))
    if a.threads:
        torch.set_num_threads(a.threads)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.time()
    res = {"machine": tuning_tables.device_kind(), "platform": platform.platform(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "repeats": a.repeats, "bb_repeats": a.bb_repeats}
    if "ops" not in skip:
        log("LoRA part alone, per layer shape and batch composition:")
        res["ops"] = bench_ops(a.repeats, a.full, log)
        res["summary"] = summarize(res["ops"])
        log(f"  summary: {res['summary']}")
    if "backbone" not in skip:
        log("Whole backbone:")
        res["backbone"] = bench_backbone([int(b) for b in a.batches.split(",")], a.bb_repeats,
                                         not a.no_peft_backbone, log)
    if "delta" not in skip:
        log("Mode switch:")
        res["delta"] = bench_delta(a.repeats, log)
    res["seconds"] = round(time.time() - t0, 1)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "atmm.json").write_text(json.dumps(res, indent=1))
    if not skip:
        (a.out / "atmm.md").write_text(markdown(res))
    log(f"done in {res['seconds']} s -> {a.out / 'atmm.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
