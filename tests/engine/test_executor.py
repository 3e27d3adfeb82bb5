"""The engine against plain references: per-adapter merged weights, and peft itself."""

import copy
import json
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

from vlora_va import kernels
from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import ActivityResult, DetectionResult
from vlora_va.engine import lora
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.executor import Engine, premerge_unsupported
from vlora_va.engine.heads import HEAD_FORMAT, HEAD_FORMAT_VERSION, DetectionHead
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode
from vlora_va.kernels.fused import DEFAULT_TILES
from vlora_va.serving.scheduling import make_plan
from vlora_va.testing.tiny import TINY_IMAGE


def frames(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, (TINY_IMAGE, TINY_IMAGE, 3), dtype=np.uint8) for _ in range(n)]


def request(adapter, n, seed, seq=0):
    now = time.time()
    return Request("cam", seq, adapter, adapter, frames(n, seed), [0.1 * i for i in range(n)],
                   Letterbox(1.0, 0.0, 0.0), (TINY_IMAGE, TINY_IMAGE), now, now, now + 5)


def run(engine, batch, mode=None):
    """The engine's typed results for a batch, through a plan (default: the mode that needs no switch)."""
    return engine.execute(make_plan(batch, mode or engine.default_mode(), engine.catalog()))


def merged_reference(backbone, adapter):
    """The backbone with scale·B·A added to each targeted weight: what one adapter alone must compute."""
    model = copy.deepcopy(backbone)
    with torch.no_grad():
        for name, (a, b) in adapter.lora.items():
            model.get_submodule(name).weight += adapter.scale * b @ a
    return model


def test_premerged_weights_only_where_their_grouped_gemm_can_be_captured():
    """On CUDA, torch._grouped_mm has a kernel for bfloat16 only; in other dtypes it reads the group offsets on the
    host, which graph capture refuses (an H200 run crashed so): the engine then keeps no premerged weights."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert premerge_unsupported(cuda, torch.bfloat16) is None
    assert "bfloat16" in premerge_unsupported(cuda, torch.float32)
    assert "bfloat16" in premerge_unsupported(cuda, torch.float16)
    assert premerge_unsupported(cpu, torch.float32) is None and premerge_unsupported(cpu, torch.bfloat16) is None


@pytest.mark.parametrize("premerge_max_mb", [0, 1024])  # ATMM path / premerged weights
def test_mixed_adapter_batch_matches_each_adapter_merged(tiny_backbone_dir, tiny_adapters, premerge_max_mb):
    base = load_backbone(str(tiny_backbone_dir))
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    refs = {n: merged_reference(base, a) for n, a in adapters.items()}
    engine = Engine(copy.deepcopy(base), adapters, TINY_IMAGE, premerge_max_mb=premerge_max_mb)
    assert (engine.backbone.encoder.layer[0].attention.q_proj._group.Wm is not None) == bool(premerge_max_mb)
    # Interleaved adapters: the engine must group rows by slot and restore the original order.
    batch = [request("detect", 2, 1), request("actions", 2, 2), request("detect", 1, 3, seq=1)]
    all_frames = [f for r in batch for f in r.frames]
    feats = engine.features(all_frames, [engine.slots[r.adapter] for r in batch for _ in r.frames])
    k = 0
    for r in batch:
        px = engine.pixels(r.frames)
        with torch.no_grad():
            want = refs[r.adapter](pixel_values=px).last_hidden_state
        got_cls = feats.cls[k:k + r.num_images]
        assert torch.allclose(got_cls, want[:, 0], atol=1e-4), r.adapter
        k += r.num_images
    # And the LoRA really changes something (otherwise the test above could not fail).
    with torch.no_grad():
        plain = base(pixel_values=engine.pixels(batch[0].frames)).last_hidden_state[:, 0]
    assert not torch.allclose(plain, feats.cls[:2], atol=1e-3)


def test_run_returns_one_well_formed_output_per_request(tiny_backbone_dir, tiny_adapters):
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE)
    batch = [request("actions", 2, 5), request("detect", 2, 6), request("actions", 1, 7, seq=1)]
    outs = run(engine, batch)
    assert [type(o) for o in outs] == [ActivityResult, DetectionResult, ActivityResult]
    assert outs[0].label in ("standing", "walking") and 0 <= outs[0].score <= 1
    assert abs(sum(outs[0].scores.values()) - 1) < 1e-3
    assert [f.ts for f in outs[1].frames] == [0.0, 0.1]
    assert outs[2].label in ("standing", "walking")


def test_adapter_saved_by_plain_peft_loads_and_matches_peft(tiny_backbone_dir, tmp_path):
    """DESIGN: PEFT-format adapters from plain peft training load unchanged."""
    base = load_backbone(str(tiny_backbone_dir))
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "fc2"]))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    peft_model.save_pretrained(tmp_path)
    head = DetectionHead(32, ["person"], image_size=TINY_IMAGE)
    (tmp_path / "head_config.json").write_text(json.dumps({
        "format": HEAD_FORMAT, "version": HEAD_FORMAT_VERSION, "task": "detection", "classes": ["person"],
        "params": {"image_size": TINY_IMAGE}, "trained": False}))
    save_file(head.state_dict(), str(tmp_path / "head.safetensors"))
    adapter = load_adapter_dir("p", tmp_path, 32)
    assert adapter.rank == 4 and adapter.scale == 2.0 and len(adapter.lora) == 4
    engine = Engine(copy.deepcopy(base), {"p": adapter}, TINY_IMAGE)
    fs = frames(3, 9)
    feats = engine.features(fs, [0, 0, 0])
    with torch.no_grad():
        want = peft_model(pixel_values=engine.pixels(fs)).last_hidden_state
    assert torch.allclose(feats.cls, want[:, 0], atol=1e-4)


def test_too_many_adapters_for_the_slots_is_a_clear_error(tiny_backbone_dir, tiny_adapters):
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    with pytest.raises(ValueError, match="2 adapters configured but daemon.max_slots is 1"):
        Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, max_slots=1)


def test_features_keep_each_frames_model_input_in_the_callers_order(tiny_backbone_dir, tiny_adapters):
    """A detection head's detail branch reads the image: each frame's pixels must follow it through the
    grouping by adapter and the sharing of a frame two requests send."""
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE)
    a, b = frames(2, 11)
    fs, slots = [a, b, a], [1, 0, 0]  # slot order regroups them; frame a is sent twice
    assert engine.features(fs, slots).pixels is None  # only when asked: most heads never read them
    feats = engine.features(fs, slots, keep_pixels=True)
    for i, f in enumerate(fs):
        assert torch.equal(feats.pixels[i], engine.pixels([f])[0])
    small = engine.features(fs, slots, size=28, keep_pixels=True)
    assert small.pixels.shape == (3, 3, 28, 28) and torch.equal(small.pixels[1], engine.pixels([b], 28)[0])


def test_the_model_input_is_the_frames_normalised_then_resized_to_float_rounding():
    """model_input resizes first (cheaper): the values are those of the plain definition, normalise then an
    antialiased bilinear resize, to float rounding (a uint8 resize would round to whole grey levels: 1e-2 here)."""
    import torch.nn.functional as F

    from vlora_va.engine.backends.torch_eager import model_input, normalise

    images = torch.from_numpy(np.stack(frames(3, 11)))
    want = F.interpolate(normalise(images), size=(20, 20), mode="bilinear", antialias=True, align_corners=False)
    got = model_input(images, 20)
    assert got.shape == (3, 3, 20, 20) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert torch.equal(model_input(images, images.shape[1]), normalise(images))  # its own size: no resize


def test_a_detection_head_with_a_detail_branch_is_served_from_each_frames_own_image(tiny_backbone_dir, tiny_adapters,
                                                                                     tmp_path):
    import shutil

    path = tmp_path / "detail"
    shutil.copytree(tiny_adapters["detect"], path)
    cfg = json.loads((path / "head_config.json").read_text())
    cfg["params"] = {**cfg.get("params", {}), "upsample": 4, "detail": 32}
    torch.manual_seed(0)
    head = DetectionHead(32, cfg["classes"], image_size=TINY_IMAGE, upsample=4, detail=32)
    with torch.no_grad():
        head.cls_out.bias.fill_(2.0)  # an untrained head finds nothing; this one finds something everywhere
    (path / "head_config.json").write_text(json.dumps(cfg))
    save_file(head.state_dict(), str(path / "head.safetensors"))
    adapters = {"detail": load_adapter_dir("detail", path, 32),
                "actions": load_adapter_dir("actions", tiny_adapters["actions"], 32)}
    assert adapters["detail"].head.detail == 32
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE)
    batch = [request("actions", 2, 3), request("detail", 2, 7)]
    together = engine.execute(make_plan(batch, engine.default_mode(), engine.catalog()))
    alone = run(engine, [batch[1]])[0]
    assert together[1] == alone and sum(len(f.detections) for f in alone.frames) > 0
    # the image itself reaches the head: the same backbone features with another image give other boxes
    feats = engine.features(batch[1].frames, [engine.slots["detail"]] * 2, keep_pixels=True)
    lbs, sizes = [batch[1].letterbox] * 2, [batch[1].orig_size] * 2
    served = adapters["detail"].head
    with torch.inference_mode():
        assert served.decode(served(feats), lbs, sizes) == [list(f.detections) for f in alone.frames]
        feats.pixels = feats.pixels.flip(-1)
        assert served.decode(served(feats), lbs, sizes) != [list(f.detections) for f in alone.frames]


def test_each_adapter_runs_at_its_own_image_size(tiny_backbone_dir, tiny_adapters, tmp_path):
    """An adapter trained at 28 px gets the 56-px frames resized; one mixed batch = each request alone."""
    import shutil

    small = tmp_path / "small"
    shutil.copytree(tiny_adapters["actions"], small)
    cfg = json.loads((small / "head_config.json").read_text())
    (small / "head_config.json").write_text(json.dumps({**cfg, "image_size": 28}))
    adapters = {"detect": load_adapter_dir("detect", tiny_adapters["detect"], 32),
                "small": load_adapter_dir("small", small, 32)}
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE)
    assert engine.sizes == {"detect": TINY_IMAGE, "small": 28}
    feats = engine.features(frames(2, 4), [1, 1], size=28)
    assert feats.grid.shape[-2:] == (2, 2)  # 28 px / 14 = 2x2 patches
    batch = [request("small", 2, 4), request("detect", 2, 5)]
    plan = make_plan(batch, engine.default_mode(), engine.catalog())
    assert [(g.size, g.members) for g in plan.groups] == [(28, (0,)), (TINY_IMAGE, (1,))]
    together = engine.execute(plan)
    alone = [run(engine, [r])[0] for r in batch]
    assert together[0].scores == pytest.approx(alone[0].scores, abs=1e-4)
    assert together[1] == alone[1]


@pytest.mark.parametrize("boxes", [0, 2])
def test_person_activities_come_back_in_original_pixels_at_any_adapter_size(tiny_backbone_dir, tiny_adapters, tmp_path,
                                                                           boxes):
    """A persons head at 28 px behind a 56-px daemon: persons are the head's own decode through the clip's
    letterbox, rescaled to the adapter's size, in the request's original frame (found by the persons branch, or
    by its person boxes on the clip's middle frames)."""
    import shutil

    from vlora_va.engine.heads import build_head

    path = tmp_path / "persons"
    shutil.copytree(tiny_adapters["actions"], path)
    cfg = json.loads((path / "head_config.json").read_text())
    cfg.update(image_size=28, params={"spatial": "local", "motion": True, "width": 8, "persons": True,
                                      "score_threshold": 0.0, **({"boxes": boxes, "box_width": 16} if boxes else {})})
    (path / "head_config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    head = build_head(cfg, 32)
    torch.nn.init.normal_(head.person_out.weight, std=1.0)  # scores that vary from cell to cell: some peaks
    if boxes:
        torch.nn.init.normal_(head.box_head.cls_out.weight, std=1.0)
        torch.nn.init.zeros_(head.box_head.cls_out.bias)
    save_file(head.state_dict(), str(path / "head.safetensors"))
    adapters = {"detect": load_adapter_dir("detect", tiny_adapters["detect"], 32),
                "persons": load_adapter_dir("persons", path, 32)}
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE)
    req = request("persons", 2, 11)
    req.letterbox, req.orig_size = Letterbox(0.5, 0.0, 7.0), (112, 84)  # a 112x84 frame letterboxed into 56x56
    (out,) = run(engine, [req])
    feats = engine.features(req.frames, [engine.slots["persons"]] * 2, size=28)
    head = adapters["persons"].head
    with torch.inference_mode():
        want = head.decode(head(feats, 2), [Letterbox(0.25, 0.0, 3.5)], [(112, 84)])
    assert out.persons and out.persons == want[0].persons
    assert all(0 <= p.box[0] <= p.box[2] <= 112 and 0 <= p.box[1] <= p.box[3] <= 84 for p in out.persons)


def upper_only_adapter(path, source, seed):
    """A copy of `source` whose LoRA is kept on block 1 only (block 0 untouched, like detect's 8-11 of 12)."""
    from vlora_va.engine.adapters import save_adapter_dir

    a = load_adapter_dir("x", source, 32)
    g = torch.Generator().manual_seed(seed)
    lora = {m: (A, torch.randn(B.shape, generator=g) * 0.2) for m, (A, B) in a.lora.items() if ".layer.1." in m}
    save_adapter_dir(path, lora=lora, rank=a.rank, alpha=a.rank, target_modules=["q_proj", "v_proj"],
                     base_model="tiny", head=a.head, head_config={k: v for k, v in a.head_config.items()
                                                                  if k not in ("format", "version")})
    return load_adapter_dir(path.name, path, 32)


def test_shared_prefix_runs_untouched_blocks_once_per_frame_and_changes_nothing(tiny_backbone_dir, tiny_adapters,
                                                                                 tmp_path):
    """Two adapters with LoRA on block 1 only, asking for the same frames: block 0 runs once per frame (not
    per request), and every request's result equals its result computed alone."""
    adapters = {"up1": upper_only_adapter(tmp_path / "up1", tiny_adapters["detect"], 3),
                "up2": upper_only_adapter(tmp_path / "up2", tiny_adapters["detect"], 4),
                "detect": load_adapter_dir("detect", tiny_adapters["detect"], 32)}
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=64)
    catalog = engine.catalog()
    assert [catalog.adapters[n].first_block for n in ("up1", "up2", "detect")] == [1, 1, 0] and catalog.blocks == 2
    shared = frames(3, 21)  # one chunk's frames: both tasks look at the same buffers
    now = time.time()
    reqs = [Request("cam", 0, name, name, shared, [0.0, 0.1, 0.2], Letterbox(1.0, 0.0, 0.0),
                    (TINY_IMAGE, TINY_IMAGE), now, now, now + 5) for name in ("up1", "up2")]
    seen = []
    hook = engine.backbone.encoder.layer[0].register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    for mode in (LoRAMode(PREMERGED), LoRAMode(UNMERGED)):
        seen.clear()
        plan = make_plan(reqs, mode, catalog)
        assert plan.groups[0].prefix == 1
        together = engine.execute(plan)
        assert seen == [3]  # block 0 saw 3 distinct frames, not 6 rows
        for r, got in zip(reqs, together):
            copy = Request(r.stream, r.seq, r.task, r.adapter, [f.copy() for f in r.frames], r.frame_ts,
                           r.letterbox, r.orig_size, now, now, now + 5)  # own buffers: nothing to share
            alone_plan = make_plan([copy], mode, catalog)
            assert alone_plan.groups[0].prefix == 0
            assert got == engine.execute(alone_plan)[0], mode
    hook.remove()
    # An adapter whose LoRA starts at block 0 on the same frames: nothing to share but the embeddings.
    also = Request("cam", 0, "d", "detect", shared, [0.0, 0.1, 0.2], Letterbox(1.0, 0.0, 0.0), (TINY_IMAGE, TINY_IMAGE),
                   now, now, now + 5)
    assert make_plan([*reqs, also], LoRAMode(UNMERGED), catalog).groups[0].prefix == 0
    # With detect merged into the weights, its ΔW sits in block 0 too: no prefix for anyone.
    engine.switch(LoRAMode("merged", catalog.adapters["detect"].slot))
    assert make_plan(reqs, LoRAMode("mixture", catalog.adapters["detect"].slot), catalog).groups[0].prefix == 0
    engine.switch(LoRAMode(PREMERGED))


@pytest.mark.parametrize("mode", [LoRAMode(PREMERGED), LoRAMode(UNMERGED)])
def test_a_bfloat16_backbone_serves_float32_heads_close_to_float32(tiny_backbone_dir, tiny_adapters, mode):
    """daemon.dtype: the backbone and its LoRA in bfloat16 (the GPU default), the heads in float32."""
    def make(dtype):
        adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
        return Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=64, dtype=dtype)

    e32, e16 = make(torch.float32), make(torch.bfloat16)
    assert e16.backbone.encoder.layer[0].attention.q_proj._group.A.dtype == torch.bfloat16
    fs = frames(4, 31)
    slots = [0, 0, 1, 1]
    f32, f16 = e32.features(fs, slots, mode), e16.features(fs, slots, mode)
    assert f16.cls.dtype == torch.float32  # what the heads read
    rel = (f16.cls - f32.cls).norm() / f32.cls.norm()
    assert 0 < rel < 0.05  # bfloat16 rounding, not another computation
    batch = [request("actions", 2, 5), request("detect", 2, 6)]
    a32, a16 = run(e32, batch, mode), run(e16, batch, mode)
    assert a16[0].scores == pytest.approx(a32[0].scores, abs=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fixed_device_layouts_compute_what_the_segments_path_computes(tiny_backbone_dir, tiny_adapters, dtype,
                                                                       monkeypatch):
    """The GPU's graph-capturable path, run on the CPU: batches padded to their bucket, the LoRA layout in
    device tensors (premerged through one grouped GEMM, unmerged / mixture through per-image ATMM runs, unmerged
    also as the fused LoRA linear).
    Every mode gives what the host-side Segments path gives, padding changes nothing."""
    def make(fixed):
        adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
        return Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=64,
                      dtype=dtype, fixed_layout=fixed)

    ref, fixed = make(False), make(True)
    fs = frames(5, 41)  # 5 images: padded to a bucket of 8
    slots = [1, 0, 1, 0, 0]
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for mode in (LoRAMode(PREMERGED), LoRAMode(UNMERGED), LoRAMode(MIXTURE, 0), LoRAMode(MIXTURE, 1)):
        for e in (ref, fixed):
            e.switch(mode)
        want, got = ref.features(fs, slots, mode), fixed.features(fs, slots, mode)
        assert got.cls.shape == want.cls.shape == (5, 32)
        assert (got.cls - want.cls).abs().max() <= tol * max(1.0, want.cls.abs().max()), mode
    # unmerged as one fused kernel per layer (kernels.lora_linear_images): the same features, and every wrapped
    # layer goes through it
    calls = []
    real = kernels.lora_linear_images
    monkeypatch.setattr(kernels, "lora_linear_images", lambda *a, **k: (calls.append(a[-1]), real(*a, **k))[1])
    fixed.lora_ctx.fused = DEFAULT_TILES
    for e in (ref, fixed):
        e.switch(LoRAMode(UNMERGED))
    want, got = ref.features(fs, slots, LoRAMode(UNMERGED)), fixed.features(fs, slots, LoRAMode(UNMERGED))
    assert (got.cls - want.cls).abs().max() <= tol * max(1.0, want.cls.abs().max())
    n_layers = len(lora.lora_module_names(fixed.backbone))
    assert len(calls) == n_layers and set(calls) == {fixed.lora_ctx.max_rank}
    fixed.lora_ctx.fused = None
    assert set(fixed.backend._layouts) == {(8, 17)}  # one layout, reused by every mode: (bucket, tokens)
    layout = fixed.backend._layouts[(8, 17)]
    fixed.switch(LoRAMode(MIXTURE, 0))
    fixed.lora_ctx.begin(LoRAMode(MIXTURE, 0), [0, 0, 1, 1, 1], layout)
    T = 17
    assert layout.start.tolist() == [i * T for i in range(8)]
    assert layout.own_len.tolist() == [0, 0, T, T, T, 0, 0, 0]  # the merged slot's rows need nothing
    assert layout.delora_len.tolist() == [0, 0, T, T, T, 0, 0, 0] and set(layout.delora_slot.tolist()[:5]) == {0}
    fixed.lora_ctx.clear()
    fixed.switch(LoRAMode(PREMERGED))
    fixed.lora_ctx.begin(LoRAMode(PREMERGED), [0, 0, 1, 1, 1], layout)
    assert layout.offs.tolist() == [2 * T] + [5 * T] * 7  # rows of slot 0, then of slots 0-1 (8 slots): padding after
    with pytest.raises(ValueError, match="sorted"):
        fixed.lora_ctx.begin(LoRAMode(PREMERGED), [1, 0], layout)
    fixed.lora_ctx.clear()


def test_the_same_request_gives_the_same_detections_in_every_mode(tiny_backbone_dir, tiny_adapters):
    """Mode equivalence as the rows see it: identical detections in premerged, unmerged, mixture (either
    adapter merged) and, alone, merged; scores may differ only where they sit within 1e-3 of the threshold."""
    adapters = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    head = adapters["detect"].head
    head.score_threshold = 0.0101  # the untrained head scores cells around 0.01: plenty of boxes near it
    engine = Engine(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, premerge_max_mb=64)
    batch = [request("detect", 2, 51), request("actions", 2, 52), request("detect", 1, 53, seq=1)]
    runs = {}
    for mode in (LoRAMode(PREMERGED), LoRAMode(UNMERGED), LoRAMode(MIXTURE, 0), LoRAMode(MIXTURE, 1)):
        engine.switch(mode)
        runs[str(mode)] = run(engine, batch, mode)
    engine.switch(LoRAMode(MERGED, 0))
    alone = run(engine, [batch[0], batch[2]], LoRAMode(MERGED, 0))
    runs["merged(0)"] = [alone[0], runs["premerged"][1], alone[1]]
    engine.switch(LoRAMode(PREMERGED))

    def boxes(results):  # boxes as rows carry them: 0.1 px
        return [(i, f, replace(d, box=tuple(round(v, 1) for v in d.box))) for i, r in enumerate(results)
                if isinstance(r, DetectionResult) for f, frame in enumerate(r.frames) for d in frame.detections]

    want = boxes(runs["premerged"])
    assert len(want) > 10  # the comparison has something to compare
    for name, results in runs.items():
        got = boxes(results)
        matched = {(i, f, d.box, d.cls) for i, f, d in want} & {(i, f, d.box, d.cls) for i, f, d in got}
        for i, f, d in want + got:
            if (i, f, d.box, d.cls) not in matched:  # present in one mode only: it must sit at the threshold
                assert abs(d.score - head.score_threshold) < 1e-3, (name, d)
        scores = {(i, f, d.box, d.cls): d.score for i, f, d in want}
        assert all(abs(d.score - scores[(i, f, d.box, d.cls)]) < 1e-4 for i, f, d in got if (i, f, d.box, d.cls) in scores)
        assert results[1].scores == pytest.approx(runs["premerged"][1].scores, abs=1e-4), name
