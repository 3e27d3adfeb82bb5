"""TensorFlow's GraphDef messages, declared here so a frozen graph can be written without tensorflow.

OpenVINO reads a frozen TensorFlow `.pb` (a serialized GraphDef) directly. A TF.js graph model's `model.json`
holds the same GraphDef in protobuf's JSON mapping, so `json_format.ParseDict` fills these messages from it and
`SerializeToString` writes the `.pb`. Only the fields a frozen inference graph uses are declared; the field
numbers and names are TensorFlow's own (tensorflow/core/framework/{graph,node_def,attr_value,tensor,
tensor_shape,types,versions}.proto), which is what makes the bytes readable by any TensorFlow reader.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "tensorflow"

# (name, number) of TensorFlow's DataType enum
DATA_TYPES = [("DT_INVALID", 0), ("DT_FLOAT", 1), ("DT_DOUBLE", 2), ("DT_INT32", 3), ("DT_UINT8", 4),
              ("DT_INT16", 5), ("DT_INT8", 6), ("DT_STRING", 7), ("DT_COMPLEX64", 8), ("DT_INT64", 9),
              ("DT_BOOL", 10), ("DT_QINT8", 11), ("DT_QUINT8", 12), ("DT_QINT32", 13), ("DT_BFLOAT16", 14),
              ("DT_QINT16", 15), ("DT_QUINT16", 16), ("DT_UINT16", 17), ("DT_COMPLEX128", 18), ("DT_HALF", 19),
              ("DT_RESOURCE", 20), ("DT_VARIANT", 21), ("DT_UINT32", 22), ("DT_UINT64", 23)]

# message name -> [(field name, number, type, label, type name or None)]
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_MESSAGES = {
    "TensorShapeProto.Dim": [("size", 1, _F.TYPE_INT64, _OPT, None), ("name", 2, _F.TYPE_STRING, _OPT, None)],
    "TensorShapeProto": [("dim", 2, _F.TYPE_MESSAGE, _REP, ".tensorflow.TensorShapeProto.Dim"),
                         ("unknown_rank", 3, _F.TYPE_BOOL, _OPT, None)],
    "TensorProto": [("dtype", 1, _F.TYPE_ENUM, _OPT, ".tensorflow.DataType"),
                    ("tensor_shape", 2, _F.TYPE_MESSAGE, _OPT, ".tensorflow.TensorShapeProto"),
                    ("version_number", 3, _F.TYPE_INT32, _OPT, None),
                    ("tensor_content", 4, _F.TYPE_BYTES, _OPT, None),
                    ("float_val", 5, _F.TYPE_FLOAT, _REP, None),
                    ("double_val", 6, _F.TYPE_DOUBLE, _REP, None),
                    ("int_val", 7, _F.TYPE_INT32, _REP, None),
                    ("string_val", 8, _F.TYPE_BYTES, _REP, None),
                    ("int64_val", 10, _F.TYPE_INT64, _REP, None),
                    ("bool_val", 11, _F.TYPE_BOOL, _REP, None),
                    ("half_val", 13, _F.TYPE_INT32, _REP, None)],
    "AttrValue.ListValue": [("s", 2, _F.TYPE_BYTES, _REP, None), ("i", 3, _F.TYPE_INT64, _REP, None),
                            ("f", 4, _F.TYPE_FLOAT, _REP, None), ("b", 5, _F.TYPE_BOOL, _REP, None),
                            ("type", 6, _F.TYPE_ENUM, _REP, ".tensorflow.DataType"),
                            ("shape", 7, _F.TYPE_MESSAGE, _REP, ".tensorflow.TensorShapeProto"),
                            ("tensor", 8, _F.TYPE_MESSAGE, _REP, ".tensorflow.TensorProto"),
                            ("func", 9, _F.TYPE_MESSAGE, _REP, ".tensorflow.NameAttrList")],
    "AttrValue": [("list", 1, _F.TYPE_MESSAGE, _OPT, ".tensorflow.AttrValue.ListValue"),
                  ("s", 2, _F.TYPE_BYTES, _OPT, None), ("i", 3, _F.TYPE_INT64, _OPT, None),
                  ("f", 4, _F.TYPE_FLOAT, _OPT, None), ("b", 5, _F.TYPE_BOOL, _OPT, None),
                  ("type", 6, _F.TYPE_ENUM, _OPT, ".tensorflow.DataType"),
                  ("shape", 7, _F.TYPE_MESSAGE, _OPT, ".tensorflow.TensorShapeProto"),
                  ("tensor", 8, _F.TYPE_MESSAGE, _OPT, ".tensorflow.TensorProto"),
                  ("placeholder", 9, _F.TYPE_STRING, _OPT, None),
                  ("func", 10, _F.TYPE_MESSAGE, _OPT, ".tensorflow.NameAttrList")],
    "NameAttrList": [("name", 1, _F.TYPE_STRING, _OPT, None),
                     ("attr", 2, _F.TYPE_MESSAGE, _REP, ".tensorflow.NameAttrList.AttrEntry")],
    "NodeDef": [("name", 1, _F.TYPE_STRING, _OPT, None), ("op", 2, _F.TYPE_STRING, _OPT, None),
                ("input", 3, _F.TYPE_STRING, _REP, None), ("device", 4, _F.TYPE_STRING, _OPT, None),
                ("attr", 5, _F.TYPE_MESSAGE, _REP, ".tensorflow.NodeDef.AttrEntry")],
    "VersionDef": [("producer", 1, _F.TYPE_INT32, _OPT, None), ("min_consumer", 2, _F.TYPE_INT32, _OPT, None),
                   ("bad_consumers", 3, _F.TYPE_INT32, _REP, None)],
    "GraphDef": [("node", 1, _F.TYPE_MESSAGE, _REP, ".tensorflow.NodeDef"),
                 ("versions", 4, _F.TYPE_MESSAGE, _OPT, ".tensorflow.VersionDef")],
}
# map<string, AttrValue> fields are repeated entry messages nested in their owner
_MAP_ENTRIES = {"NodeDef": "AttrEntry", "NameAttrList": "AttrEntry"}


def _add_fields(msg: descriptor_pb2.DescriptorProto, fields) -> None:
    for name, number, ftype, label, type_name in fields:
        f = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name
        if label == _REP and ftype not in (_F.TYPE_MESSAGE, _F.TYPE_STRING, _F.TYPE_BYTES):
            f.options.packed = True  # proto3 packs repeated scalars; TF writes them packed


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="vlora_va/tf_graph.proto", package=_PACKAGE, syntax="proto3")
    enum = fd.enum_type.add(name="DataType")
    for name, number in DATA_TYPES:
        enum.value.add(name=name, number=number)
    tops = {name: fd.message_type.add(name=name) for name in _MESSAGES if "." not in name}
    for full, fields in _MESSAGES.items():
        outer, _, inner = full.partition(".")
        _add_fields(tops[outer].nested_type.add(name=inner) if inner else tops[outer], fields)
    # AttrValue's fields are one `oneof value`: a oneof member has presence, so `b: false` or `i: 0` is written.
    # Declared as plain proto3 scalars, they would be dropped as defaults, and the reader would find a
    # valueless attribute (OpenVINO then fails on, e.g., ResizeBilinear's half_pixel_centers).
    attr = tops["AttrValue"]
    attr.oneof_decl.add(name="value")
    for f in attr.field:
        f.oneof_index = 0
    for owner, entry_name in _MAP_ENTRIES.items():
        entry = tops[owner].nested_type.add(name=entry_name)
        entry.options.map_entry = True
        _add_fields(entry, [("key", 1, _F.TYPE_STRING, _OPT, None),
                            ("value", 2, _F.TYPE_MESSAGE, _OPT, ".tensorflow.AttrValue")])
    return fd


def _classes() -> dict[str, type]:
    pool = descriptor_pool.DescriptorPool()  # our own pool: never clashes with a tensorflow install's
    pool.Add(_file())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in ("GraphDef", "NodeDef", "AttrValue", "TensorProto", "TensorShapeProto")}


_CLASSES = _classes()
GraphDef = _CLASSES["GraphDef"]
NodeDef = _CLASSES["NodeDef"]
AttrValue = _CLASSES["AttrValue"]
TensorProto = _CLASSES["TensorProto"]
TensorShapeProto = _CLASSES["TensorShapeProto"]
DTYPE_NUMBER = dict(DATA_TYPES)
