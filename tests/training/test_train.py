"""LoRA + head training end to end on a tiny random backbone: checkpoints, resume, budget, save, load, merge."""

import dataclasses
import fcntl
import pickle
import threading
import time

import numpy as np
import pytest
import torch

from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.heads import Features
from vlora_va.training import train as T
from vlora_va.training.evaluate import merged_backbone
from vlora_va.training.features import FeatureCache, full_hidden, lower_hidden, upper_hidden
from vlora_va.training.frames import TrainingFrame, letterboxed_batch
from vlora_va.training.pipeline import Split, train_detection
from vlora_va.training.spec import LoraSpec, SourceSpec, Spec, TrainSpec

SIDE = 56


def frames(n=6):
    rng = np.random.default_rng(0)
    return [TrainingFrame("synthetic", i / 10, rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)) for i in range(n)]


class OpensAFile:
    """Unpickling this opens (creates) a file: what a checkpoint loader must never do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def labelled_split(fr):
    labels = {f.key: [{"box": [10, 10, 40, 50], "class": "person", "score": 0.9, "ignore": False}] for f in fr}
    return Split(fr, {"person": labels}, side=SIDE)


def spec_for(tmp_path, backbone, layers, epochs=2):
    return Spec(name="tiny", task="detection", output=tmp_path / "out", backbone=backbone, image_size=SIDE,
                sources=[SourceSpec("person", "centernet", ["person"])], cache_dir=tmp_path / "cache",
                lora=LoraSpec(rank=4, alpha=8, layers=layers),
                opts=TrainSpec(epochs=epochs, batch=4, ckpt_every=1, threads=1))


def test_split_forward_equals_full_forward(tiny_backbone):
    model = T.build_model(tiny_backbone, LoraSpec(layers=[]))
    x, _ = letterboxed_batch(frames(2), SIDE)
    with torch.no_grad():
        ref = model(pixel_values=x).last_hidden_state
        assert torch.allclose(upper_hidden(model, lower_hidden(model, x, 1), 1), ref, atol=1e-5)
        assert torch.allclose(full_hidden(model, x), ref, atol=1e-5)


def test_feature_cache_is_reused(tiny_backbone, tmp_path):
    model = T.build_model(tiny_backbone, LoraSpec(layers=[]))
    cache = FeatureCache(tmp_path, tiny_backbone, SIDE, 1)
    a = cache.get(model, frames(3), progress=False)
    b = cache.get(None, frames(3), progress=False)  # no model needed the second time
    assert torch.equal(a, b) and a.dtype == torch.float16 and a.shape[:2] == (3, 1 + (SIDE // 14) ** 2)


def test_feature_cache_is_not_reused_under_another_exposure_rule(tiny_backbone, tmp_path, monkeypatch):
    """Features hold the pixels ingest made (ingest/exposure.py): after the rule changes they must be computed again."""
    from vlora_va.training import features

    model = T.build_model(tiny_backbone, LoraSpec(layers=[]))
    before = FeatureCache(tmp_path, tiny_backbone, SIDE, 1)
    before.get(model, frames(3), progress=False)
    assert before._file(frames(3), False).exists()
    monkeypatch.setattr(features, "EXPOSURE_VERSION", features.EXPOSURE_VERSION + 1)
    after = FeatureCache(tmp_path, tiny_backbone, SIDE, 1)
    assert not after._file(frames(3), False).exists()  # a miss: computed afresh, not read from the old rule's file


def _cache_side_by_side(root, backbone, barrier, errors):
    """One of two training processes computing the same features: both save before either moves its file."""
    real_save = torch.save

    def save_then_wait(obj, path):
        real_save(obj, path)
        barrier.wait(timeout=60)

    torch.save = save_then_wait
    try:
        model = T.build_model(backbone, LoraSpec(layers=[]))
        FeatureCache(root, backbone, SIDE, 1).get(model, frames(2), progress=False)
    except Exception as e:  # reported to the parent: an exception in a child would only show as an exit code
        errors.put(repr(e))


def test_feature_cache_written_by_two_processes_at_once(tiny_backbone, tmp_path):
    # Studies train seeds side by side, each computing the same uncached features: both must end with the file
    ctx = torch.multiprocessing.get_context("spawn")  # fork after torch has run threads can hang
    barrier, errors = ctx.Barrier(2), ctx.Queue()
    runs = [ctx.Process(target=_cache_side_by_side, args=(tmp_path, tiny_backbone, barrier, errors)) for _ in range(2)]
    for p in runs:
        p.start()
    for p in runs:
        p.join(120)
    assert [p.exitcode for p in runs] == [0, 0]
    assert errors.empty(), errors.get()
    cached = FeatureCache(tmp_path, tiny_backbone, SIDE, 1)
    assert torch.equal(cached.get(None, frames(2), progress=False),
                       cached.get(T.build_model(tiny_backbone, LoraSpec(layers=[])), frames(2), progress=False))
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_run_another_process_is_training_waits_then_resumes(tiny_backbone, tmp_path):
    # `--repeat K` beside the whole spec: the second asker must wait for the first, not share its checkpoint
    spec = spec_for(tmp_path, tiny_backbone, layers=[])
    split = labelled_split(frames())
    split.lower = FeatureCache(tmp_path, tiny_backbone, SIDE, 12).get(
        T.build_model(tiny_backbone, LoraSpec(layers=[])), split.frames, progress=False)
    first = train_detection(spec, split, spec.sources, spec.lora, deadline=time.monotonic() + 60)
    (ckpt,) = (tmp_path / "cache" / "checkpoints" / "detection").glob("run-*.pt")
    done = ckpt.read_bytes()
    ckpt.unlink()  # as if the other process had not finished yet
    results = []
    with open(ckpt.with_suffix(".lock"), "w") as other:  # another open file description: another trainer
        fcntl.flock(other, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: results.append(
            train_detection(spec, split, spec.sources, spec.lora, deadline=time.monotonic() + 60)))
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not results  # waiting, not training on its own
        ckpt.write_bytes(done)  # the other trainer's final checkpoint, then it lets go
    waiter.join(60)
    assert results and results[0].steps == first.steps and results[0].losses == []  # resumed at the end


def test_train_resume_save_load_and_merge(tiny_backbone, tmp_path):
    spec = spec_for(tmp_path, tiny_backbone, layers=[1])
    split = labelled_split(frames())
    model = T.build_model(tiny_backbone, LoraSpec(layers=[]))
    cache = FeatureCache(tmp_path, tiny_backbone, SIDE, 1)
    split.lower = cache.get(model, split.frames, progress=False)
    split.lower_flip = cache.get(model, split.frames, flip=True, progress=False)
    # 12 samples / batch 4 * 2 epochs = 6 steps; a spent budget stops at once but still checkpoints
    stopped = train_detection(spec, split, spec.sources, spec.lora, deadline=time.monotonic() - 1, progress=False)
    assert stopped.steps == 0 and not stopped.complete
    first = train_detection(spec, split, spec.sources, spec.lora, deadline=time.monotonic() + 60)
    assert first.steps == 6 and first.complete and np.isfinite(first.losses).all()
    again = train_detection(spec, split, spec.sources, spec.lora, deadline=time.monotonic() + 60)
    assert again.steps == 6 and again.losses == []  # resumed from the final checkpoint: nothing left to do
    # A checkpoint is read as tensors and plain values only: one holding any other object is never unpickled
    (ckpt,) = (tmp_path / "cache" / "checkpoints" / "detection").glob("run-*.pt")
    saved, marker = ckpt.read_bytes(), tmp_path / "unpickled"
    ckpt.write_bytes(pickle.dumps(OpensAFile(str(marker))))
    fresh = train_detection(spec, split, spec.sources, spec.lora, deadline=time.monotonic() + 60)
    assert len(fresh.losses) == 6 and not marker.exists()
    ckpt.write_bytes(saved)
    # Seeds repeated, checkpoint period and threads do not change what a run computes: still the same run ...
    same = dataclasses.replace(spec, opts=dataclasses.replace(spec.opts, repeats=3, ckpt_every=5, threads=2))
    assert train_detection(same, split, same.sources, same.lora, deadline=time.monotonic() + 60).losses == []
    # ... and so is the same run asked for by another spec (a study repeating a shipped recipe) ...
    renamed = dataclasses.replace(spec, name="a-study-of-tiny", output=tmp_path / "study")
    assert train_detection(renamed, split, renamed.sources, renamed.lora, deadline=time.monotonic() + 60).losses == []
    # ... while other training frames, even as many, are another run ...
    shifted = [dataclasses.replace(f, t=f.t + 1) for f in split.frames]
    moved_split = labelled_split(shifted)
    moved_split.lower, moved_split.lower_flip = split.lower, split.lower_flip
    assert len(train_detection(spec, moved_split, spec.sources, spec.lora, deadline=time.monotonic() + 60).losses) == 6
    # ... and so is another learning rate.
    other = dataclasses.replace(spec, opts=dataclasses.replace(spec.opts, lr=spec.opts.lr / 2))
    assert len(train_detection(other, split, other.sources, other.lora, deadline=time.monotonic() + 60).losses) == 6
    # ... and so are other labels: the same source with the teacher also run on tiles
    tiled = [dataclasses.replace(spec.sources[0], options={"tiles": 2})]
    assert len(train_detection(spec, split, tiled, spec.lora, deadline=time.monotonic() + 60).losses) == 6
    # ... and so are other hand fixes, known by their content's digest wherever the file lies
    fixed = [dataclasses.replace(tiled[0], options={"tiles": 2, "corrections": "/a/fix.json", "corrections_sha256": "1"})]
    assert len(train_detection(spec, split, fixed, spec.lora, deadline=time.monotonic() + 60).losses) == 6
    moved = [dataclasses.replace(tiled[0], options={"tiles": 2, "corrections": "/b/fix.json", "corrections_sha256": "1"})]
    assert train_detection(spec, split, moved, spec.lora, deadline=time.monotonic() + 60).losses == []
    lora = T.lora_weights(first.model, spec.lora)
    assert set(lora) == {f"encoder.layer.1.{m}" for m in
                         ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj", "mlp.fc1", "mlp.fc2")}
    assert any(b.abs().sum() > 0 for _, b in lora.values())  # B moved away from its zero init

    from vlora_va.training.pipeline import save_detection

    out = save_detection(spec, tmp_path / "adapter", first, spec.lora, spec.sources, 0.3, {}, "# card\n")
    adapter = load_adapter_dir("tiny", out, 32)
    assert adapter.head_config["classes"] == ["person"] and adapter.head.score_threshold == 0.3
    # the merged backbone (what eval and the engine's merged mode serve) equals peft's unmerged forward
    x, _ = letterboxed_batch(split.frames[:2], SIDE)
    with torch.no_grad():
        peft_out = upper_hidden(first.model, lower_hidden(first.model, x, 1), 1)
        merged_out = full_hidden(merged_backbone(tiny_backbone, adapter), x)
        assert torch.allclose(peft_out, merged_out, atol=1e-4)
        raw_a = first.head(Features.from_hidden(peft_out, SIDE, 14))
        raw_b = adapter.head(Features.from_hidden(merged_out, SIDE, 14))
        assert torch.allclose(raw_a[0], raw_b[0], atol=1e-3)


def test_a_seed_fixes_the_head_init_with_or_without_lora(tiny_backbone):
    """Head-only runs used to start from whatever the RNG held; now every run is reproducible from its seed."""
    def head_after(layers, seed):
        T.build_model(tiny_backbone, LoraSpec(rank=2, layers=layers), seed)  # seeds and draws, as a run does
        torch.rand(7)  # unrelated RNG use between runs must not matter
        return T.new_head("action", ["a", "b"], 32, SIDE, {"width": 4})[0].state_dict()

    for layers in ([], [1]):
        a, b, c = head_after(layers, 3), head_after(layers, 3), head_after(layers, 4)
        assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)


def test_lora_can_start_from_a_saved_adapter(tiny_backbone, tmp_path):
    from vlora_va.engine.adapters import save_adapter_dir

    lora = LoraSpec(rank=2, alpha=4, layers=[1], modules=["q_proj", "fc2"])
    rng = torch.Generator().manual_seed(1)
    backbone = T.build_model(tiny_backbone, LoraSpec(layers=[]))
    shapes = {n: T.installed_module(backbone, n).weight.shape for n in T.target_names(lora)}  # [out, in]
    saved = {n: (torch.randn(2, i, generator=rng), torch.randn(o, 2, generator=rng)) for n, (o, i) in shapes.items()}
    head = T.new_head("action", ["a", "b"], 32, SIDE, {"width": 4})[0]
    save_adapter_dir(tmp_path / "start", lora=saved, rank=2, alpha=4, target_modules=list(saved), base_model="tiny",
                     head=head, head_config=T.head_config("action", ["a", "b"], SIDE, {"width": 4}))
    start = dataclasses.replace(lora, init_from=str(tmp_path / "start"))
    for seed in (0, 5):  # the starting LoRA replaces peft's random init, whatever the seed
        got = T.lora_weights(T.build_model(tiny_backbone, start, seed), start)
        assert all(torch.equal(got[n][0], saved[n][0]) and torch.equal(got[n][1], saved[n][1]) for n in saved)
    fresh = T.lora_weights(T.build_model(tiny_backbone, lora, 0), lora)
    assert all(b.abs().sum() == 0 for _, b in fresh.values())  # without init_from: peft's B = 0
    # a run's identity names the starting weights, not their path: retraining the start makes a new run
    before = T.lora_identity(start)
    assert before["init_from"] != str(tmp_path / "start") and T.lora_identity(lora) == lora.__dict__
    save_adapter_dir(tmp_path / "start", lora={n: (a, b * 2) for n, (a, b) in saved.items()}, rank=2, alpha=4,
                     target_modules=list(saved), base_model="tiny", head=head,
                     head_config=T.head_config("action", ["a", "b"], SIDE, {"width": 4}))
    assert T.lora_identity(start) != before


@pytest.mark.parametrize("boxes, detail", [(0, 0), (2, 0), (4, 32)])
def test_action_training_with_persons_saves_a_head_that_reloads(tiny_backbone, tmp_path, boxes, detail):
    from vlora_va.training import pipeline as P
    from vlora_va.training.runner import _action_labels, _save_action

    walker = [{"box": [10, 10, 30, 50], "label": "walking_left"}]
    still = [{"box": [40, 5, 60, 45], "label": "standing"}, {"box": [5, 5, 20, 30], "label": "walking_toward"}]
    frame_boxes = [[[[10, 10, 30, 50]]] * 2, [[[40, 5, 60, 45], [5, 5, 20, 30]]] * 2, [[[10, 10, 30, 50]]] * 2,
                   [[], []]]  # per clip and frame: the teacher's person boxes
    cs = P.ClipSet(frames(8), [[0, 1], [2, 3], [4, 5], [6, 7]], ["walking_left", "standing", "walking_left", "no_person"],
                   persons=[walker, still, walker, []], seen=[[], [], [], [[10, 10, 30, 50]]], frame_boxes=frame_boxes,
                   side=SIDE)
    spec = Spec(name="tiny-act", task="action", output=tmp_path / "out", backbone=tiny_backbone, image_size=SIDE,
                clip_len=2, sources=[SourceSpec("activity", "activity")], cache_dir=tmp_path / "cache",
                lora=LoraSpec(rank=4, alpha=8, layers=[1]), opts=TrainSpec(epochs=2, batch=2, ckpt_every=1),
                head={"motion": True, "width": 4, "spatial": "local", "persons": True,
                      **({"boxes": boxes, "box_width": 8} if boxes else {}), **({"detail": detail} if detail else {})})
    labels = _action_labels(cs, persons=True)
    # a person-only activity (walking_toward) is learnt too; mirroring adds walking_right
    assert labels == ["no_person", "standing", "walking_left", "walking_right", "walking_toward"]
    # with the detail branch the clips' letterboxed frames ride along (mirrored for the flipped clips)
    P.cache_clip_features(spec, cs, 1, flip=bool(detail), progress=False)
    assert (cs.images is not None) == bool(detail)
    if detail:
        assert cs.images.shape == (8, SIDE, SIDE, 3) and cs.images.dtype == torch.uint8
    res = P.train_action(spec, cs, labels, spec.lora, deadline=time.monotonic() + 60)
    assert res.complete and res.steps == 4 * (1 + bool(detail)) and np.isfinite(res.losses).all() and res.head.persons
    preds = P.predict_action(spec, res.model, res.head, cs, spec.lora)
    report = P.evaluate_action(spec, res.head, cs, preds)
    assert report["clips"] == 4 and report["persons"]["persons"] == 4
    if detail:  # the person boxes come from each clip's own images (scores lifted so that persons are found)
        with torch.no_grad():
            res.head.box_head.cls_out.bias += 8
        seen = P.predict_action(spec, res.model, res.head, cs, spec.lora)
        images, cs.images = cs.images, torch.zeros_like(cs.images)
        blank = P.predict_action(spec, res.model, res.head, cs, spec.lora)
        cs.images = images
        assert all(p["persons"] for p in seen) and [p["persons"] for p in blank] != [p["persons"] for p in seen]
        with torch.no_grad():
            res.head.box_head.cls_out.bias -= 8
    res.head.score_threshold = 0.42  # as if chosen on validation data
    adapter = load_adapter_dir("tiny-act", _save_action(spec, res, labels, {"test": report}), 32)
    assert adapter.head.persons and adapter.head.score_threshold == 0.42 and adapter.head.image_size == SIDE
    assert (adapter.head.box_head is not None) == bool(boxes)
    assert adapter.head.detail == detail
    feats = Features(torch.zeros(4, 32), torch.randn(4, 32, 4, 4), torch.randn(4, 3, SIDE, SIDE))
    with torch.no_grad():
        trained, loaded = res.head(feats, 2), adapter.head(feats, 2)
        flat = lambda out: [t for x in out if x is not None for t in (x if isinstance(x, tuple) else (x,))]
        assert len(flat(trained)) == 2 + 2 * bool(boxes)
        assert all(torch.equal(a, b) for a, b in zip(flat(trained), flat(loaded)))


def test_reversed_clips_add_the_rare_classes_played_backwards(tiny_backbone, tmp_path):
    from vlora_va.training import pipeline as P
    from vlora_va.training.runner import _action_labels

    toward = [{"box": [10, 10, 30, 50], "label": "walking_toward"}, {"box": [40, 5, 60, 45], "label": "walking_left"}]
    unsure = [{"box": [10, 10, 30, 50], "label": "walking_away", "sure": False}]
    cs = P.ClipSet(frames(6), [[0, 1], [2, 3], [4, 5]], ["walking_toward", "walking_away", "standing"],
                   persons=[toward, unsure, [{"box": [40, 5, 60, 45], "label": "standing"}]], seen=[[], [], []],
                   side=SIDE)
    assert P.rare_clips(cs) == [0]  # the unsure walking_away person does not make clip 1 rare
    assert [p["label"] for p in P.reversed_persons(toward)] == ["walking_away", "walking_right"]
    labels = _action_labels(cs, persons=True, reverse=True)
    assert {"walking_away", "walking_right", "walking_toward", "walking_left"} <= set(labels)
    spec = Spec(name="tiny-rev", task="action", output=tmp_path / "out", backbone=tiny_backbone, image_size=SIDE,
                clip_len=2, sources=[SourceSpec("activity", "activity")], cache_dir=tmp_path / "cache",
                lora=LoraSpec(layers=[]), opts=TrainSpec(epochs=1, batch=1, reverse=True, flip=False),
                head={"motion": True, "width": 4, "spatial": "local", "persons": True})
    P.cache_clip_features(spec, cs, 2, flip=False, progress=False)
    res = P.train_action(spec, cs, labels, spec.lora, deadline=time.monotonic() + 60)
    assert res.steps == 4  # 3 clips + clip 0 played backwards, one per step
    spec = dataclasses.replace(spec, opts=dataclasses.replace(spec.opts, reverse=False))
    assert P.train_action(spec, cs, labels, spec.lora, deadline=time.monotonic() + 60).steps == 3


def test_training_under_either_naming_writes_the_same_adapter(tiny_backbone, tmp_path, monkeypatch):
    """transformers < 5.18 names DINOv2's attention layers attention.attention.query etc.: training must wrap the
    same layers there, save them under the canonical names, and give byte-identical files."""
    from vlora_va.engine.adapters import fit_module_names
    from vlora_va.engine.backbones import canonical_name, linear_names, load_backbone
    from vlora_va.testing.tiny import as_naming
    from vlora_va.training.pipeline import save_detection

    files, outputs = {}, {}
    x, _ = letterboxed_batch(frames(2), SIDE)
    for naming in ("canonical", "legacy"):
        def backbone(name, naming=naming):
            return as_naming(load_backbone(name), naming)

        monkeypatch.setattr(T, "load_backbone", backbone)
        spec = dataclasses.replace(spec_for(tmp_path / naming, tiny_backbone, layers=[1], epochs=1),
                                   lora=LoraSpec(rank=2, alpha=4, layers=[1], modules=["q_proj", "o_proj", "fc2"]))
        split = labelled_split(frames(8))
        split.lower = FeatureCache(tmp_path / naming, tiny_backbone, SIDE, 1).get(
            T.build_model(tiny_backbone, LoraSpec(layers=[])), split.frames, progress=False)
        res = train_detection(spec, split, spec.sources, spec.lora, deadline=time.monotonic() + 60, progress=False)
        assert res.steps == 2 and any(b.abs().sum() > 0 for _, b in T.lora_weights(res.model, spec.lora).values())
        base = res.model.get_base_model()
        wrapped = [n for n, m in base.named_modules() if hasattr(m, "lora_A")]
        assert [canonical_name(n) for n in wrapped] == T.target_names(spec.lora)
        assert (".attention.attention.query" in wrapped[0]) == (naming == "legacy")
        out = save_detection(spec, tmp_path / naming / "adapter", res, spec.lora, spec.sources, 0.3, {}, "# card\n")
        files[naming] = {f: (out / f).read_bytes() for f in ("adapter_model.safetensors", "adapter_config.json")}
        # the saved adapter, folded into a fresh backbone of this naming, gives peft's forward
        adapter = load_adapter_dir("tiny", out, 32)
        merged = backbone(tiny_backbone)
        with torch.no_grad():
            for name, (a, b) in fit_module_names(adapter.lora, linear_names(merged)).items():
                merged.get_submodule(name).weight += adapter.scale * (b @ a)
            outputs[naming] = full_hidden(merged, x)
            assert torch.allclose(upper_hidden(res.model, lower_hidden(res.model, x, 1), 1), outputs[naming], atol=1e-4)
    assert files["legacy"] == files["canonical"]
    assert torch.equal(outputs["legacy"], outputs["canonical"])


def test_frozen_layers_then_the_norm_equal_the_upper_layers(tiny_backbone):
    from vlora_va.engine.vit import num_blocks
    from vlora_va.training.features import frozen_layers

    model = T.build_model(tiny_backbone, LoraSpec(layers=[]))
    x, _ = letterboxed_batch(frames(3), SIDE)
    with torch.no_grad():
        lower = lower_hidden(model, x, 1)
        last = num_blocks(model)
        assert torch.allclose(upper_hidden(model, frozen_layers(model, lower, 1, batch=2), last),
                              upper_hidden(model, lower, 1), atol=1e-5)


def test_frozen_lora_and_box_head_stay_as_loaded_while_the_activity_branches_learn(tiny_backbone, tmp_path):
    """train_options.freeze: [lora, box_head] — the saved adapter's LoRA is init_from's and its box head is the
    detection adapter's person head, bit for bit; the rest of the head trains."""
    from vlora_va.engine.adapters import save_adapter_dir
    from vlora_va.engine.heads import DetectionHead
    from vlora_va.training import pipeline as P
    from vlora_va.training.runner import _action_labels

    lora = LoraSpec(rank=2, alpha=4, layers=[1], modules=["q_proj", "fc2"])
    backbone = T.build_model(tiny_backbone, LoraSpec(layers=[]))
    rng = torch.Generator().manual_seed(2)
    start = {n: (torch.randn(2, m.weight.shape[1], generator=rng), torch.randn(m.weight.shape[0], 2, generator=rng))
             for n in T.target_names(lora) for m in [T.installed_module(backbone, n)]}
    box_source = DetectionHead(32, ["person"], 8, image_size=SIDE, upsample=2)
    save_adapter_dir(tmp_path / "det", lora=start, rank=2, alpha=4, target_modules=list(start), base_model="tiny",
                     head=box_source, head_config=T.head_config("detection", ["person"], SIDE,
                                                                {"upsample": 2, "width": 8}))
    walker = [{"box": [10, 10, 30, 50], "label": "walking_left"}]
    cs = P.ClipSet(frames(6), [[0, 1], [2, 3], [4, 5]], ["walking_left", "standing", "no_person"],
                   persons=[walker, [{"box": [40, 5, 60, 45], "label": "standing"}], []], seen=[[], [], []],
                   frame_boxes=[[[[10, 10, 30, 50]]] * 2, [[[40, 5, 60, 45]]] * 2, [[], []]], side=SIDE)
    frozen = dataclasses.replace(lora, init_from=str(tmp_path / "det"))
    spec = Spec(name="tiny-frozen", task="action", output=tmp_path / "out", backbone=tiny_backbone, image_size=SIDE,
                clip_len=2, sources=[SourceSpec("activity", "activity")], cache_dir=tmp_path / "cache", lora=frozen,
                opts=TrainSpec(epochs=2, batch=2, ckpt_every=1, flip=False, freeze=["lora", "box_head"]),
                head={"motion": True, "width": 4, "spatial": "local", "persons": True, "boxes": 2, "box_width": 8},
                box_head_from=tmp_path / "det")
    labels = _action_labels(cs, persons=True)
    P.cache_clip_features(spec, cs, 1, flip=False, progress=False)
    fresh = T.new_head("action", labels, 32, SIDE, spec.head, clip_len=2)[0].state_dict()
    res = P.train_action(spec, cs, labels, frozen, deadline=time.monotonic() + 60)
    assert res.complete and res.steps == 4 and np.isfinite(res.losses).all()
    got = T.lora_weights(res.model, frozen)
    assert all(torch.equal(got[n][0], a) and torch.equal(got[n][1], b) for n, (a, b) in start.items())
    assert all(torch.equal(v, box_source.state_dict()[k]) for k, v in res.head.box_head.state_dict().items())
    trained = res.head.state_dict()
    assert any(not torch.equal(trained[k], fresh[k]) for k in trained if not k.startswith("box_head."))
    # the same spec without freeze trains both (a run of its own: freeze is part of its identity); with the box head
    # alone frozen, the LoRA trains and the box head stays
    for freeze in ([], ["box_head"]):
        res = P.train_action(dataclasses.replace(spec, opts=dataclasses.replace(spec.opts, freeze=freeze)), cs, labels,
                             frozen, deadline=time.monotonic() + 60)
        got = T.lora_weights(res.model, frozen)
        assert any(not torch.equal(got[n][1], b) for n, (_, b) in start.items())
        same_box_head = all(torch.equal(v, box_source.state_dict()[k]) for k, v in res.head.box_head.state_dict().items())
        assert same_box_head == (freeze == ["box_head"])


def test_a_box_head_started_from_a_detection_adapter_is_its_person_class(tmp_path):
    from tests.training.test_spec import save_detection_adapter
    from vlora_va.engine.heads import ActionHead, DetectionHead
    from vlora_va.training.pipeline import start_box_head

    source = DetectionHead(8, ["car", "person"], image_size=56, upsample=4, detail=32).eval()
    with torch.no_grad():
        source.cls_out.bias.copy_(torch.tensor([-1.0, 2.0]))  # car, person: the person row must be taken
    save_detection_adapter(tmp_path / "det", head=source, upsample=4, detail=32)
    head = ActionHead(8, ["no_person", "standing"], width=4, spatial="local", persons=True, boxes=4, image_size=56,
                      detail=32).eval()
    start_box_head(head.box_head, tmp_path / "det", 8)
    feats = Features(torch.zeros(2, 8), torch.randn(2, 8, 4, 4), torch.randn(2, 3, 56, 56))
    with torch.no_grad():
        (logits, dist), (theirs, their_dist) = head.box_head(feats), source(feats)
    # equal up to float rounding: a 1-channel output layer takes other kernels than the 2-channel one (with AMX,
    # oneDNN's differ in the last bits); the car row would be 3 off (its bias -1 against the person's 2)
    torch.testing.assert_close(logits, theirs[:, 1:2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist, their_dist, rtol=1e-5, atol=1e-5)
