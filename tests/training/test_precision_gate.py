"""The accuracy gate measured on the user's machine (training/precision_gate.py): a variant this CPU maps to that
no shipped entry covers is scored against the shipped reference, recorded in the machine's cache (never in the
repository), and then opens that variant to `precision: auto`."""

from __future__ import annotations

import json
import logging

import pytest

from tests.conftest import unavailable
from vlora_va.engine import precision_choice as A
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.precision import Capabilities, gate_key
from vlora_va.testing.tiny import TINY_IMAGE, make_adapter
from vlora_va.training import precision_gate as G
from vlora_va.training.evaluate import load_human_set


@pytest.fixture
def gates(machine_gates):
    """This test's own machine-gate cache (conftest.py)."""
    return machine_gates


@pytest.fixture(scope="module")
def gated_adapters(tmp_path_factory):
    """Tiny adapters named as the shipped ones (the reference holds labels for those names), the activity one on
    8-frame clips as the reference's are; no GATE_FILE beside them."""
    root = tmp_path_factory.mktemp("gated")
    return {"detect": make_adapter(root / "detect", "detection", ["person", "car"], seed=1),
            "actions": make_adapter(root / "actions", "action", ["standing", "walking"], seed=2, clip_len=8)}


def loaded(dirs):
    return {n: load_adapter_dir(n, p, 32) for n, p in dirs.items()}


def test_a_gate_measured_here_is_cached_per_machine_and_opens_the_variant(tiny_backbone_dir, gated_adapters, gates):
    adapters = loaded(gated_adapters)
    variant = gate_key("int8")  # torch int8 as this CPU computes it (8- or 7-bit activations)
    assert "vlora-va models calibrate" in A.gate_allows(adapters, "int8")  # measured nowhere: off, and says how
    before = {p: p.read_bytes() for d in gated_adapters.values() for p in d.iterdir()}

    records = G.measure_missing(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, [variant])

    assert [(r["adapter"], r["variant"], r["kept"]) for r in records] == [("detect", variant, False),
                                                                          ("actions", variant, False)], records
    assert all("error" not in r for r in records), records
    files = sorted(gates.glob("gate-*.json"))
    assert len(files) == 2
    for name, a in adapters.items():
        entry = A.gate_of(a)[variant]
        record = next(r for r in records if r["adapter"] == name)
        assert entry["passes"] == record["passes"] and entry["summary"] == record["summary"]
        assert "this machine" in entry["measured_on"]
        key = next(json.loads(f.read_text())["key"] for f in files
                   if json.loads(f.read_text())["key"]["adapter_sha256"] == A.adapter_digest(a))
        assert key == A.machine_gate_key(a, variant) and key["torch"] and key["variant"] == variant
    passed = all(r["passes"] for r in records)
    assert (A.gate_allows(adapters, "int8") is None) == passed, A.gate_allows(adapters, "int8")
    # the repository's files are never written: the adapters' folders are as they were
    assert {p: p.read_bytes() for d in gated_adapters.values() for p in d.iterdir()} == before
    # a second calibrate keeps what is measured
    again = G.measure_missing(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, [variant])
    assert all(r["kept"] for r in again) and sorted(gates.glob("gate-*.json")) == files


def test_a_machine_gate_is_read_only_for_the_same_weights_and_libraries(tiny_backbone_dir, gated_adapters, gates,
                                                                         tmp_path):
    a = loaded(gated_adapters)["detect"]
    ok = {"passes": True, "summary": "x", "measured_on": "test"}
    A.write_machine_gate(a, "openvino-int8-f32", ok)
    assert A.gate_of(a)["openvino-int8-f32"] == ok
    path = next(gates.glob("gate-*.json"))
    record = json.loads(path.read_text())
    record["key"]["openvino"] = "1999.0"  # measured with another OpenVINO: not this machine's gate any more
    path.write_text(json.dumps(record))
    assert "openvino-int8-f32" not in A.gate_of(a)
    other = load_adapter_dir("detect", make_adapter(tmp_path / "other", "detection", ["person", "car"], seed=7), 32)
    A.write_machine_gate(other, "openvino-int8-f32", ok)  # other weights' entry: not this adapter's
    assert "openvino-int8-f32" not in A.gate_of(a)
    path.write_text("{half a file")  # a damaged record is skipped, not fatal
    assert A.gate_of(a) == {}


def test_a_shipped_entry_wins_over_a_machine_one(gated_adapters, gates, tmp_path):
    import shutil

    d = shutil.copytree(gated_adapters["detect"], tmp_path / "detect")
    a = load_adapter_dir("detect", d, 32)
    (d / A.GATE_FILE).write_text(json.dumps({"adapter_sha256": A.adapter_digest(a),
                                             "precisions": {"bf16": {"passes": False, "summary": "shipped"}}}))
    A.write_machine_gate(a, "bf16", {"passes": True, "summary": "here"})
    A.write_machine_gate(a, "int8", {"passes": True, "summary": "here"})
    assert A.gate_of(a)["bf16"]["summary"] == "shipped" and A.gate_of(a)["int8"]["summary"] == "here"


def test_an_adapter_without_reference_labels_is_said_not_gated(tiny_backbone_dir, gated_adapters, gates, tmp_path):
    adapters = loaded({"mine": make_adapter(tmp_path / "mine", "detection", ["person"], seed=3)})
    records = G.measure_missing(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, ["int8"])
    assert records[0]["adapter"] == "mine" and "holds no detection labels for it" in records[0]["error"]
    assert not list(gates.glob("gate-*.json")) and "int8" not in A.gate_of(adapters["mine"])


def test_an_openvino_variant_without_calibrated_models_is_not_gated(tiny_backbone_dir, gated_adapters, gates,
                                                                    tmp_path, monkeypatch):
    """Its engine would run float stand-ins: a gate measured on those would open an int8 nobody checked."""
    from vlora_va.engine.backends.openvino import openvino_problem

    if openvino_problem():
        unavailable(f"OpenVINO cannot run here: {openvino_problem()}")
    monkeypatch.setenv("VLORA_VA_OPENVINO_CACHE", str(tmp_path / "ov"))
    adapters = loaded(gated_adapters)
    records = G.measure_missing(load_backbone(str(tiny_backbone_dir)), adapters, TINY_IMAGE, ["openvino-int8-f32"])
    assert all("no calibrated int8 model" in r["error"] for r in records), records
    assert not list(gates.glob("gate-*.json"))


def test_the_shipped_reference_names_real_frames_of_the_held_out_range():
    """Every frame the reference labels decodes from the sample video, and each clip is a 1-s window."""
    reference = G.load_reference()
    assert set(reference) >= {"detect", "actions", "actions-persons"}
    hs = load_human_set()
    shipped = {n: load_adapter_dir(n, G.ROOT / "adapters" / n, 384) for n in ("detect", "actions")}
    data = G.reference_data(shipped["detect"], reference, hs)
    assert len(data["teacher_keys"]) == 49 and set(data["teacher_keys"]) <= {f.key for f in data["frames"]}
    assert data["human_keys"] and all(k in data["human"] for k in data["human_keys"])
    clips = G.reference_data(shipped["actions"], reference, hs)
    assert len(clips["clips"]) == len(clips["labels"]) == 48
    for frames, start in zip(clips["clips"], clips["starts"]):
        assert len(frames) == 8 and all(start - 1e-6 <= f.t < start + 1.0 for f in frames)


def test_the_variants_this_cpu_maps_to_and_the_line_a_daemon_says(gated_adapters, gates, caplog):
    vnni_no_bf16 = Capabilities("cpu", "AVX512", native_bf16=False, vnni=True, int8_kernels=True)
    amx = Capabilities("cpu", "AVX512", native_bf16=True, vnni=True, int8_kernels=True)
    avx2 = Capabilities("cpu", "AVX2", native_bf16=False, vnni=False, int8_kernels=True)
    assert A.variants_here(vnni_no_bf16) == [gate_key("int8")]
    assert A.variants_here(amx)[0] == "bf16" and A.variants_here(avx2) == [gate_key("int8")]
    adapters = loaded(gated_adapters)
    with caplog.at_level(logging.WARNING, logger="vlora_va"):
        A.say_unmeasured(vnni_no_bf16, adapters)
    lines = [r.getMessage() for r in caplog.records if "no accuracy gate" in r.getMessage()]
    assert len(lines) == 1 and A.MEASURE_COMMAND in lines[0] and "adapters actions, detect" in lines[0], lines
    for a in adapters.values():
        A.write_machine_gate(a, gate_key("int8"), {"passes": True, "summary": "here"})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vlora_va"):
        A.say_unmeasured(vnni_no_bf16, adapters)
    assert not [r for r in caplog.records if "no accuracy gate" in r.getMessage()]
