"""TF.js graph model (`model.json` + weight shards) → frozen TensorFlow GraphDef (`.pb`) that OpenVINO reads.

No tensorflow: a TF.js graph model's `modelTopology` is a GraphDef in protobuf's JSON mapping and its weights
are raw little-endian arrays, so the frozen graph is rebuilt with protobuf alone (tf_graph_proto.py). Four
things a straight copy gets wrong, each fixed by one function below:

- `_FusedConv2D`, `FusedDepthwiseConv2dNative` and `_FusedMatMul` are grappler-internal ops that OpenVINO's
  TensorFlow frontend has no rule for: each is split back into its convolution (or MatMul), a BiasAdd and its
  activation (`split_fused`);
- TF.js stores int64 constants as int32: each constant gets its declared dtype back (`fill_constants`);
- a scalar constant written as raw `tensor_content` bytes was misread (a ConcatV2 ran on the wrong axis): scalars
  are written as typed values (`int_val`, `float_val`, ...) instead;
- fp16- or uint8-quantized weights are dequantized to their original dtype (`read_weights`).

And one for speed, on the converted model: OpenVINO's reader makes TopKV2 a *stable* TopK, and its CPU kernel
for a stable TopK over CenterNet's 1.3 M scores took 498 of the model's 520 ms (1 thread); an unstable one takes
about 1 ms (`unstable_topk`). Only the order of exactly equal scores can differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from google.protobuf import json_format

from vlora_va.training.tf_graph_proto import DTYPE_NUMBER, AttrValue, GraphDef, NodeDef

# TF.js manifest dtype -> numpy dtype of the stored bytes
_STORED = {"float32": np.float32, "int32": np.int32, "bool": np.bool_, "float16": np.float16,
           "uint8": np.uint8, "uint16": np.uint16, "int8": np.int8}
# TensorFlow DataType number -> numpy dtype the frozen graph declares
_DECLARED = {DTYPE_NUMBER["DT_FLOAT"]: np.float32, DTYPE_NUMBER["DT_INT32"]: np.int32,
             DTYPE_NUMBER["DT_INT64"]: np.int64, DTYPE_NUMBER["DT_BOOL"]: np.bool_,
             DTYPE_NUMBER["DT_HALF"]: np.float16, DTYPE_NUMBER["DT_DOUBLE"]: np.float64,
             DTYPE_NUMBER["DT_UINT8"]: np.uint8, DTYPE_NUMBER["DT_INT8"]: np.int8}
# numpy dtype -> the TensorProto field a scalar of it is written to
_SCALAR_FIELD = {np.float32: "float_val", np.float64: "double_val", np.int32: "int_val", np.int64: "int64_val",
                 np.bool_: "bool_val", np.uint8: "int_val", np.int8: "int_val"}
ACTIVATIONS = ("Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Prelu")
_FUSED = {"_FusedConv2D": "Conv2D", "FusedDepthwiseConv2dNative": "DepthwiseConv2dNative", "_FusedMatMul": "MatMul"}
# attributes of the fused op that its plain op does not take
_FUSED_ONLY = {"fused_ops", "num_args", "epsilon", "leakyrelu_alpha", "num_host_args", "TArgs"}


class ConversionError(ValueError):
    """A TF.js model this converter cannot turn into a frozen graph; the message names the node or weight."""


def read_weights(model_json: dict, folder: Path) -> dict[str, np.ndarray]:
    """{weight name: array in its original dtype} from the manifest's shards (concatenated per group, in order)."""
    out = {}
    for group in model_json.get("weightsManifest", []):
        blob = b"".join((folder / p).read_bytes() for p in group["paths"])
        offset = 0
        for w in group["weights"]:
            q = w.get("quantization")
            stored = _STORED.get(q["dtype"] if q else w["dtype"])
            if stored is None:
                raise ConversionError(f"weight {w['name']}: dtype {q['dtype'] if q else w['dtype']!r} is not supported")
            count = int(np.prod(w["shape"], dtype=np.int64))
            nbytes = count * np.dtype(stored).itemsize
            if offset + nbytes > len(blob):
                raise ConversionError(f"weight {w['name']}: the shards end before its {nbytes} bytes")
            arr = np.frombuffer(blob, stored, count, offset).reshape(w["shape"])
            offset += nbytes
            out[w["name"]] = _dequantize(arr, w, q)
    return out


def _dequantize(arr: np.ndarray, w: dict, q: dict | None) -> np.ndarray:
    if q is None:
        return arr.copy()
    original = _STORED[q.get("original_dtype", w["dtype"])]
    if q["dtype"] == "float16":
        return arr.astype(original)
    if "scale" in q:  # affine uint8/uint16 quantization: value = q * scale + min
        return (arr.astype(np.float32) * q["scale"] + q.get("min", 0.0)).astype(original)
    raise ConversionError(f"weight {w['name']}: quantization {q!r} is not supported")


def parse_topology(model_json: dict) -> GraphDef:
    if model_json.get("format") not in (None, "graph-model"):
        raise ConversionError(f"format {model_json.get('format')!r}: only TF.js graph models convert (not layers models)")
    topology = model_json.get("modelTopology")
    if not isinstance(topology, dict) or "node" not in topology:
        raise ConversionError("model.json has no modelTopology.node: not a TF.js graph model")
    topology = {k: v for k, v in topology.items() if k in ("node", "versions")}  # functions (library) are unused
    return json_format.ParseDict(topology, GraphDef(), ignore_unknown_fields=True)


def fill_constants(graph: GraphDef, weights: dict[str, np.ndarray]) -> None:
    """Write each weight into its Const node, in the dtype the node declares; scalars as typed values."""
    for node in graph.node:
        if node.op != "Const" or node.name not in weights:
            continue
        declared = node.attr["dtype"].type
        if declared not in _DECLARED:
            raise ConversionError(f"constant {node.name}: dtype {declared} is not supported")
        arr = weights[node.name].astype(_DECLARED[declared])  # int32 on disk, DT_INT64 declared: int64 again
        tensor = node.attr["value"].tensor
        tensor.Clear()
        tensor.dtype = declared
        for size in arr.shape:
            tensor.tensor_shape.dim.add(size=int(size))
        if arr.ndim == 0:
            getattr(tensor, _SCALAR_FIELD[arr.dtype.type]).append(arr.item())
        else:
            tensor.tensor_content = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()


def _node(name: str, op: str, inputs: list[str], attrs: dict) -> NodeDef:
    node = NodeDef(name=name, op=op)
    node.input.extend(inputs)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(value)
    return node


def _const(name: str, value: float) -> NodeDef:
    node = NodeDef(name=name, op="Const")
    node.attr["dtype"].type = DTYPE_NUMBER["DT_FLOAT"]
    node.attr["value"].tensor.dtype = DTYPE_NUMBER["DT_FLOAT"]
    node.attr["value"].tensor.float_val.append(value)
    return node


def _split_one(node: NodeDef) -> list[NodeDef]:
    """One fused node as [op, BiasAdd, activation...]; the last keeps the fused node's name, so consumers
    need no change."""
    fused_ops = [s.decode() for s in node.attr["fused_ops"].list.s]
    data = [i for i in node.input if not i.startswith("^")]
    control = [i for i in node.input if i.startswith("^")]
    if not fused_ops or fused_ops[0] != "BiasAdd" or len(fused_ops) > 2 or \
            (len(fused_ops) == 2 and fused_ops[1] not in ACTIVATIONS):
        raise ConversionError(f"node {node.name}: fused ops {fused_ops} are not supported "
                              f"(BiasAdd, optionally followed by one of {', '.join(ACTIVATIONS)})")
    want = 4 if fused_ops[-1] == "Prelu" else 3
    if len(data) != want:
        raise ConversionError(f"node {node.name}: {node.op} with {fused_ops} needs {want} inputs, got {len(data)}")
    t = {"T": node.attr["T"]}
    base = {k: v for k, v in node.attr.items() if k not in _FUSED_ONLY}
    bias_attrs = dict(t)
    if "data_format" in node.attr:
        bias_attrs["data_format"] = node.attr["data_format"]
    stages = [(_FUSED[node.op], data[:2] + control, base), ("BiasAdd", [None, data[2]], bias_attrs)]
    if len(fused_ops) == 2:
        act = fused_ops[1]
        if act == "LeakyRelu":
            stages.append(("LeakyRelu", [None], {**t, "alpha": AttrValue(f=node.attr["leakyrelu_alpha"].f)}))
        elif act != "Prelu":
            stages.append((act, [None], t))
    names = [f"{node.name}/_{op}" for op, _, _ in stages[:-1]] + [node.name]
    if fused_ops[-1] == "Prelu":
        names[-1] = f"{node.name}/_BiasAdd"
    out = []
    for i, ((op, inputs, attrs), name) in enumerate(zip(stages, names)):
        out.append(_node(name, op, [names[i - 1] if x is None else x for x in inputs], attrs))
    if fused_ops[-1] == "Prelu":
        out += _prelu(node.name, names[-1], data[3], t)
    return out


def _prelu(name: str, x: str, alpha: str, t: dict) -> list[NodeDef]:
    """PReLU as relu(x) - alpha * relu(-x): TensorFlow has no Prelu op (TF.js fuses it into the conv)."""
    p = f"{name}/_prelu"
    return [_node(f"{p}/pos", "Relu", [x], t), _node(f"{p}/neg_x", "Neg", [x], t),
            _node(f"{p}/neg", "Relu", [f"{p}/neg_x"], t), _node(f"{p}/scaled", "Mul", [alpha, f"{p}/neg"], t),
            _node(name, "Sub", [f"{p}/pos", f"{p}/scaled"], t)]


def split_fused(graph: GraphDef) -> dict[str, int]:
    """Replace every fused node by its parts, in place; returns how many of each fused op were split."""
    nodes, counts = [], {}
    for node in graph.node:
        if node.op in _FUSED:
            nodes += _split_one(node)
            counts[node.op] = counts.get(node.op, 0) + 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return counts


def convert(model_json_path: str | Path) -> tuple[bytes, dict]:
    """The frozen GraphDef's bytes, and what was done: {"split": {op: count}, "constants": n, "weights": n}."""
    path = Path(model_json_path)
    model_json = json.loads(path.read_text())
    graph = parse_topology(model_json)
    weights = read_weights(model_json, path.parent)
    consts = {n.name for n in graph.node if n.op == "Const"}
    missing = sorted(set(weights) - consts)
    if missing:
        raise ConversionError(f"weights {missing[:3]} have no Const node in the topology")
    fill_constants(graph, weights)
    split = split_fused(graph)
    return graph.SerializeToString(), {"split": split, "constants": len(consts), "weights": len(weights)}


def unstable_topk(model) -> int:
    """Replace every stable TopK of an OpenVINO model by the same TopK, unstable; returns how many."""
    import openvino.opset11 as ops

    n = 0
    for op in model.get_ops():
        attrs = op.get_attributes() if op.get_type_name() == "TopK" else {}
        if not attrs.get("stable"):
            continue
        new = ops.topk(op.input_value(0), op.input_value(1), attrs["axis"], attrs["mode"], attrs["sort"],
                       attrs["index_element_type"], stable=False)
        new.set_friendly_name(op.get_friendly_name())
        for i in range(op.get_output_size()):
            op.output(i).replace(new.output(i))
        n += 1
    model.validate_nodes_and_infer_types()
    return n


def to_openvino(model_json_path: str | Path, xml_path: str | Path) -> dict:
    """Convert a TF.js graph model to OpenVINO IR (xml + bin, weights kept fp32); returns the conversion's facts."""
    from vlora_va.engine.backends.openvino import import_openvino

    ov = import_openvino()
    pb, facts = convert(model_json_path)
    xml_path = Path(xml_path)
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    pb_path = xml_path.with_suffix(".pb")
    pb_path.write_bytes(pb)
    try:
        model = ov.convert_model(str(pb_path))
    finally:
        pb_path.unlink(missing_ok=True)  # the IR is what teachers load; the .pb is rebuilt in seconds if needed
    facts["unstable_topk"] = unstable_topk(model)
    ov.save_model(model, str(xml_path), compress_to_fp16=False)
    return {**facts, "inputs": [p.get_any_name() for p in model.inputs],
            "outputs": [p.get_any_name() for p in model.outputs]}
