"""`vlora-va tune`: profile the ATMM configurations per shape bucket on this device and write its table
(kernels/tuned.py reads it at run time): a CPU strategy name, or a Triton tile config, per bucket.
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
from vlora_va.kernels.tuned import _TABLES, bucket_key, device_kind, user_table_dir

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
                 dtype=torch.float32, device="cpu"):
    """Random x, y, slot stacks (zero past each rank) and Segments for one composition."""
    S, R = len(slot_ranks), max(slot_ranks)
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


def triton_candidates() -> list:
    from vlora_va.kernels.triton_atmm import TileConfig, TritonConfig
    shrink = [TileConfig(m, n, k, w, st) for m in (16, 32, 64) for n in (16, 32) for k in (32, 64, 128)
              for w, st in ((4, 2), (4, 3))]
    expand = [TileConfig(m, n, k, w, st) for m in (16, 32, 64) for n in (32, 64, 128) for k in (16, 32)
              for w, st in ((4, 2), (4, 3), (8, 2))]
    # tune the two kernels' tiles independently of each other is not possible through one launcher, so
    # pair them; keep the grid small (the product is too large) by pairing index-wise plus the default.
    n = max(len(shrink), len(expand))
    return [TritonConfig(shrink[i % len(shrink)], expand[i % len(expand)]) for i in range(n)]


def _pick(times: dict, default, margin: float = 0.05):
    """Fastest candidate, but keep the rule-based default unless another beats it by > margin (noise)."""
    best = min(times, key=times.get)
    if default in times and times[best] > (1 - margin) * times[default]:
        return default
    return best


def tune(shapes: list[tuple[int, int]], grid, device: str = "cpu", repeats: int = 5, tokens: int = 257,
         dtype=torch.float32, log=print) -> dict:
    """Time every candidate on every (shape, composition); return the table (kind, entries)."""
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
            cands = triton_candidates() if cuda else cpu_candidates(seg)
            fns = {(json.dumps(c.to_json()) if cuda else c):
                   (lambda c=c: atmm(y, x, A, B, seg, 1.0, slot_ranks, config=c)) for c in cands}
            times = time_calls(fns, repeats, sync=sync)
            best = _pick(times, None if cuda else cpu.default_strategy(seg))
            prev = entries.get(key)  # several compositions may share a bucket: keep the per-bucket sum
            if prev:
                for c, t in times.items():
                    prev["us"][c] = prev["us"].get(c, 0.0) + t * 1e6
                best = _pick(prev["us"], None if cuda else cpu.default_strategy(seg))
                prev["choice"] = json.loads(best) if cuda else best
            else:
                entries[key] = {"choice": json.loads(best) if cuda else best,
                                "us": {c: round(t * 1e6, 1) for c, t in times.items()}, "example": label}
            done += 1
            el = time.perf_counter() - t_start
            log(f"[{done}/{total}] {n_in}x{n_out} {label}: best {best if not cuda else 'cfg'} "
                f"({times[best] * 1e6:.0f} us)  elapsed {el:.0f}s, eta {el / done * (total - done):.0f}s")
    for e in entries.values():
        e["us"] = {c: round(t, 1) for c, t in e["us"].items()}
    return {"device_kind": kind, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "dtype": str(dtype).removeprefix("torch."), "tokens_per_image": tokens,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "entries": entries}


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
        unknown = [m for m in mixes if m not in MIXES]
        if unknown:
            raise ValueError(f"--mixes: unknown mix {unknown[0]!r} (known: {', '.join(MIXES)})")
        for name in ("hidden", "mlp", "tokens", "repeats"):
            if getattr(a, name) < 1:
                raise ValueError(f"--{name}: must be a positive integer, got {getattr(a, name)}")
        device = torch.device(a.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {a.device}: no CUDA device here")
    except (ValueError, RuntimeError) as e:
        p.error(str(e))
    if a.threads:
        torch.set_num_threads(a.threads)
    grid = composition_grid(a.tokens, images, adapters, ranks, mixes)
    shapes = [(a.hidden, a.hidden), (a.hidden, a.mlp), (a.mlp, a.hidden)]
    table = tune(shapes, grid, a.device, a.repeats, a.tokens,
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    out = a.out or user_table_dir() / f"{table['device_kind']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1, sort_keys=True))
    _TABLES.pop(table["device_kind"], None)
    print(f"wrote {out} ({len(table['entries'])} buckets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
