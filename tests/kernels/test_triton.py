"""Triton kernels under TRITON_INTERPRET=1 (CPU tensors), against the reference loop.

The interpreter must be on before the kernels are decorated, so this module sets it and (re)imports
kernels.triton_atmm itself. Shapes stay tiny: the interpreter is 500-10,000x slower than torch.
bf16 tiles are upcast to fp32 in interpreted runs (its bf16 tl.dot is wrong); on a GPU they are not.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from vlora_va.kernels import atmm_reference  # noqa: E402
from vlora_va.testing.atmm_cases import CASES, empty_run_segments, make, tol  # noqa: E402

# triton.language itself is decorated when triton is first imported, so the interpreter can only be switched
# on in a fresh process: the outer run re-runs this file in a subprocess with TRITON_INTERPRET=1.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
inner = pytest.mark.skipif(not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 subprocess")


@pytest.mark.skipif(INTERPRETED, reason="already interpreted")
def test_triton_kernels_in_interpreter_subprocess():
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"],
                       env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]


@pytest.fixture(scope="module")
def tri():
    import vlora_va.kernels.triton_atmm as mod
    return mod


def run(tri, y, x, A, B, seg_or_idx, scale, ranks, delora=None, config=None):
    """Through the public operator, forcing the Triton path on CPU tensors."""
    from vlora_va.kernels import ops
    cfg = config or tri.DEFAULT_CONFIG
    return ops.atmm(y, x, A, B, seg_or_idx, scale, ranks, delora, impl="triton", config=cfg)


@inner
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("delora", [None, 0], ids=["plain", "delora0"])
def test_triton_matches_reference(tri, case, dtype, delora):
    x, y, A, B, scale, ranks, idx = make(case, dtype)
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks, delora)
    got = run(tri, y.clone(), x, A, B, idx, scale, ranks, delora)
    torch.testing.assert_close(got.float(), want.float(), **tol(dtype))


@inner
@pytest.mark.parametrize("shrink,expand", [((16, 16, 16, 4, 2), (16, 16, 16, 4, 2)),
                                           ((64, 32, 128, 8, 3), (32, 128, 32, 8, 3))])
def test_triton_tile_configs(tri, shrink, expand):
    x, y, A, B, scale, ranks, idx = make(CASES[1])
    cfg = tri.TritonConfig(tri.TileConfig(*shrink), tri.TileConfig(*expand))
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks)
    torch.testing.assert_close(run(tri, y.clone(), x, A, B, idx, scale, ranks, config=cfg), want, **tol(torch.float32))


@inner
def test_triton_bf16_and_empty_runs(tri):
    x, y, A, B, scale, ranks, _ = make(CASES[1], torch.bfloat16)
    seg = empty_run_segments(x.shape[0])
    idx = torch.full((x.shape[0],), -1)
    for s, a, b in zip(seg.slots, seg.starts, seg.ends):
        idx[a:b] = s
    want = atmm_reference(y.clone(), x, A, B, idx, scale, ranks)
    got = run(tri, y.clone(), x, A, B, seg, scale, ranks)
    torch.testing.assert_close(got.float(), want.float(), atol=6e-2, rtol=3e-2)


def images_case(n_images=5, tokens=7, slots=(2, 0, -1, 2, 1), sit_out=(False, False, True, False, True), seed=3):
    """Per-image runs: image i uses slot slots[i]; an image that sits out (length 0) gets nothing."""
    g = torch.Generator().manual_seed(seed)
    S, R, n_in, n_out = 3, 16, 24, 40
    ranks = torch.tensor([4, 16, 8], dtype=torch.int32)
    A = torch.zeros(S, R, n_in)
    B = torch.zeros(S, n_out, R)
    for s, r in enumerate(ranks.tolist()):
        A[s, :r] = torch.randn(r, n_in, generator=g)
        B[s, :, :r] = torch.randn(n_out, r, generator=g)
    scale = torch.tensor([0.5, 2.0, 1.5])
    x = torch.randn(n_images * tokens, n_in, generator=g)
    y = torch.randn(n_images * tokens, n_out, generator=g)
    slot = torch.tensor([max(s, 0) for s in slots], dtype=torch.int32)
    length = torch.tensor([0 if out else tokens for out in sit_out], dtype=torch.int32)
    idx = torch.tensor([s if not out else -1 for s, out in zip(slots, sit_out) for _ in range(tokens)])
    return x, y, A, B, scale, ranks, slot, length, idx, tokens


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_atmm_images_cpu_torch_form_matches_the_loop(sign):
    from vlora_va.kernels import atmm_images
    x, y, A, B, scale, ranks, slot, length, idx, T = images_case()
    want = y.clone()
    delta = atmm_reference(torch.zeros_like(y), x, A, B, idx, scale, ranks)
    want += sign * delta
    got = y.clone()
    atmm_images(got, x, A, B, slot, length, scale, ranks, T, sign, impl="cpu")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@inner
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_atmm_images_triton_matches_the_loop(tri, sign):
    """The fixed-grid launch a CUDA graph replays: one run per image, zero-length runs exit at once."""
    from vlora_va.kernels import atmm_images
    x, y, A, B, scale, ranks, slot, length, idx, T = images_case()
    want = y.clone() + sign * atmm_reference(torch.zeros_like(y), x, A, B, idx, scale, ranks)
    got = y.clone()
    h = torch.empty(x.shape[0], 16)
    atmm_images(got, x, A, B, slot, length, scale, ranks, T, sign, impl="triton", h=h)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@inner
def test_the_per_image_layout_is_tuned_and_atmm_images_launches_the_tables_tiles(tri, tmp_path, monkeypatch):
    """vlora-va tune's images buckets: the tuner times each kernel's tiles, writes the choice under
    tuning_tables.images_key, and atmm_images (what CUDA graphs capture) launches with it, still matching the loop."""
    import json

    from vlora_va.kernels import atmm_images, tuning, tuning_tables

    T, n_in, n_out = 5, 16, 32
    slow = tri.TileConfig(16, 16, 16, 1, 1)  # candidate tiles: the default and one other per kernel
    tiles = ([tri.DEFAULT_CONFIG.shrink, slow], [tri.DEFAULT_CONFIG.expand, tri.TileConfig(16, 32, 16, 1, 1)])
    entries = tuning.tune_images([(n_in, n_out)], [3], T, [4, 8], 16, "cpu", torch.float32, log=lambda m: None,
                                 tiles=tiles)
    key = tuning_tables.images_key(n_in, n_out, 3, T, 16)
    assert list(entries) == [key] and set(entries[key]["us"]) >= {json.dumps(tri.DEFAULT_CONFIG.to_json())}
    # a table whose choice for this bucket is not the default: atmm_images must launch exactly that choice
    chosen = tri.TritonConfig(slow, tri.TileConfig(16, 32, 16, 1, 1))
    kind = tuning_tables.device_kind("cpu")
    (tmp_path / f"{kind}.json").write_text(json.dumps({"device_kind": kind, "entries": {
        key: {"choice": chosen.to_json()}}}))
    monkeypatch.setenv("VLORA_VA_TABLES", str(tmp_path))
    monkeypatch.setattr(tuning_tables, "_TABLES", {})
    tri._images_config.cache_clear()
    launched = []
    real = tri.launch
    monkeypatch.setattr(tri, "launch", lambda *a, **k: (launched.append(k["config"]), real(*a, **k))[1])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3 * T, n_in, generator=g)
    A, B = torch.randn(2, 16, n_in, generator=g), torch.randn(2, n_out, 16, generator=g)
    A[0, 4:] = 0
    B[0, :, 4:] = 0
    A[1, 8:] = 0
    B[1, :, 8:] = 0
    slot, length = torch.tensor([1, 0, 1], dtype=torch.int32), torch.tensor([T, T, 0], dtype=torch.int32)
    scale, ranks = torch.tensor([0.5, 2.0]), torch.tensor([4, 8], dtype=torch.int32)
    got = torch.zeros(3 * T, n_out)
    atmm_images(got, x, A, B, slot, length, scale, ranks, T, impl="triton")
    want = torch.zeros(3 * T, n_out)
    for i in range(3):  # the module docstring's loop
        if length[i] > 0:
            a, r, rows = int(slot[i]), int(ranks[slot[i]]), slice(i * T, (i + 1) * T)
            want[rows] += scale[a] * (x[rows] @ A[a, :r].T) @ B[a, :, :r].T
    assert launched == [chosen]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    tri._images_config.cache_clear()


# ---------------------------------------------------------------- the fused LoRA linear (kernels/fused.py)
def fused_case(T=37, slots=(2, 0, 1, 2, 1), sit_out=(False, False, True, False, False), bias=True, seed=5):
    """Images of T tokens whose tiles straddle image boundaries (T is no multiple of any tile height), with
    adapters of ranks 4 / 16 / 32 in a stack 32 wide, and one image that sits out."""
    g = torch.Generator().manual_seed(seed)
    S, R, n_in, n_out = 3, 32, 40, 72
    ranks = torch.tensor([4, 16, 32], dtype=torch.int32)
    A, B = torch.zeros(S, R, n_in), torch.zeros(S, n_out, R)
    for s, r in enumerate(ranks.tolist()):
        A[s, :r] = torch.randn(r, n_in, generator=g) / 4
        B[s, :, :r] = torch.randn(n_out, r, generator=g) / 4
    n = len(slots)
    x = torch.randn(n * T, n_in, generator=g)
    W = torch.randn(n_out, n_in, generator=g) / 4
    b = torch.randn(n_out, generator=g) if bias else None
    scale = torch.tensor([0.5, 2.0, 1.5])
    slot = torch.tensor(slots, dtype=torch.int32)
    length = torch.tensor([0 if out else T for out in sit_out], dtype=torch.int32)
    return x, W, b, A, B, slot, length, scale, ranks, T


def fused_loop(x, W, b, A, B, slot, length, scale, ranks, T):
    """kernels/fused.py's docstring loop, in float32 over the same (possibly rounded) inputs."""
    x, W, A, B = x.float(), W.float(), A.float(), B.float()
    y = torch.empty(x.shape[0], W.shape[0])
    for i in range(slot.shape[0]):
        rows = slice(i * T, (i + 1) * T)
        y[rows] = x[rows] @ W.T + (b.float() if b is not None else 0)
        if length[i] > 0:
            a = int(slot[i])
            r = int(ranks[a])
            y[rows] += float(scale[a]) * (x[rows] @ A[a, :r].T) @ B[a, :, :r].T
    return y


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_fused_cpu_torch_form_matches_the_loop(bias):
    from vlora_va.kernels import lora_linear_images
    x, W, b, A, B, slot, length, scale, ranks, T = fused_case(bias=bias)
    got = lora_linear_images(x, W, b, A, B, slot, length, scale, ranks, T, 32, impl="cpu")
    torch.testing.assert_close(got, fused_loop(x, W, b, A, B, slot, length, scale, ranks, T), atol=1e-4, rtol=1e-4)


def test_fused_rejects_a_layout_that_does_not_fit_the_rows():
    from vlora_va.kernels import lora_linear_images
    x, W, b, A, B, slot, length, scale, ranks, T = fused_case()
    with pytest.raises(ValueError, match="rows, the layout 5 images of 36 tokens"):
        lora_linear_images(x, W, b, A, B, slot, length, scale, ranks, T - 1, 32)


@inner
@pytest.mark.parametrize("tiles", [(16, 16, 16, 4, 2), (32, 64, 32, 4, 2), (64, 32, 16, 4, 2)],
                         ids=["16x16", "32x64", "64x32-cut-to-32"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_fused_triton_matches_the_loop(tiles, bias):
    """Every tile straddles at most two images (64-row tiles are cut to 32 for 37 tokens); each row must take its
    own image's adapter, an image that sits out only the base layer."""
    from vlora_va.kernels import lora_linear_images
    from vlora_va.kernels.fused import FusedTiles
    x, W, b, A, B, slot, length, scale, ranks, T = fused_case(bias=bias)
    got = lora_linear_images(x, W, b, A, B, slot, length, scale, ranks, T, 32, tiles=FusedTiles(*tiles),
                             impl="triton")
    torch.testing.assert_close(got, fused_loop(x, W, b, A, B, slot, length, scale, ranks, T), atol=1e-4, rtol=1e-4)


@inner
def test_fused_triton_bf16_and_the_rank_tile_of_a_narrow_stack():
    """bf16 inputs against the loop over the same rounded inputs; and a 16-wide rank tile (max_rank 16) on the
    ranks-4/16 slots equals the full one: the rank tile only has to cover the largest rank."""
    from vlora_va.kernels import lora_linear_images
    x, W, b, A, B, slot, length, scale, ranks, T = fused_case(slots=(1, 0, 1, 0, 1))
    bf = [t.to(torch.bfloat16) for t in (x, W, b, A, B)]
    got = lora_linear_images(*bf, slot, length, scale, ranks, T, 32, impl="triton")
    want = fused_loop(*bf, slot, length, scale, ranks, T)
    torch.testing.assert_close(got.float(), want, atol=0.06, rtol=0.02)
    narrow = lora_linear_images(x, W, b, A, B, slot, length, scale, ranks, T, 16, impl="triton")
    torch.testing.assert_close(narrow, fused_loop(x, W, b, A, B, slot, length, scale, ranks, T), atol=1e-4,
                               rtol=1e-4)


@inner
def test_the_engine_runs_unmerged_layers_through_the_fused_kernel(tiny_backbone_dir, tiny_adapters, monkeypatch):
    """The engine's fixed-layout forward (what a GPU runs) with LoRAContext.fused set: every wrapped layer launches
    the Triton kernel (17 tokens per image), and the features equal the unfused per-image ATMM path's."""
    import vlora_va.kernels.triton_fused as tf
    from vlora_va.engine.adapters import load_adapter_dir
    from vlora_va.engine.backbones import load_backbone
    from vlora_va.engine.executor import Engine
    from vlora_va.engine.modes import UNMERGED, LoRAMode
    from vlora_va.kernels.fused import FusedTiles, rank_block
    from vlora_va.testing.tiny import TINY_IMAGE

    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=0, fixed_layout=True)
    g = torch.Generator().manual_seed(2)
    frames = [(torch.rand(TINY_IMAGE, TINY_IMAGE, 3, generator=g) * 255).to(torch.uint8).numpy() for _ in range(3)]
    mode = LoRAMode(UNMERGED)
    engine.switch(mode)
    engine.lora_ctx.fused = None
    want = engine.features(frames, [1, 0, 1], mode).cls
    launches = []
    real = tf.launch_fused
    monkeypatch.setattr(tf, "launch_fused", lambda *a, **k: (launches.append(a[10]), real(*a, **k))[1])
    engine.lora_ctx.fused = FusedTiles(16, 16, 16, 4, 2)
    got = engine.features(frames, [1, 0, 1], mode).cls
    assert len(launches) == sum(len(group.names) for group in engine.lora_ctx.groups)  # every wrapped layer, once
    assert set(launches) == {rank_block(engine.lora_ctx.max_rank)}  # the rank tile covers every slot's rank
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
