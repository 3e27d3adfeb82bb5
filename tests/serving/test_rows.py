"""Rows of a tracked task (serving/rows.py with the analytics layer): a served row waiting for an earlier chunk's row
leaves, with its track ids, when that row is written, and the dashboard's served observer hears of it then."""

import time

from tests.serving.test_daemon import chunk_parts
from vlora_va.contracts.config import parse_config
from vlora_va.contracts.wire import decode_chunk
from vlora_va.engine.adapters import load_adapter_dir
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.executor import Engine
from vlora_va.engine.modes import UNMERGED, LoRAMode
from vlora_va.serving.prometheus import DaemonMetrics
from vlora_va.serving.rows import Rows
from vlora_va.serving.scheduling import make_plan
from vlora_va.testing.tiny import TINY_IMAGE


def test_a_held_tracked_row_reaches_the_sinks_and_the_served_observers_once_its_predecessor_is_written(
        tmp_path, tiny_backbone_dir, tiny_adapters):
    cfg = parse_config(f"""
daemon: {{backbone: {tiny_backbone_dir}, image_size: {TINY_IMAGE}}}
adapters: {{detect: {tiny_adapters["detect"]}}}
streams:
  - id: cam
    source: unused.mp4
    fps: 2
    tasks: [{{name: det, adapter: detect, frames_per_chunk: 2, track: true}}]
""", "t.yaml", tmp_path)
    engine = Engine(load_backbone(str(tiny_backbone_dir)), {"detect": load_adapter_dir(
        "detect", tiny_adapters["detect"], 32)}, TINY_IMAGE)
    rows = Rows(cfg, engine, DaemonMetrics())

    class Sink:  # the sink interface's one call rows make while serving
        def __init__(self):
            self.written = []

        def write(self, records):
            self.written += records

    sink = Sink()
    rows.attach([sink])
    heard = []
    rows.observe_served(lambda req, rec: heard.append(rec.chunk))
    reqs = [decode_chunk([bytes(memoryview(p)) for p in chunk_parts("cam", seq, [("det", "detect")])])
            .requests(time.time())[0] for seq in (0, 1)]
    rows.expect([(r.stream, r.task, r.seq) for r in reqs])
    plan = make_plan([reqs[1]], LoRAMode(UNMERGED), engine.catalog())
    rows.served(plan, engine.execute(plan), time.time(), time.time(), "unmerged", engine.catalog())
    assert sink.written == [] and heard == []  # chunk 1 waits for chunk 0's row
    rows.refuse([(reqs[0], "shed", "cannot meet its deadline (test)", None)])
    assert [(r.chunk, r.status) for r in sink.written] == [(0, "shed"), (1, "ok")]
    assert heard == [1]  # the observer heard of chunk 1 when it left, with the row the sinks got
