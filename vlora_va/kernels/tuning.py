"""`vlora-va tune`: profile the ATMM configurations per shape bucket on this device and write its table
(kernels/tuning_tables.py reads it at run time): a CPU strategy name, or a Triton tile config, per bucket.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from vlora_va.kernels import cpu
from vlora_va.kernels.segments import Segments
from vlora_va.kernels.tuning_tables import _TABLES, bucket_key, device_kind, images_key, user_table_dir

# ---- the tuner ------------------------------------------------------------------------------------
MIXES = ("uniform", "skewed", "shuffled")  # how a batch's images are spread over its adapters (composition_grid)


def composition_grid(tokens: int, images: list[int], adapters: list[int], ranks: list[list[int]],
                     mixes: list[str]) -> list[tuple[list[int], list[int], str]]:
    """Batch compositions: (per-image slot list, per-slot ranks, label). 'uniform' spreads images evenly
    over adapters in order (grouped); 'skewed' gives half the images to adapter 0; 'shuffled' interleaves
    adapters image by image (ungrouped)."""
    out = []
    for n_img in images:
        for n_ad in adapters:
            if n_ad > n_img:
                continue
            for rk in ranks:
                slot_ranks = [rk[i % len(rk)] for i in range(n_ad)]
                for mix in mixes:
                    if mix == "skewed":
                        head = max(1, n_img // 2)
                        slots = [0] * head + [1 + i % max(1, n_ad - 1) if n_ad > 1 else 0 for i in range(n_img - head)]
                        slots.sort()
                    elif mix == "shuffled":
                        slots = [i % n_ad for i in range(n_img)]
                    else:
                        slots = sorted(i * n_ad // n_img for i in range(n_img))
                    out.append((slots, slot_ranks, f"{n_img}img/{n_ad}ad/r{'-'.join(map(str, rk))}/{mix}"))
    return out


def make_problem(n_in: int, n_out: int, slots: list[int], slot_ranks: list[int], tokens: int,
                 dtype=torch.float32, device="cpu", max_rank: int | None = None):
    """Random x, y, slot stacks (zero past each rank; max_rank wide, default the largest rank) and Segments for
    one composition."""
    S, R = len(slot_ranks), max_rank or max(slot_ranks)
    g = torch.Generator().manual_seed(0)
    A = torch.zeros(S, R, n_in, dtype=dtype)
    B = torch.zeros(S, n_out, R, dtype=dtype)
    for s, r in enumerate(slot_ranks):
        A[s, :r] = torch.randn(r, n_in, generator=g) / math.sqrt(n_in)
        B[s, :, :r] = torch.randn(n_out, r, generator=g) / math.sqrt(r)
    x = torch.randn(len(slots) * tokens, n_in, generator=g).to(dtype)
    y = torch.zeros(x.shape[0], n_out, dtype=dtype)
    seg = Segments.from_elements(slots, tokens)
    return [t.to(device) for t in (y, x, A, B)] + [seg]


def time_calls(fns: dict, repeats: int, warmup: int = 1, sync=None, min_sample_s: float = 0.002) -> dict:
    """Median seconds per call of each candidate. Candidates are interleaved (every round times each once,
    in a fresh random order) so bursts of load from other processes hit them alike; a sample loops short
    calls until it lasts min_sample_s."""
    def sample(f, n):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        if sync:
            sync()
        return (time.perf_counter() - t0) / n

    n = {}
    for k, f in fns.items():
        for _ in range(warmup):
            f()
        n[k] = max(1, int(min_sample_s / max(sample(f, 1), 1e-7)))
    ts = {k: [] for k in fns}
    order = list(fns)
    for _ in range(repeats):
        random.shuffle(order)
        for k in order:
            ts[k].append(sample(fns[k], n[k]))
    return {k: statistics.median(v) for k, v in ts.items()}


def cpu_candidates(seg: Segments) -> list[str]:
    # 'grouped' is the same code as 'runs' on grouped batches: only time it where it differs.
    return [s for s in cpu.STRATEGIES if not (s == "grouped" and seg.is_grouped)]


def triton_tiles() -> tuple[list, list]:
    """The tile candidates of each Triton kernel: (shrink, expand). Tiles stay >= 16 (tensor cores)."""
    from vlora_va.kernels.triton_atmm import TileConfig
    shrink = [TileConfig(m, n, k, w, 2) for m in (16, 32, 64, 128) for n in (16, 32) for k in (32, 64, 128)
              for w in (4, 8)]
    expand = [TileConfig(m, n, k, w, st) for m in (16, 32, 64, 128) for n in (32, 64, 128) for k in (16, 32)
              for w, st in ((4, 2), (8, 2))]
    return shrink, expand


def _sync(device):
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else None


def tune_triton(make_call, sync, tiles: tuple[list, list] | None = None) -> tuple[object, dict]:
    """The two kernels' tiles, one kernel at a time: every shrink tile with the default expand, then every expand
    tile with the best shrink (the kernels run one after the other, so their times add and each has its own
    best tile; timing every pair would be 3,000 candidates). make_call(config) -> a no-argument call.
    Returns (the choice, microseconds per candidate timed)."""
    from vlora_va.kernels.triton_atmm import DEFAULT_CONFIG, TritonConfig
    shrinks, expands = tiles or triton_tiles()
    us = {}

    def stage(configs):
        times = time_calls({json.dumps(c.to_json()): make_call(c) for c in configs}, 3, sync=sync)
        us.update({k: round(t * 1e6, 1) for k, t in times.items()})
        return json.loads(_pick(times, json.dumps(DEFAULT_CONFIG.to_json())))

    best = stage([TritonConfig(t, DEFAULT_CONFIG.expand) for t in shrinks] + [DEFAULT_CONFIG])
    best = stage([TritonConfig.from_json(best)] + [TritonConfig(TritonConfig.from_json(best).shrink, t)
                                                    for t in expands])
    return best, us


def _pick(times: dict, default, margin: float = 0.05):
    """Fastest candidate, but keep the rule-based default unless another beats it by > margin (noise)."""
    best = min(times, key=times.get)
    if default in times and times[best] > (1 - margin) * times[default]:
        return default
    return best


def tune(shapes: list[tuple[int, int]], grid, device: str = "cpu", repeats: int = 5, tokens: int = 257,
         dtype=torch.float32, log=print) -> dict:
    """Time every candidate on every (shape, composition); return the table (kind, entries). On a GPU each
    bucket is tuned once (its first composition), tile by tile (tune_triton)."""
    from vlora_va.kernels.ops import atmm
    device = torch.device(device)
    kind = device_kind(device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    entries: dict[str, dict] = {}
    total, done, t_start = len(shapes) * len(grid), 0, time.perf_counter()
    for n_in, n_out in shapes:
        for slots, slot_ranks, label in grid:
            y, x, A, B, seg = make_problem(n_in, n_out, slots, slot_ranks, tokens, dtype, device)
            key = bucket_key(n_in, n_out, seg, slot_ranks)
            done += 1
            if cuda:
                if key not in entries:
                    best, us = tune_triton(lambda c: lambda: atmm(y, x, A, B, seg, 1.0, slot_ranks, config=c), sync)
                    entries[key] = {"choice": best, "us": us, "example": label}
                    log(f"[{done}/{total}] {n_in}x{n_out} {label}: {best} ({us[json.dumps(best)]:.0f} us)")
                continue
            times = time_calls({c: (lambda c=c: atmm(y, x, A, B, seg, 1.0, slot_ranks, config=c))
                                for c in cpu_candidates(seg)}, repeats)
            prev = entries.get(key)  # several compositions may share a bucket: keep the per-bucket sum
            if prev:
                for c, t in times.items():
                    prev["us"][c] = prev["us"].get(c, 0.0) + t * 1e6
                prev["choice"] = _pick(prev["us"], cpu.default_strategy(seg))
            else:
                entries[key] = {"choice": _pick(times, cpu.default_strategy(seg)),
                                "us": {c: round(t * 1e6, 1) for c, t in times.items()}, "example": label}
            el = time.perf_counter() - t_start
            log(f"[{done}/{total}] {n_in}x{n_out} {label}: best {entries[key]['choice']} "
                f"({min(times.values()) * 1e6:.0f} us)  elapsed {el:.0f}s, eta {el / done * (total - done):.0f}s")
    for e in entries.values():
        e["us"] = {c: round(t, 1) for c, t in e["us"].items()}
    return {"device_kind": kind, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "dtype": str(dtype).removeprefix("torch."), "tokens_per_image": tokens,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "entries": entries}


def tune_images(shapes: list[tuple[int, int]], images: list[int], tokens: int, ranks: list[int], max_rank: int,
                device: str, dtype, log=print, tiles=None) -> dict:
    """The Triton tiles of the fixed per-image layout (kernels/images.py: one run of `tokens` rows per image,
    what CUDA graphs replay) per (shape, images bucket), with the engine's stacks (`max_rank` wide, each slot's
    own rank in `ranks`): entries keyed by tuning_tables.images_key."""
    from vlora_va.kernels.triton_atmm import launch
    entries = {}
    for n_in, n_out in shapes:
        for n in images:
            slots = sorted(i * len(ranks) // n for i in range(n))
            y, x, A, B, _ = make_problem(n_in, n_out, slots, ranks, tokens, dtype, device, max_rank)
            slot = torch.tensor(slots, dtype=torch.int32, device=device)
            length = torch.full((n,), tokens, dtype=torch.int32, device=device)
            start = torch.arange(n, dtype=torch.int32, device=device) * tokens
            scale = torch.ones(len(ranks), dtype=torch.float32, device=device)
            rk = torch.tensor(ranks, dtype=torch.int32, device=device)
            h = torch.empty(x.shape[0], A.shape[1], dtype=torch.float32, device=device)
            best, us = tune_triton(lambda c: lambda: launch(y, x, A, B, start, length, slot, scale, rk, n, tokens,
                                                            config=c, h=h), _sync(device), tiles)
            key = images_key(n_in, n_out, n, tokens, A.shape[1])
            entries[key] = {"choice": best, "us": us, "example": f"{n}img/{len(ranks)}ad/r{max(ranks)}"}
            log(f"{key}: {best} ({us[json.dumps(best)]:.0f} us)")
    return entries


VIT_S_SHAPES = [(384, 384), (384, 1536), (1536, 384)]


def _positive_ints(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{option}: expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    """`vlora-va tune`: profile ATMM on this device and write kernels/tables/<device kind>.json."""
    p = argparse.ArgumentParser(prog="vlora-va tune", description=main.__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--hidden", type=int, default=384, help="backbone hidden size (ViT-S: 384)")
    p.add_argument("--mlp", type=int, default=1536, help="MLP width (ViT-S: 1536)")
    p.add_argument("--tokens", type=int, default=257, help="tokens per image (224 px, patch 14: 257)")
    p.add_argument("--images", default="1,2,4,8,16,32")
    p.add_argument("--adapters", default="1,2,4,8")
    p.add_argument("--ranks", default="8;16;32;64;8,16,32,64", help="';'-separated rank sets (',' = mixed)")
    p.add_argument("--mixes", default=",".join(MIXES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads while tuning (0: torch's default); "
                   "use the inference thread count the daemon will run with")
    p.add_argument("--quick", action="store_true", help="small grid (about a minute on 2 cores)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="activations' dtype (auto: bfloat16 on CUDA, what the daemon runs there; float32 on a CPU)")
    p.add_argument("--max-rank", type=int, default=64, help="the engine's LoRA stack width (daemon.max_rank)")
    p.add_argument("--layouts", default="runs,images",
                   help="runs: the batch's own runs (eager); images: one run per image, what CUDA graphs replay "
                        "(CUDA only)")
    p.add_argument("--out", type=Path, default=None,
                   help="table path (default: <user table dir>/<kind>.json, $VLORA_VA_TABLES or ~/.cache/vlora-va/tables; "
                        "found there before the shipped kernels/tables/)")
    a = p.parse_args(argv)
    if a.quick:
        a.images, a.adapters, a.ranks, a.repeats = "1,8,32", "1,4,8", "16;8,16,32,64", 3
    try:  # a bad value is the user's typo: say which, never a traceback
        images, adapters = _positive_ints(a.images, "--images"), _positive_ints(a.adapters, "--adapters")
        ranks = [_positive_ints(rs, "--ranks") for rs in a.ranks.split(";")]
        mixes = a.mixes.split(",")
        layouts = a.layouts.split(",")
        if not set(layouts) <= {"runs", "images"}:
            raise ValueError(f"--layouts: expected runs and/or images, got {a.layouts!r}")
        unknown = [m for m in mixes if m not in MIXES]
        if unknown:
            raise ValueError(f"--mixes: unknown mix {unknown[0]!r} (known: {', '.join(MIXES)})")
        for name in ("hidden", "mlp", "tokens", "repeats", "max_rank"):
            if getattr(a, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(a, name)}")
        device = torch.device(a.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {a.device}: no CUDA device here")
    except (ValueError, RuntimeError) as e:
        p.error(str(e))
    if a.threads:
        torch.set_num_threads(a.threads)
    grid = composition_grid(a.tokens, images, adapters, ranks, mixes)
    shapes = [(a.hidden, a.hidden), (a.hidden, a.mlp), (a.mlp, a.hidden)]
    dtype = getattr(torch, a.dtype if a.dtype != "auto" else "bfloat16" if device.type == "cuda" else "float32")
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    table = tune(shapes, grid if "runs" in layouts else [], a.device, a.repeats, a.tokens, dtype, log=say)
    if "images" in layouts and device.type == "cuda":
        for rk in ranks:
            table["entries"].update(tune_images(shapes, images, a.tokens, [max(rk)] * max(adapters), a.max_rank,
                                                a.device, dtype, log=say))
    out = a.out or user_table_dir() / f"{table['device_kind']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file():  # another backbone's shapes tuned earlier on this device: keep them
        old = json.loads(out.read_text())
        if old.get("device_kind") == table["device_kind"]:
            table["entries"] = {**old.get("entries", {}), **table["entries"]}
    out.write_text(json.dumps(table, indent=1, sort_keys=True))
    _TABLES.pop(table["device_kind"], None)
    print(f"wrote {out} ({len(table['entries'])} buckets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
