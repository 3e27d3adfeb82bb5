"""The openvino backbone backend (engine/backends/openvino.py) against the torch engine: the same features and rows in
every LoRA mode, a shared LoRA-free prefix run once per frame, adapters loaded at run time, the precision hint
it was asked for, no telemetry, and a clear fall-back to torch where it cannot run."""

import copy
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("openvino")

from tests.engine.test_executor import frames, request, upper_only_adapter  # noqa: E402
from vlora_va.engine.adapters import load_adapter_dir  # noqa: E402
from vlora_va.engine.backbones import load_backbone  # noqa: E402
from vlora_va.engine.executor import Engine  # noqa: E402
from vlora_va.engine.modes import MERGED, MIXTURE, PREMERGED, UNMERGED, LoRAMode  # noqa: E402
from vlora_va.serving.scheduling import make_plan  # noqa: E402
from vlora_va.testing.tiny import TINY_IMAGE  # noqa: E402


def engines(backbone_dir, adapter_dirs, **kw):
    """(torch engine, openvino engine) on the same weights and adapters."""
    base = load_backbone(str(backbone_dir))

    def make(backend):
        ads = {n: (p if not hasattr(p, "is_dir") else load_adapter_dir(n, p, 32)) for n, p in adapter_dirs.items()}
        return Engine(copy.deepcopy(base), copy.deepcopy(ads), TINY_IMAGE, backend=backend, **kw)
    return make("torch"), make("openvino")


def test_features_equal_the_torch_engines_for_a_mixed_batch(tiny_backbone_dir, tiny_adapters):
    t, o = engines(tiny_backbone_dir, tiny_adapters)
    assert o.backend_name == "openvino" and type(o.backend).__name__ == "OpenVINOBackbone"
    fr = frames(5, 3)
    slots = [t.slots["detect"], t.slots["actions"], -1, t.slots["detect"], t.slots["actions"]]  # interleaved
    want, got = t.features(fr, slots), o.features(fr, slots)
    torch.testing.assert_close(got.cls, want.cls, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.grid, want.grid, atol=2e-5, rtol=1e-4)
    # the adapters change the features (otherwise equal rows could come from ignoring them)
    plain = t.features(fr, [-1] * 5)
    assert (plain.cls[0] - want.cls[0]).abs().max() > 1e-3 and (plain.cls[1] - want.cls[1]).abs().max() > 1e-3


@pytest.mark.parametrize("mode", [LoRAMode(PREMERGED), LoRAMode(UNMERGED), LoRAMode(MERGED, 0),
                                  LoRAMode(MIXTURE, 0)], ids=str)
def test_rows_equal_the_torch_engines_in_every_mode(tiny_backbone_dir, tiny_adapters, mode):
    """Whatever mode the scheduler plans (and whatever the torch weights hold after a switch), each row is
    computed with its own adapter's merged weights: the torch engine's rows, to float rounding."""
    t, o = engines(tiny_backbone_dir, tiny_adapters, premerge_max_mb=64)
    batch = [request("detect", 2, 1), request("actions", 2, 2), request("detect", 1, 3, seq=1)]
    if mode.kind == MERGED:  # every row through the adapter merged into the weights (slot 0)
        batch = [r for r in batch if t.slots[r.adapter] == mode.slot]
    catalog_t, catalog_o = t.catalog(), o.catalog()
    want = t.execute(make_plan(batch, mode, catalog_t))
    got = o.execute(make_plan(batch, mode, catalog_o))
    assert len(got) == len(want) == len(batch)
    for g, w in zip(got, want):
        assert_rows_close(g.to_json(), w.to_json())


def assert_rows_close(got, want, path="row"):
    """Equal structure, labels and counts; numbers (boxes in pixels, scores, probabilities) within float rounding."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for k in want:
            assert_rows_close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_rows_close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert abs(got - want) <= 0.05 + 1e-3 * abs(want), (path, got, want)
    else:
        assert got == want, (path, got, want)


def test_the_lora_free_prefix_runs_once_per_frame_and_changes_nothing(tiny_backbone_dir, tiny_adapters, tmp_path):
    """Two adapters with LoRA on block 1 only: the lower part (embeddings + block 0) is compiled once and runs
    once per distinct frame for both; each adapter's upper part is its own; rows equal the torch engine's."""
    adapters = {"up1": upper_only_adapter(tmp_path / "up1", tiny_adapters["detect"], 3),
                "up2": upper_only_adapter(tmp_path / "up2", tiny_adapters["detect"], 4)}
    t, o = engines(tiny_backbone_dir, adapters)
    shared = frames(3, 21)
    slots = [o.slots["up1"]] * 3 + [o.slots["up2"]] * 3
    calls = []
    real = o.backend.infer
    o.backend.infer = lambda compiled, x: (calls.append(x.shape[0]), real(compiled, x))[1]
    got = o.features(shared + shared, slots)
    assert calls == [3, 3, 3]  # lower on 3 distinct frames, then each adapter's upper on its 3 rows
    assert set(o.backend._lower) == {(TINY_IMAGE, 1)}
    assert {k[0] for k in o.backend._upper} == {o.slots["up1"], o.slots["up2"]}
    want = t.features(shared + shared, slots)
    torch.testing.assert_close(got.cls, want.cls, atol=2e-5, rtol=1e-4)


def test_an_adapter_loaded_at_run_time_is_served_with_its_own_weights(tiny_backbone_dir, tiny_adapters, tmp_path):
    t, o = engines(tiny_backbone_dir, {"detect": tiny_adapters["detect"]})
    fr = frames(2, 5)
    o.features(fr, [o.slots["detect"]] * 2)  # compiled for detect
    other = upper_only_adapter(tmp_path / "up", tiny_adapters["detect"], 7)
    for e in (t, o):  # reload detect's slot with other weights, as `vlora-va adapters load` does
        e.load("detect", copy.deepcopy(other))
    torch.testing.assert_close(o.features(fr, [o.slots["detect"]] * 2).cls,
                               t.features(fr, [t.slots["detect"]] * 2).cls, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("precision, hint", [("fp32", "f32"), ("bf16", "bf16")])
def test_each_model_is_compiled_with_the_precision_hint_asked_for(tiny_backbone_dir, tiny_adapters, precision, hint):
    """OpenVINO runs float32 models in bf16 by default on CPUs with bf16: the hint is always set explicitly."""
    from vlora_va.engine.backends.openvino import import_openvino

    ov = import_openvino()
    if hint == "bf16" and "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU has no bf16: OpenVINO computes a bf16 hint in f32 here")
    _, o = engines(tiny_backbone_dir, tiny_adapters, precision=precision)
    fr = frames(2, 9)
    got = o.features(fr, [o.slots["detect"]] * 2)
    models = list(o.backend._lower.values()) + list(o.backend._upper.values())
    assert models and all(m.get_property("INFERENCE_PRECISION_HINT") == getattr(ov.Type, hint) for m in models)
    # threads set deliberately: the engine's, one stream (one batch at a time), pinned
    assert all(m.get_property("INFERENCE_NUM_THREADS") == torch.get_num_threads() and
               m.get_property("NUM_STREAMS") == 1 and m.get_property("ENABLE_CPU_PINNING") is True for m in models)
    if precision == "bf16":  # close to float32, not equal
        t, _ = engines(tiny_backbone_dir, tiny_adapters)
        want = t.features(fr, [t.slots["detect"]] * 2)
        assert (got.cls - want.cls).abs().max() < 0.1 * want.cls.abs().max()


def test_compiled_models_are_cached_apart_per_precision_hint_and_isa_cap(tiny_backbone_dir, tiny_adapters, tmp_path,
                                                                         monkeypatch):
    """OpenVINO's blob cache key leaves the precision hint out: the same part compiled at f32 and then at bf16 must
    not share a cache folder (with one, the bf16 compile loaded the f32 blob and gave NaN features on a Xeon with
    AMX, 2026-11-27), nor may a blob built under the AVX2 cap serve an uncapped run."""
    from vlora_va.engine.backends.openvino import blob_dir

    monkeypatch.setenv("VLORA_VA_OPENVINO_CACHE", str(tmp_path))
    fr = frames(2, 9)
    got = {}
    for precision in ("fp32", "bf16", "fp32"):  # the second fp32 run reads its own blobs again
        _, o = engines(tiny_backbone_dir, tiny_adapters, precision=precision)
        got.setdefault(precision, []).append(o.features(fr, [o.slots["detect"]] * 2).cls)
    folders = {h: blob_dir({"INFERENCE_PRECISION_HINT": h}) for h in ("f32", "bf16")}
    assert folders["f32"] != folders["bf16"] and all(f.is_relative_to(tmp_path) for f in folders.values())
    assert all(any(f.glob("*.blob")) for f in folders.values())
    assert not any(tmp_path.glob("*.blob"))  # nothing left in the shared top folder
    assert all(torch.isfinite(c).all() for cs in got.values() for c in cs)
    torch.testing.assert_close(got["fp32"][1], got["fp32"][0], atol=0, rtol=0)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert blob_dir({"INFERENCE_PRECISION_HINT": "f32"}) not in folders.values()


def test_a_compiled_model_cache_that_fails_costs_only_the_cache(tiny_backbone_dir, tiny_adapters, tmp_path,
                                                                 monkeypatch, caplog):
    """Two daemons of a cluster starting on one machine compile the same part into the same blob at once, and
    OpenVINO's cache has no lock: the loser's compile failed, and with it the daemon's start (make test,
    2026-11-28: "filesystem error: cannot set permissions"). Here the cache folder cannot be made at all (a file
    stands where it goes): the backend compiles without the cache, says so, and its features equal a cached one's."""
    monkeypatch.setenv("VLORA_VA_OPENVINO_CACHE", str(tmp_path / "good"))
    fr = frames(2, 9)
    _, cached = engines(tiny_backbone_dir, tiny_adapters)
    want = cached.features(fr, [cached.slots["detect"]] * 2).cls
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "blobs").write_text("not a folder")
    monkeypatch.setenv("VLORA_VA_OPENVINO_CACHE", str(tmp_path / "bad"))
    with caplog.at_level("WARNING", logger="vlora_va.engine.backends.openvino"):
        _, uncached = engines(tiny_backbone_dir, tiny_adapters)
        got = uncached.features(fr, [uncached.slots["detect"]] * 2).cls
    assert "compiling without it" in caplog.text
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_blobs_an_earlier_version_cached_in_the_shared_folder_are_deleted(tiny_backbone_dir, tiny_adapters, tmp_path,
                                                                          monkeypatch, caplog):
    """Before blob_dir, every hint's blobs lay in the top cache folder: untrustworthy and never read again, so the
    backend deletes them at start-up, and nothing else (the calibrated int8 models, this version's blobs)."""
    monkeypatch.setenv("VLORA_VA_OPENVINO_CACHE", str(tmp_path))
    old = [tmp_path / f"{n}.blob" for n in (123, 456)]
    for p in old:
        p.write_bytes(b"an old compiled model")
    kept = [tmp_path / "int8" / "lower-56px-x.xml", tmp_path / "blobs" / "f32-native" / "789.blob"]
    for p in kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"kept")
    with caplog.at_level(logging.INFO, logger="vlora_va.engine.backends.openvino"):
        engines(tiny_backbone_dir, tiny_adapters)
    assert not any(p.exists() for p in old) and all(p.exists() for p in kept)
    assert any("deleted 2 compiled models" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_detection_heads_run_compiled_at_f32_in_the_float_precisions(tiny_backbone_dir, tiny_adapters, precision):
    """The detection head runs compiled (at f32 in the float precisions: their gates were measured with fp32 heads),
    its raw outputs those of the torch module; an action head stays the torch module."""
    from vlora_va.engine.backends.openvino import import_openvino
    from vlora_va.engine.precision import Capabilities

    if precision == "bf16" and not Capabilities.detect("cpu").native_bf16:
        pytest.skip("no native bf16 here (and under ONEDNN_MAX_CPU_ISA=AVX2 the bf16 hint does not compile)")
    _, o = engines(tiny_backbone_dir, tiny_adapters, precision=precision)
    batch = [request("detect", 2, 1), request("actions", 2, 2)]
    rows = o.execute(make_plan(batch, LoRAMode(PREMERGED), o.catalog()))
    assert len(rows) == 2 and set(o.backend._heads) == {(o.slots["detect"], TINY_IMAGE)}
    (compiled,) = o.backend._heads.values()
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == import_openvino().Type.f32
    head = o.adapters["detect"].head
    feats = o.features(frames(2, 4), [o.slots["detect"]] * 2, keep_pixels=True)
    forward = o.backend.head_forward(o.slots["detect"], head, TINY_IMAGE)
    with torch.no_grad():
        for got, want in zip(forward(feats), head(feats)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert o.backend.head_forward(o.slots["actions"], o.adapters["actions"].head, TINY_IMAGE) is None


def test_prepare_compiles_an_adapters_models_and_head_on_the_compile_thread(tiny_backbone_dir, tiny_adapters):
    """What a batch of a newly loaded adapter needs is built by `prepare` (off the engine thread); its first batch
    then compiles nothing, and its rows are the torch engine's."""
    t, o = engines(tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, premerge_max_mb=64)
    slot = o.slots["detect"]
    job = o.backend.prepare(slot, TINY_IMAGE, o.adapters["detect"].head)
    built = job.result(timeout=120)
    assert {k[0] for k in built} == {"lower", "upper", "head"}
    compiled = dict(o.backend.compile_s)
    assert len(compiled) == 3
    batch = [request("detect", 2, 1)]
    got = o.execute(make_plan(batch, LoRAMode(PREMERGED), o.catalog()))
    want = t.execute(make_plan(batch, LoRAMode(PREMERGED), t.catalog()))
    assert o.backend.compile_s == compiled  # nothing compiled at the batch
    assert_rows_close(got[0].to_json(), want[0].to_json())
    assert o.backend.prepare(slot, TINY_IMAGE, o.adapters["detect"].head) is None  # all there: nothing to build


PROBE = """
import json, socket, sys
tried = []
real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo
socket.socket.connect = lambda self, addr: (tried.append(str(addr)), real_connect(self, addr))[1]
socket.getaddrinfo = lambda host, *a, **k: (tried.append(str(host)), real_lookup(host, *a, **k))[1]
if sys.argv[1] == "ours":
    from vlora_va.engine.backends.openvino import import_openvino
    ov = import_openvino()
else:
    import openvino as ov
import torch
import yaml
from openvino.tools.ovc import telemetry_utils
ov.convert_model(torch.nn.Linear(4, 2), example_input=torch.zeros(1, 4))
print(json.dumps({"telemetry": telemetry_utils.tm.__name__, "tried": tried}))
"""


def test_openvino_is_imported_and_converts_without_telemetry(tmp_path):
    """Importing openvino sends a usage event to Google Analytics, and converting sends more, unless the user
    opted out: through import_openvino, OpenVINO's no-op stand-in is used and no address is looked up."""
    def probe(how):
        home = tmp_path / how  # no consent file from an earlier opt-out; where telemetry keeps its client id
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "CI"}  # CI=true would opt out by itself
        env["HOME"] = str(home)
        r = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=120, env=env,
                           cwd=str(Path(__file__).resolve().parents[2]))
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1]), sorted(p.name for p in home.rglob("*"))
    ours, written = probe("ours")
    assert ours == {"telemetry": "openvino.tools.ovc.telemetry_stub", "tried": []} and written == [], (ours, written)
    plain, written = probe("plain")  # what the guard prevents: the real telemetry package at work
    assert plain["telemetry"] == "openvino_telemetry" and "openvino_ga_cid" in written, (plain, written)


def test_without_openvino_the_engine_falls_back_to_torch_and_says_why(tiny_backbone_dir, tiny_adapters, monkeypatch,
                                                                      caplog):
    monkeypatch.setitem(sys.modules, "openvino", None)  # what a missing package looks like to `import openvino`
    caplog.set_level(logging.WARNING, logger="vlora_va.engine.executor")
    t, o = engines(tiny_backbone_dir, tiny_adapters)
    assert o.backend_name == "torch" and type(o.backend).__name__ == "TorchBackbone"
    lines = [r.getMessage() for r in caplog.records if "openvino" in r.getMessage()]
    assert len(lines) == 1 and "cannot run here" in lines[0] and "OpenVINO does not load" in lines[0]
    fr = frames(2, 4)
    slots = [t.slots["detect"]] * 2
    torch.testing.assert_close(o.features(fr, slots).cls, t.features(fr, slots).cls)


def test_a_precision_it_does_not_compute_is_refused_by_name():
    from vlora_va.engine.backends.openvino import OpenVINOBackbone

    assert "precision fp16 is not built for it" in OpenVINOBackbone.unavailable(torch.device("cpu"), "fp16")
    assert OpenVINOBackbone.unavailable(torch.device("cpu"), "int8") is None
    assert "CPUs only" in OpenVINOBackbone.unavailable(torch.device("cuda"), "int8")


# ---------------------------------------------------------------- int8: NNCF-calibrated models
# Only the tests that calibrate need NNCF: without it they skip, and every other test of this file still runs.
needs_nncf = pytest.mark.skipif(importlib.util.find_spec("nncf") is None, reason="NNCF is not installed: "
                                "int8 calibration cannot run (the `calibrate` extra installs it)")


def int8_engine(backbone_dir, adapter_dirs, base=None):
    base = base if base is not None else load_backbone(str(backbone_dir))
    ads = {n: load_adapter_dir(n, p, 32) for n, p in adapter_dirs.items()}
    return Engine(copy.deepcopy(base), ads, TINY_IMAGE, backend="openvino", precision="int8")


@pytest.fixture
def int8_cache(tmp_path, monkeypatch):
    """A calibrated-model cache of the test's own (the session's OpenVINO cache is shared by every test)."""
    monkeypatch.setenv("VLORA_VA_OPENVINO_CACHE", str(tmp_path / "ov"))
    return tmp_path / "ov" / "int8"


def calibration_frames(n=12, seed=0):
    """Smooth frames (random pixels make activation ranges no image has)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        yy, xx = np.mgrid[0:TINY_IMAGE, 0:TINY_IMAGE] / TINY_IMAGE
        img = np.stack([np.sin(xx * rng.uniform(2, 9) + rng.uniform(0, 6)) * yy,
                        np.cos(yy * rng.uniform(2, 9)) * xx, xx * yy * rng.uniform(0, 1)], -1)
        out.append(((img - img.min()) / (np.ptp(img) + 1e-6) * 255).astype(np.uint8))
    return out


@needs_nncf
def test_int8_runs_the_calibrated_models_in_8_bits_close_to_float(tiny_backbone_dir, tiny_adapters, int8_cache):
    from vlora_va.engine.backends import openvino_int8 as Q
    from vlora_va.engine.backends.openvino import import_openvino, int8_hint, int8_layers
    from vlora_va.engine.precision import Capabilities
    from vlora_va.training.calibrate import calibrate_engine

    cal = int8_engine(tiny_backbone_dir, tiny_adapters)
    records = calibrate_engine(cal, {n: calibration_frames(seed=i) for i, n in enumerate(cal.adapters)}, "test")
    split = cal.backend.split([])
    assert [r["part"] for r in records] == [f"lower {TINY_IMAGE}px split {split}",
                                            f"upper {TINY_IMAGE}px split {split} (actions)",
                                            f"upper {TINY_IMAGE}px split {split} (detect)", "float hint"]
    assert len(list(int8_cache.glob("*.xml"))) == 3 and not any(r["kept"] for r in records[:-1])
    # a fresh engine (a daemon's start) reads them: every part int8, none converted from torch
    e = int8_engine(tiny_backbone_dir, tiny_adapters)
    t, _ = engines(tiny_backbone_dir, tiny_adapters)
    fr = calibration_frames(4, seed=9)
    slots = [e.slots["detect"], e.slots["actions"], e.slots["detect"], e.slots["actions"]]
    got, want = e.features(fr, slots), t.features(fr, slots)
    assert e.backend.uncalibrated == [] and all(k.endswith(" int8") for k in e.backend.compile_s), e.backend.compile_s
    assert len(e.backend._lower) == 1 and len(e.backend._upper) == 2  # (the tiny prefix, split 0, has no linear)
    assert all(int8_layers(m)[0] > 0 for m in e.backend._upper.values())
    # the float parts at the hint calibration measured faster here (each this CPU runs timed); a detection head at
    # bf16 where the CPU has it, else f32
    ov = import_openvino()
    bf16 = Capabilities.detect("cpu").native_bf16
    hint = json.loads((int8_cache / Q.HINT_FILE).read_text()) if bf16 else {"hint": "f32", "seconds": {"f32": 0}}
    assert records[-1]["part"] == "float hint" and records[-1]["hint"] == hint["hint"] == int8_hint()
    assert set(hint["seconds"]) == set(Q.float_hints(bf16))
    parts = list(e.backend._lower.values()) + list(e.backend._upper.values())
    assert all(m.get_property("INFERENCE_PRECISION_HINT") == getattr(ov.Type, hint["hint"]) for m in parts)
    head = e.backend._compile_head(e.adapters["detect"].head, TINY_IMAGE, e.slots["detect"])
    assert head.get_property("INFERENCE_PRECISION_HINT") == (ov.Type.bf16 if bf16 else ov.Type.f32)
    cos = torch.nn.functional.cosine_similarity(got.grid.flatten(2), want.grid.flatten(2), dim=1)
    assert cos.min() > 0.95, cos.min()
    assert (got.cls - want.cls).abs().max() > 1e-4  # quantized: not the float model under another name
    # calibrating again keeps what is there
    assert all(r["kept"] for r in calibrate_engine(cal, {n: calibration_frames() for n in cal.adapters}, "test"))


@needs_nncf
def test_int8_without_calibrated_models_runs_in_float_and_names_each_part(tiny_backbone_dir, tiny_adapters,
                                                                         int8_cache, caplog, tmp_path):
    from vlora_va.engine.backends.openvino import int8_hint
    from vlora_va.training.calibrate import calibrate_engine

    caplog.set_level(logging.WARNING, logger="vlora_va.engine.backends.openvino")
    e = int8_engine(tiny_backbone_dir, {"detect": tiny_adapters["detect"]})
    fr = frames(2, 3)
    got = e.features(fr, [e.slots["detect"]] * 2)
    assert len(e.backend.uncalibrated) == 2 and len([r for r in caplog.records if "no calibrated" in r.getMessage()]) == 2
    f = Engine(load_backbone(str(tiny_backbone_dir)), {"detect": load_adapter_dir("detect", tiny_adapters["detect"], 32)},
               TINY_IMAGE, backend="openvino", precision={"f32": "fp32", "bf16": "bf16"}[int8_hint()])
    torch.testing.assert_close(got.cls, f.features(fr, [f.slots["detect"]] * 2).cls)  # the float model, same hint
    # calibrated, then an adapter loaded at run time: its suffix has no model, the shared prefix has
    calibrate_engine(e, {"detect": calibration_frames()}, "test")
    e.load("other", upper_only_adapter(tmp_path / "up", tiny_adapters["detect"], 7))
    e.backend.uncalibrated.clear()
    e.features(fr, [e.slots["detect"], e.slots["other"]])
    assert [w.split()[0] for w in e.backend.uncalibrated] == ["upper"]
    assert e.backend.uncalibrated[0].endswith(f"slot {e.slots['other']}")


def test_the_calibrated_models_key_names_what_they_depend_on(tmp_path):
    from vlora_va.engine.backends import openvino_int8 as Q

    key = Q.part_key("upper", "base", 336, 8, "adapter-a", False, "2026.4.1")
    paths = {Q.model_path(tmp_path, key)}
    for change in ({"backbone": "other"}, {"size": 224}, {"split": 10}, {"adapter": "adapter-b"},
                   {"overflow_fix": True}, {"openvino": "2027.0"}):
        paths.add(Q.model_path(tmp_path, {**key, **change}))
    assert len(paths) == 7
    assert Q.part_key("lower", "base", 336, 8, "adapter-a", False, "v")["adapter"] is None  # shared by every adapter
    assert Q.cached(tmp_path, key) is None
    path = Q.model_path(tmp_path, key)  # a model whose provenance names another key is never read
    for suffix in (".xml", ".bin"):
        path.with_suffix(suffix).write_text("x")
    path.with_suffix(".json").write_text(json.dumps({"key": {**key, "split": 9}}))
    assert Q.cached(tmp_path, key) is None
    path.with_suffix(".json").write_text(json.dumps({"key": key}))
    assert Q.cached(tmp_path, key) == path
    # the gate entry follows what this CPU computes: the float parts' hint, the head's, 7-bit weights without VNNI
    assert [Q.gate_name(True, True, "f32"), Q.gate_name(True, True, "bf16"), Q.gate_name(False, True, "f32"),
            Q.gate_name(False, False, "f32")] == \
        ["openvino-int8-f32-bf16-head", "openvino-int8-bf16", "openvino-int8-f32", "openvino-int8-f32-7bit"]


def test_the_float_hint_is_the_one_measured_for_this_cpu_openvino_and_threads(tmp_path, monkeypatch):
    from vlora_va.engine.backends import openvino_int8 as Q

    key = Q.hint_key("EPYC (AVX512)", "2026.4.1", 2)
    assert Q.read_hint(tmp_path, key) == "f32" and Q.recorded_hint(tmp_path, key) is None  # nothing measured: f32
    # bf16 only when at least BF16_MARGIN faster (f32 is the more accurate)
    assert Q.write_hint(tmp_path, key, {"f32": 1.0, "bf16": 1.0 - Q.BF16_MARGIN / 2}) == "f32"
    assert Q.write_hint(tmp_path, key, {"f32": 1.0, "bf16": 1.0 - 2 * Q.BF16_MARGIN}) == "bf16"
    assert Q.read_hint(tmp_path, key) == "bf16"
    for other in ({"cpu": "Xeon (AVX512)"}, {"openvino": "2027.0"}, {"threads": 4}):
        assert Q.read_hint(tmp_path, {**key, **other}) == "f32"  # measured on another machine or set-up
    monkeypatch.setattr(Q, "HINT_OVERRIDE", "f32")
    assert Q.read_hint(tmp_path, key) == "f32"
    (tmp_path / Q.HINT_FILE).write_text("{not json")
    monkeypatch.setattr(Q, "HINT_OVERRIDE", None)
    assert Q.read_hint(tmp_path, key) == "f32"


@needs_nncf
def test_auto_offers_openvino_int8_only_calibrated_and_gated(tiny_backbone_dir, tiny_adapters, int8_cache):
    from vlora_va.engine import precision_choice as A
    from vlora_va.engine.backends import openvino_int8 as Q
    from vlora_va.engine.backends.openvino import int8_hint
    from vlora_va.engine.precision import Capabilities
    from vlora_va.training.calibrate import calibrate_engine

    caps = Capabilities.detect("cpu")
    base = load_backbone(str(tiny_backbone_dir))
    ads = {n: load_adapter_dir(n, p, 32) for n, p in tiny_adapters.items()}
    sizes = {n: TINY_IMAGE for n in ads}
    why, parts = A.openvino_int8_gate(caps, base, ads, sizes)
    assert "no calibrated int8 model for actions" in why and parts == {}
    calibrate_engine(int8_engine(tiny_backbone_dir, tiny_adapters, base), {n: calibration_frames() for n in ads}, "t")
    why, parts = A.openvino_int8_gate(caps, base, ads, sizes)
    variant = Q.gate_name(caps.native_bf16, caps.vnni, int8_hint())
    assert why.startswith(f"adapter detect has no accuracy-gate result for {variant} (`vlora-va models calibrate")
    assert set(parts) == {TINY_IMAGE}
    # gated: a candidate, timed through the calibrated parts
    gate = {"bf16": None, "int8": None, A.OPENVINO_INT8: None}
    bf16_cpu = Capabilities("cpu", "AVX512", True, True, True)
    assert A.candidates(bf16_cpu, gate, auto_backend=True)[0][-1] == "openvino-int8"
    assert A.split_choice("openvino-int8") == ("openvino", "int8")
    shut = {**gate, A.OPENVINO_INT8: why}
    usable, notes = A.candidates(bf16_cpu, shut, auto_backend=True)
    assert "openvino-int8" not in usable and f"openvino-int8: {why}" in notes
    speeds = A.measure_speeds(base, ["openvino-fp32", "openvino-int8"], {TINY_IMAGE: 2.0}, rounds=1, parts={"openvino": parts})
    assert set(speeds) == {"openvino-fp32", "openvino-int8"} and all(t > 0 for t in speeds.values())


@needs_nncf
def test_models_calibrate_on_a_pipeline_file_then_keeps_what_is_there(tiny_backbone_dir, tiny_adapters, int8_cache,
                                                                     tmp_path, capsys):
    from tests.pipeline_helpers import tiny_pipeline
    from vlora_va import cli

    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, [{"id": "a"}])
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["models", "calibrate", str(path), "--range", "0-4"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("lower", "upper"))]
    assert len(said) == 2 and all("calibrated in" in line for line in said), said
    assert cli.main(["models", "calibrate", str(path), "--range", "0-4"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("lower", "upper"))]
    assert len(said) == 2 and all(": kept (" in line for line in said), said
    assert cli.main(["models", "calibrate", str(path), "--range", "four"]) == 2
    cfg["streams"][0]["source"] = "rtsp://127.0.0.1:1/none"  # no file camera: nothing to calibrate on
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["models", "calibrate", str(path)]) == 1


@pytest.mark.parametrize("native_bf16, gate, want", [(True, None, "bf16"), (False, None, "fp32"),
                                                     (True, "adapter detect failed the accuracy gate", "fp32")])
def test_auto_on_the_openvino_backend_takes_bf16_only_where_native_and_gated(native_bf16, gate, want):
    """The torch engine's speed probe says nothing of this backend's: auto takes bf16 where the CPU computes it
    natively and the adapters' bf16 gate passed, else fp32 (its int8 where calibrated and gated: build_engine)."""
    from vlora_va.engine import precision_choice
    from vlora_va.engine.precision import Capabilities

    choice = precision_choice.float_precision(Capabilities("cpu", "AVX512", native_bf16, True, True), {"bf16": gate})
    assert choice.precision == want and (gate is None or gate in choice.reason)


def test_the_profile_key_names_the_backend_and_its_precision(tiny_backbone_dir, tiny_adapters):
    """A cost profile measured on one backend or precision is never read for another."""
    from vlora_va.serving import profiling

    keys = {}
    for backend, precision in (("torch", "fp32"), ("openvino", "fp32"), ("openvino", "bf16")):
        e = Engine(load_backbone(str(tiny_backbone_dir)), {"detect": load_adapter_dir("detect", tiny_adapters["detect"],
                                                                                      32)},
                   TINY_IMAGE, backend=backend, precision=precision)
        keys[backend, precision] = profiling.profile_key(e.device, "tiny", e.backbone, e.catalog(), {"detect": 4},
                                                         ["premerged"], e.backend_name, e.precision)
    assert len({json.dumps(k, sort_keys=True) for k in keys.values()}) == 3
    assert keys["openvino", "bf16"]["precision"] == "bf16" and keys["openvino", "fp32"]["backend"] == "openvino"


def test_a_daemon_on_the_openvino_backend_compiles_before_ready_and_serves(tiny_backbone_dir, tiny_adapters, tmp_path,
                                                                          caplog):
    """`daemon.backend: openvino`: warm-up compiles every model the plans need (none compiles while serving), and
    the rows equal a torch daemon's on the same chunks."""
    from tests.serving.test_daemon import RunningDaemon, chunk_parts, config

    caplog.set_level(logging.INFO, logger="vlora_va.engine.backends.openvino")
    rows = {}
    for backend in ("openvino", "torch"):
        d = RunningDaemon(config(tmp_path / backend, tiny_backbone_dir, tiny_adapters, backend=backend))
        assert d.daemon.engine.backend_name == backend
        compiled_at_ready = dict(getattr(d.daemon.engine.backend, "compile_s", {}))
        for seq in range(3):
            d.send(chunk_parts("cam", seq, [("det", "detect"), ("act", "actions")], n_frames=2))
        rows[backend] = sorted(d.finish(), key=lambda r: (r["chunk"], r["task"]))
        if backend == "openvino":
            assert compiled_at_ready and d.daemon.engine.backend.compile_s == compiled_at_ready
            assert not [r for r in caplog.records if "while serving" in r.getMessage()]
    assert [(r["chunk"], r["task"], r["status"]) for r in rows["openvino"]] == \
        [(s, t, "ok") for s in range(3) for t in ("act", "det")]
    for got, want in zip(rows["openvino"], rows["torch"]):  # what each task answered: boxes, labels, scores
        answer = [k for k in ("frames", "label", "score", "scores") if k in want]
        assert answer and all(k in got for k in answer)
        assert_rows_close({k: got[k] for k in answer}, {k: want[k] for k in answer})


def test_warm_up_builds_each_adapters_models_at_its_own_size_only(tiny_backbone_dir, tmp_path):
    """An adapter is served at its own image size only: warm-up builds none of its models at another size (here a
    float model nothing would run; at ViT-S ~1 s and ~100 MB each, and in int8 an uncalibrated one)."""
    from vlora_va.serving import profiling
    from vlora_va.testing.tiny import make_adapter

    big = 2 * TINY_IMAGE
    dirs = {"small": make_adapter(tmp_path / "small", "detection", ["person"], seed=1),
            "big": make_adapter(tmp_path / "big", "action", ["a", "b"], seed=2, image_size=big)}
    e = Engine(load_backbone(str(tiny_backbone_dir)), {n: load_adapter_dir(n, p, 32) for n, p in dirs.items()}, big,
               backend="openvino", precision="fp32")
    catalog = e.catalog()
    assert {n: a.size for n, a in catalog.adapters.items()} == {"small": TINY_IMAGE, "big": big}
    profiling.warm_up(e, catalog, {s: [LoRAMode(PREMERGED)] for s in catalog.sizes}, [1, 2])
    built = {(k.split()[0], k.split("px")[0].split()[-1], k.rsplit(" ", 1)[-1]) for k in e.backend.compile_s
             if not k.startswith("lower")}
    assert built == {("upper", str(TINY_IMAGE), str(e.slots["small"])), ("upper", str(big), str(e.slots["big"])),
                     ("detection", str(TINY_IMAGE), str(e.slots["small"]))}


# ---------------------------------------------------------------- daemon.backend: auto
def test_auto_backend_candidates_add_openvinos_float_precisions_under_the_same_gate(monkeypatch):
    from vlora_va.engine import precision_choice as A
    from vlora_va.engine.precision import Capabilities

    bf16_cpu = Capabilities("cpu", "AVX512", True, True, True)
    open_gate = {"bf16": None, "int8": None}
    assert A.candidates(bf16_cpu, open_gate)[0] == ["fp32", "bf16", "int8"]  # backend torch: as before
    assert A.candidates(bf16_cpu, open_gate, auto_backend=True)[0] == ["fp32", "bf16", "int8", "openvino-fp32",
                                                                   "openvino-bf16"]
    no_bf16 = Capabilities("cpu", "AVX2", False, False, True)
    assert A.candidates(no_bf16, open_gate, auto_backend=True)[0] == ["fp32", "int8", "openvino-fp32"]
    shut = {"bf16": "adapter detect failed the accuracy gate for bf16", "int8": None}
    assert "openvino-bf16" not in A.candidates(bf16_cpu, shut, auto_backend=True)[0]
    # the choice names its backend; a measured openvino bf16 ahead by more than the margin wins
    speeds = {"fp32": 1.0, "bf16": 0.62, "int8": 0.55, "openvino-fp32": 0.81, "openvino-bf16": 0.45}
    choice = A.choose("auto", bf16_cpu, open_gate, speeds, auto_backend=True)
    assert choice.precision == "openvino-bf16" and A.split_choice(choice.precision) == ("openvino", "bf16")
    assert A.split_choice("int8") == ("torch", "int8")
    monkeypatch.setitem(sys.modules, "openvino", None)  # not installed: torch's candidates only, and why
    usable, notes = A.candidates(bf16_cpu, open_gate, auto_backend=True)
    assert usable == ["fp32", "bf16", "int8"] and any(n.startswith("openvino: OpenVINO does not load") for n in notes)


def test_auto_backend_times_openvino_like_the_torch_precisions(tiny_backbone_dir):
    """The start-up probe times the plain backbone compiled by OpenVINO on the pipeline's own mix of sizes, as it
    times torch's precisions; its output is the torch model's."""
    from vlora_va.engine import precision_choice as A
    from vlora_va.engine.backends.openvino import PlainOpenVINO

    base = load_backbone(str(tiny_backbone_dir))
    speeds = A.measure_speeds(base, ["fp32", "openvino-fp32"], {TINY_IMAGE: 3.0, 2 * TINY_IMAGE: 1.0}, rounds=1)
    assert set(speeds) == {"fp32", "openvino-fp32"} and all(t > 0 for t in speeds.values())
    x = torch.randn(2, 3, TINY_IMAGE, TINY_IMAGE)
    with torch.no_grad():
        want = base(pixel_values=x).last_hidden_state
    assert np.allclose(PlainOpenVINO(base, "fp32")(pixel_values=x), want.numpy(), atol=2e-5)


def test_a_daemon_with_backend_auto_builds_the_backend_it_chose(tiny_backbone_dir, tiny_adapters, tmp_path, caplog,
                                                                quiet_machine):
    from tests.pipeline_helpers import tiny_pipeline
    from vlora_va.contracts.config import ConfigError, parse_config
    from vlora_va.engine import precision_choice as A
    from vlora_va.serving.startup import build_engine

    cfg = tiny_pipeline(tmp_path, tiny_backbone_dir, tiny_adapters, [{"id": "a"}])
    cfg["daemon"]["backend"] = "auto"
    caplog.set_level(logging.INFO, logger="vlora_va")
    engine, failed = build_engine(parse_config(yaml.safe_dump(cfg), "p.yaml"))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("backbone precision")]
    assert not failed and len(said) == 1
    speeds = json.loads(next((tmp_path / "profiles").glob("precision-*.json")).read_text())
    assert "openvino-fp32" in speeds["speeds"] and speeds["key"]["openvino"]  # it competed, under its own key
    backend, precision = A.split_choice(speeds["choice"])
    assert (engine.backend_name, engine.precision) == (backend, precision), said
    assert said[0].endswith(f"(backend {backend})")
    cfg["daemon"]["backend"] = "fastest"
    with pytest.raises(ConfigError, match="daemon.backend"):
        parse_config(yaml.safe_dump(cfg), "p.yaml")


def test_appearance_embeddings_equal_the_torch_engines(tiny_backbone_dir, tiny_adapters, tmp_path):
    """The openvino backend's LoRA-free lower part ends where the torch engine taps its tokens (block 1 here): the
    embeddings of a request that asks are the torch engine's, and one that does not ask gets none."""
    from tests.engine.test_appearance import embed_request

    adapters = {"up1": upper_only_adapter(tmp_path / "up1", tiny_adapters["detect"], 3)}
    adapters["up1"].head.score_threshold = 0.0
    t, o = engines(tiny_backbone_dir, adapters)
    shared = frames(2, 7)
    got, want = (e.execute(make_plan([embed_request("up1", [f.copy() for f in shared], True),
                                      embed_request("up1", [f.copy() for f in shared], False, seq=1)],
                                     e.default_mode(), e.catalog())) for e in (o, t))
    assert sum(len(f.detections) for f in want[0].frames) > 0
    for g, w in zip(got[0].frames, want[0].frames):
        for a, b in zip(g.detections, w.detections):
            np.testing.assert_allclose(a.embedding.astype(np.float32), b.embedding.astype(np.float32), atol=5e-3)
    assert all(d.embedding is None for f in got[1].frames for d in f.detections)
