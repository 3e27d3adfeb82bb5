"""The tuning tables: per device kind (``kernels/tables/<kind>.json``), the best ATMM choice per shape bucket,
measured by `vlora-va tune` (kernels/tuning.py). Lookup is one dict access (memoised per batch layout); shapes
the table has not seen get a rule-based default.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
from pathlib import Path

import torch

from vlora_va.kernels.segments import Segments

TABLE_DIR = Path(__file__).parent / "tables"  # shipped tables
_TABLES: dict[str, dict] = {}
log = logging.getLogger(__name__)
# CPU capabilities from the widest vectors down: a CPU without its own table borrows the nearest one's
CAPABILITIES = ["avx512", "avx2", "default"]


def user_table_dir() -> Path:
    """Where `vlora-va tune` writes tables measured on this machine: $VLORA_VA_TABLES, else
    ~/.cache/vlora-va/tables. Checked before the shipped ones."""
    return Path(os.environ.get("VLORA_VA_TABLES", Path.home() / ".cache" / "vlora-va" / "tables"))


@functools.lru_cache(maxsize=None)
def _device_kind(device: str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return "cuda-" + "-".join(name.lower().replace("_", " ").split())
    cap = torch.backends.cpu.get_cpu_capability().lower()
    return f"cpu-{platform.machine().lower()}-{cap}"


def device_kind(device: torch.device | str | None = None) -> str:
    """'cpu-x86_64-avx512' or 'cuda-nvidia-h100-80gb-hbm3': what a table is valid for (cached)."""
    return _device_kind(str(device or "cpu"))


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << math.ceil(math.log2(n))


def bucket_key(n_in: int, n_out: int, seg: Segments, ranks: list[int]) -> str:
    """Shape bucket: layer dims exact; rows, runs and max rank rounded up to powers of two."""
    used = seg.used_slots
    rmax = max((ranks[s] for s in used), default=0)
    return (f"{n_in}x{n_out}/rows{_pow2(seg.n_rows)}/runs{_pow2(seg.n_runs)}/ad{_pow2(len(used))}"
            f"/r{_pow2(rmax)}/{'g' if seg.is_grouped else 'u'}")


def images_key(n_in: int, n_out: int, n_images: int, tokens: int, max_rank: int) -> str:
    """Bucket of the fixed per-image layout (kernels/images.py, what CUDA graphs replay): its launch depends
    only on these, never on which adapter each image takes."""
    return f"images/{n_in}x{n_out}/n{_pow2(n_images)}/t{tokens}/R{max_rank}"


def lookup_images(kind: str, n_in: int, n_out: int, n_images: int, tokens: int, max_rank: int):
    """The table's choice for the per-image layout (None: the table has none). Called while a plan is captured
    or, eagerly, once per layer: one dict access."""
    entry = load_table(kind)["entries"].get(images_key(n_in, n_out, n_images, tokens, max_rank))
    return entry["choice"] if entry else None


def table_path(kind: str) -> Path:
    """The shipped table of a kind."""
    return TABLE_DIR / f"{kind}.json"


def nearest_kind(kind: str, available: list[str]) -> str | None:
    """The available kind closest to `kind`: same processor family, the nearest vector capability (narrower
    first: code tuned for wider vectors than the CPU has can pick strategies that lose there)."""
    if not kind.startswith("cpu-"):
        return None
    arch, cap = kind.rsplit("-", 1)
    if cap not in CAPABILITIES:
        return None
    i = CAPABILITIES.index(cap)
    for other in CAPABILITIES[i + 1:] + CAPABILITIES[:i][::-1]:
        if f"{arch}-{other}" in available:
            return f"{arch}-{other}"
    return None


def load_table(kind: str) -> dict:
    """The table for a device kind: this machine's own (`vlora-va tune`), else the shipped one, else the
    nearest kind's with a warning (once), else none (every shape gets the rule-based default, also said)."""
    if kind in _TABLES:
        return _TABLES[kind]
    for p in (user_table_dir() / f"{kind}.json", table_path(kind)):
        if p.is_file():
            _TABLES[kind] = json.loads(p.read_text())
            return _TABLES[kind]
    available = sorted(p.stem for d in (user_table_dir(), TABLE_DIR) if d.is_dir() for p in d.glob("*.json"))
    near = nearest_kind(kind, available)
    if near is not None:
        log.warning("no ATMM tuning table for %s: using %s's (run `vlora-va tune` to measure this machine)", kind, near)
        _TABLES[kind] = load_table(near)
    else:
        log.warning("no ATMM tuning table for %s: rule-based choices (run `vlora-va tune` to measure this machine)",
                    kind)
        _TABLES[kind] = {"entries": {}}
    return _TABLES[kind]


def lookup(kind: str, n_in: int, n_out: int, seg: Segments, ranks: list[int]):
    """The table's choice for this shape bucket on a device kind (None: the table has none). Memoised on the Segments object (one per forward), so each layer shape is bucketed once."""
    memo_key = ("choice", kind, n_in, n_out, tuple(ranks[s] for s in seg.used_slots))
    if memo_key in seg._cache:
        return seg._cache[memo_key]
    entry = load_table(kind)["entries"].get(bucket_key(n_in, n_out, seg, ranks))
    seg._cache[memo_key] = entry["choice"] if entry else None
    return seg._cache[memo_key]
