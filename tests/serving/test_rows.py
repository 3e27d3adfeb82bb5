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
from vlora_va.serving.rows import RowWriter
from vlora_va.serving.scheduling import make_plan
from vlora_va.testing.tiny import TINY_IMAGE


def tracked_rows(tmp_path, tiny_backbone_dir, tiny_adapters) -> tuple[RowWriter, Engine]:
    """Rows of a pipeline with one tracked detection task (stream cam, task det), and the engine serving it."""
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
    rows = RowWriter(cfg, engine, DaemonMetrics())
    return rows, engine


def test_a_held_tracked_row_reaches_the_sinks_and_the_served_observers_once_its_predecessor_is_written(
        tmp_path, tiny_backbone_dir, tiny_adapters):
    rows, engine = tracked_rows(tmp_path, tiny_backbone_dir, tiny_adapters)

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


def test_a_row_is_judged_when_it_is_handed_to_the_sinks_not_when_its_compute_ended(tmp_path, tiny_backbone_dir,
                                                                                   tiny_adapters):
    """docs/results.md#deadline_met: a tracked row held behind its stream's earlier chunk is handed over later;
    its deadline, total and hand-off latency are those of the hand-off."""
    import dataclasses

    rows, engine = tracked_rows(tmp_path, tiny_backbone_dir, tiny_adapters)
    written = []

    class Sink:
        def write(self, records):
            written.extend(records)

    rows.attach([Sink()])
    now = time.time()
    reqs = [decode_chunk([bytes(memoryview(p)) for p in chunk_parts("cam", seq, [("det", "detect")])])
            .requests(now)[0] for seq in (0, 1)]
    held = dataclasses.replace(reqs[1], ready=now - 1.0, deadline=now)  # its deadline: now, 1 s after its capture
    rows.expect([(r.stream, r.task, r.seq) for r in reqs])
    plan = make_plan([held], LoRAMode(UNMERGED), engine.catalog())
    compute_end = now - 0.5  # in time when its compute ended...
    rows.served(plan, engine.execute(plan), now - 0.6, compute_end, "unmerged", engine.catalog())
    assert written == []  # ... held behind chunk 0
    rows.refuse([(reqs[0], "shed", "cannot meet its deadline (test)", None)])
    handed_at = time.time()
    row = written[1]
    assert row.chunk == 1 and row.status == "ok"
    assert row.deadline_met is False  # ... handed over after it: late
    assert row.latency.total_s >= handed_at - held.ready - 0.5 and row.latency.total_s > 1.0
    assert row.latency.handoff_s == row.latency.total_s - (compute_end - held.ready)
    assert row.to_json()["latency_ms"]["handoff"] >= 500.0
