"""The chunk message's wire schema, restated for the fuzz generator (vlora_va/testing/messages.py) independently
of vlora_va/contracts/wire.py: the oracle must not be the code under test. tests/serving/test_fuzz.py checks that
FIELDS names exactly the fields of the wire dataclasses (`wire_fields`), so a new field is fuzzed too."""

from __future__ import annotations

import dataclasses

from vlora_va.contracts.wire import MAX_FRAMES, MAX_SEQ, MAX_TASKS

# The wire schema, restated: dotted path ("[]" = any list item) -> (type, lo, hi) or (type, min_len, max_len).
MAX_WALL, MAX_MEDIA_S, MAX_SIDE, MAX_ORIG = 1e11, 1e9, 2048, 16384

FIELDS: dict[str, tuple] = {
    "v": ("const",),
    "stream": ("text",),
    "seq": ("int", 0, MAX_SEQ),
    "fps": ("num", 0.01, 1000.0),
    "frame_ts": ("list", 0, MAX_FRAMES),  # empty only when every task reuses a chunk (a relation, checked apart)
    "frame_ts[]": ("num", 0.0, MAX_MEDIA_S),
    "frame_shape": ("list", 3, 3),
    "frame_shape[]": ("int", 1, MAX_SIDE),
    "orig_size": ("list", 2, 2),
    "orig_size[]": ("int", 1, MAX_ORIG),
    "letterbox": ("obj",),
    "letterbox.scale": ("num", 1e-4, 1e4),
    "letterbox.pad_x": ("num", 0.0, MAX_SIDE),
    "letterbox.pad_y": ("num", 0.0, MAX_SIDE),
    "tasks": ("list", 1, MAX_TASKS),
    "tasks[]": ("obj",),
    "tasks[].name": ("text",),
    "tasks[].adapter": ("text",),
    "tasks[].frames": ("list", 0, MAX_FRAMES),  # empty only with reuse_chunk (a relation)
    "tasks[].frames[]": ("int", 0, MAX_FRAMES - 1),
    "tasks[].deadline_ms": ("num", 1.0, 3_600_000.0),
    "tasks[].priority": ("int", -1000, 1000),
    "tasks[].best_effort": ("bool",),
    "tasks[].reuse_chunk": ("int", -1, MAX_SEQ),  # frame filtering; absent in generated messages
    "tasks[].reuse_ts": ("list", 0, MAX_FRAMES),
    "tasks[].reuse_ts[]": ("num", 0.0, MAX_MEDIA_S),
    "ready_wall": ("num", 0.0, MAX_WALL),
    "sent_wall": ("num", 0.0, MAX_WALL),
    "dropped_before": ("int", 0, MAX_SEQ),
    "outage_s": ("num", 0.0, MAX_MEDIA_S),
    "reconnects": ("int", 0, MAX_SEQ),
    "decoded": ("int", 0, MAX_SEQ),
    "snapshots": ("list", 0, MAX_FRAMES),  # the JPEG parts that follow the frames: absent in generated messages
}
OPTIONAL = {"dropped_before", "outage_s", "reconnects", "decoded", "snapshots", "tasks[].priority",
            "tasks[].best_effort", "tasks[].reuse_chunk", "tasks[].reuse_ts"}
# legal values of the optional header fields that ingest leaves out when 0
OPTIONAL_VALUES = {"outage_s": (0.0, 1.5, MAX_MEDIA_S), "reconnects": (0, 3, MAX_SEQ), "decoded": (0, 30, MAX_SEQ)}


def spec_key(path: tuple) -> str:
    """("tasks", 0, "frames", 1) -> "tasks[].frames[]"."""
    out = ""
    for p in path:
        out += "[]" if isinstance(p, int) else (f".{p}" if out else p)
    return out



def wire_fields() -> set[str]:
    """The field paths of the wire dataclasses, in FIELDS' notation (for the test that keeps FIELDS complete)."""
    from vlora_va.contracts.geometry import Letterbox
    from vlora_va.contracts.wire import ChunkHeader, TaskRequest

    lists = {"frame_ts", "frame_shape", "orig_size", "tasks", "tasks[].frames", "tasks[].reuse_ts"}
    out = set()
    for f in dataclasses.fields(ChunkHeader):
        out.add(f.name)
    out |= {f"letterbox.{f.name}" for f in dataclasses.fields(Letterbox)}
    out |= {f"tasks[].{f.name}" for f in dataclasses.fields(TaskRequest)}
    out |= {f"{p}[]" for p in lists}
    out.add("tasks[]")
    return out

