"""The TF.js → frozen GraphDef converter, on small graphs built here, each run by OpenVINO's TensorFlow reader and
checked against a plain torch reference of the same computation.

Every rewrite of tfjs_convert.py has a test that fails without it: fused conv / depthwise / matmul splits (each
activation), int64 constants stored as int32, scalar constants, fp16 and uint8 weights, and boolean attributes
that are false."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vlora_va.training.tf_graph_proto import AttrValue
from vlora_va.training.tfjs_convert import ConversionError, convert, to_openvino


def b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def attr_list_i(values):
    return {"list": {"i": [str(v) for v in values]}}


class GraphBuilder:
    """A TF.js graph model written the way the TF.js converter writes one: topology JSON + one weight shard."""

    def __init__(self):
        self.nodes, self.weights, self.blob = [], [], b""

    def placeholder(self, name, shape, dtype="DT_FLOAT"):
        self.nodes.append({"name": name, "op": "Placeholder", "attr": {
            "dtype": {"type": dtype}, "shape": {"shape": {"dim": [{"size": str(s)} for s in shape]}}}})
        return name

    def const(self, name, value: np.ndarray, declared="DT_FLOAT", stored=None, quantization=None):
        """A weight: the node declares `declared`, the manifest stores `stored` (TF.js: int64 → int32)."""
        self.nodes.append({"name": name, "op": "Const", "attr": {
            "dtype": {"type": declared},
            "value": {"tensor": {"dtype": declared, "tensorShape": {"dim": [{"size": str(s)} for s in value.shape]}}}}})
        stored = stored or {"DT_FLOAT": "float32", "DT_INT32": "int32", "DT_INT64": "int32"}[declared]
        entry = {"name": name, "shape": list(value.shape), "dtype": stored}
        if quantization == "float16":
            data = value.astype(np.float16).tobytes()
            entry["quantization"] = {"dtype": "float16", "original_dtype": "float32"}
        elif quantization == "uint8":
            lo, scale = float(value.min()), float(value.max() - value.min()) / 255 or 1.0
            data = np.round((value - lo) / scale).astype(np.uint8).tobytes()
            entry["quantization"] = {"dtype": "uint8", "min": lo, "scale": scale, "original_dtype": "float32"}
        else:
            data = value.astype({"float32": np.float32, "int32": np.int32}[stored]).tobytes()
        self.weights.append(entry)
        self.blob += data
        return name

    def op(self, name, op, inputs, **attr):
        self.nodes.append({"name": name, "op": op, "input": list(inputs), "attr": {"T": {"type": "DT_FLOAT"}, **attr}})
        return name

    def write(self, folder):
        (folder / "w.bin").write_bytes(self.blob)
        model = {"format": "graph-model", "modelTopology": {"node": self.nodes, "versions": {"producer": 1395}},
                 "weightsManifest": [{"paths": ["w.bin"], "weights": self.weights}]}
        path = folder / "model.json"
        path.write_text(json.dumps(model))
        return path


def run_openvino(model_json, tmp_path, x):
    from vlora_va.engine.backends.openvino import import_openvino

    to_openvino(model_json, tmp_path / "ir" / "m.xml")
    ov = import_openvino()
    compiled = ov.Core().compile_model(str(tmp_path / "ir" / "m.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled(x)[compiled.outputs[0]]


def conv_attrs(fused_ops, padding="SAME", **extra):
    return {"strides": attr_list_i([1, 1, 1, 1]), "padding": {"s": b64(padding)}, "data_format": {"s": b64("NHWC")},
            "dilations": attr_list_i([1, 1, 1, 1]), "fused_ops": {"list": {"s": [b64(o) for o in fused_ops]}},
            "num_args": {"i": str(2 if fused_ops[-1] == "Prelu" else 1)}, "epsilon": {"f": 0}, **extra}


def act_ref(y: torch.Tensor, act: str, alpha=None) -> torch.Tensor:
    return {"Relu": F.relu, "Relu6": F.relu6, "Elu": F.elu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh,
            "Selu": F.selu, "LeakyRelu": lambda t: F.leaky_relu(t, 0.2),
            "Prelu": lambda t: torch.where(t > 0, t, alpha * t), "none": lambda t: t}[act](y)


@pytest.mark.parametrize("act", ["none", "Relu", "Relu6", "LeakyRelu", "Prelu", "Elu", "Sigmoid"])
def test_fused_conv2d_is_split_into_conv_bias_activation(tmp_path, act):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 6, 6, 3)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 4)).astype(np.float32)  # HWIO
    b = rng.normal(size=(4,)).astype(np.float32)
    alpha = rng.uniform(0.1, 0.5, size=(4,)).astype(np.float32)
    g = GraphBuilder()
    inputs = [g.placeholder("x", x.shape), g.const("w", w), g.const("b", b)]
    fused_ops = ["BiasAdd"] + ([] if act == "none" else [act])
    extra = {"leakyrelu_alpha": {"f": 0.2}} if act == "LeakyRelu" else {}
    if act == "Prelu":
        inputs.append(g.const("alpha", alpha))
    g.op("y", "_FusedConv2D", inputs, **conv_attrs(fused_ops, **extra))
    got = run_openvino(g.write(tmp_path), tmp_path, x)
    ref = F.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(3, 2, 0, 1),
                   torch.from_numpy(b), padding=1)
    ref = act_ref(ref, act, torch.from_numpy(alpha)[None, :, None, None]).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_fused_depthwise_is_split(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 5, 5, 4)).astype(np.float32)
    w = rng.normal(size=(3, 3, 4, 1)).astype(np.float32)  # H, W, C, multiplier
    b = rng.normal(size=(4,)).astype(np.float32)
    g = GraphBuilder()
    g.op("y", "FusedDepthwiseConv2dNative", [g.placeholder("x", x.shape), g.const("w", w), g.const("b", b)],
         **conv_attrs(["BiasAdd", "Relu6"], padding="VALID"))
    got = run_openvino(g.write(tmp_path), tmp_path, x)
    ref = F.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(2, 3, 0, 1),
                   torch.from_numpy(b), groups=4)
    np.testing.assert_allclose(got, F.relu6(ref).permute(0, 2, 3, 1).numpy(), rtol=1e-4, atol=1e-4)


def test_fused_matmul_is_split_and_false_booleans_are_written(tmp_path):
    """transpose_a is false: written as a oneof member, the reader sees `b: false`, not a valueless attribute."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5)).astype(np.float32)
    w = rng.normal(size=(3, 5)).astype(np.float32)  # transpose_b
    b = rng.normal(size=(3,)).astype(np.float32)
    g = GraphBuilder()
    g.op("y", "_FusedMatMul", [g.placeholder("x", x.shape), g.const("w", w), g.const("b", b)],
         transpose_a={"b": False}, transpose_b={"b": True}, fused_ops={"list": {"s": [b64("BiasAdd"), b64("Relu")]}},
         num_args={"i": "1"}, epsilon={"f": 0})
    got = run_openvino(g.write(tmp_path), tmp_path, x)
    np.testing.assert_allclose(got, np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-5)
    assert AttrValue(b=False).SerializeToString() != b"", "a false boolean attribute must be serialized"


def test_int64_constant_stored_as_int32_gets_its_dtype_back(tmp_path):
    """Reshape's shape declared DT_INT64 and stored as int32 (as TF.js does): read as int64 bytes, [3, 4] would
    be one garbage number."""
    x = np.arange(12, dtype=np.float32).reshape(1, 12)
    g = GraphBuilder()
    g.op("y", "Reshape", [g.placeholder("x", x.shape), g.const("shape", np.array([3, 4]), declared="DT_INT64")],
         Tshape={"type": "DT_INT64"})
    got = run_openvino(g.write(tmp_path), tmp_path, x)
    np.testing.assert_array_equal(got, x.reshape(3, 4))


def test_scalar_constant_concat_axis(tmp_path):
    """ConcatV2's axis is a scalar constant: it must concatenate on axis 2, not axis 0."""
    a = np.ones((1, 2, 3), np.float32)
    g = GraphBuilder()
    g.op("y", "ConcatV2", [g.placeholder("a", a.shape), g.placeholder("b", a.shape),
                           g.const("axis", np.array(2, np.int32), declared="DT_INT32")],
         N={"i": "2"}, Tidx={"type": "DT_INT32"})
    pb, _ = convert(g.write(tmp_path))
    from vlora_va.training.tf_graph_proto import GraphDef

    node = next(n for n in GraphDef.FromString(pb).node if n.name == "axis")
    assert list(node.attr["value"].tensor.int_val) == [2] and not node.attr["value"].tensor.tensor_content
    from vlora_va.engine.backends.openvino import import_openvino

    to_openvino(tmp_path / "model.json", tmp_path / "ir" / "m.xml")
    compiled = import_openvino().Core().compile_model(str(tmp_path / "ir" / "m.xml"), "CPU")
    assert tuple(compiled.outputs[0].get_shape()) == (1, 2, 6)


@pytest.mark.parametrize("quantization", ["float16", "uint8"])
def test_quantized_weights_are_dequantized(tmp_path, quantization):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    g = GraphBuilder()
    g.op("y", "MatMul", [g.placeholder("x", x.shape), g.const("w", w, quantization=quantization)],
         transpose_a={"b": False}, transpose_b={"b": False})
    got = run_openvino(g.write(tmp_path), tmp_path, x)
    step = float(w.max() - w.min()) / 255
    tol = 2e-3 if quantization == "float16" else step * np.abs(x).sum(1).max()
    np.testing.assert_allclose(got, x @ w, atol=tol)


def test_unsupported_fusion_names_the_node(tmp_path):
    g = GraphBuilder()
    g.op("conv_bn", "_FusedConv2D", [g.placeholder("x", (1, 4, 4, 3)), g.const("w", np.ones((1, 1, 3, 2), np.float32)),
                                     g.const("b", np.ones(2, np.float32))], **conv_attrs(["FusedBatchNorm"]))
    with pytest.raises(ConversionError, match="conv_bn.*FusedBatchNorm"):
        convert(g.write(tmp_path))


def test_short_weight_shard_names_the_weight(tmp_path):
    g = GraphBuilder()
    g.op("y", "MatMul", [g.placeholder("x", (1, 4)), g.const("w", np.ones((4, 3), np.float32))])
    path = g.write(tmp_path)
    (tmp_path / "w.bin").write_bytes(g.blob[:-4])
    with pytest.raises(ConversionError, match="weight w"):
        convert(path)


def test_layers_model_is_refused(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps({"format": "layers-model", "modelTopology": {}}))
    with pytest.raises(ConversionError, match="layers-model"):
        convert(tmp_path / "model.json")


def test_topk_is_made_unstable_and_still_picks_the_top_values(tmp_path):
    """TopKV2 read as a stable TopK runs OpenVINO's slow kernel (498 ms of CenterNet's 520): it must come out
    unstable, with the same top k."""
    from vlora_va.engine.backends.openvino import import_openvino

    x = np.random.default_rng(4).random((1, 5000)).astype(np.float32)
    g = GraphBuilder()
    g.op("top", "TopKV2", [g.placeholder("x", x.shape), g.const("k", np.array(7, np.int32), declared="DT_INT32")],
         sorted={"b": True})
    g.op("y", "Identity", ["top:1"])
    facts = to_openvino(g.write(tmp_path), tmp_path / "ir" / "m.xml")
    assert facts["unstable_topk"] == 1
    model = import_openvino().Core().read_model(str(tmp_path / "ir" / "m.xml"))
    (topk,) = [op for op in model.get_ops() if op.get_type_name() == "TopK"]
    assert topk.get_attributes()["stable"] is False
    compiled = import_openvino().Core().compile_model(model, "CPU")
    got = compiled(x)[compiled.outputs[0]]
    np.testing.assert_array_equal(got[0], np.argsort(-x[0])[:7])
