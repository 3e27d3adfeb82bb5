"""vlora_va/serving/prometheus.py: every event counted once, and series bounded whatever stream ids senders invent."""

from prometheus_client import generate_latest

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.requests import Request
from vlora_va.contracts.results import ResultRecord
from vlora_va.serving.prometheus import MAX_STREAM_LABELS, OTHER_STREAMS, DaemonMetrics


def req(stream):
    return Request(stream, 0, "t", "a", [], [0.0], Letterbox(1, 0, 0), (1, 1), 0.0, 0.0, 1.0)


def test_stream_series_are_bounded_and_counts_are_not_lost():
    m = DaemonMetrics()
    n = MAX_STREAM_LABELS + 500
    for i in range(n):
        m.chunk(f"s{i}", 1, 0)
        rec = ResultRecord.not_served(req(f"s{i}"), "shed", "late", 2.0)
        m.row(rec.stream, rec.task, rec.status, rec.deadline_met, rec.latency.total_s, "deadline")
    text = generate_latest(m.registry).decode()
    chunk_lines = [line for line in text.splitlines() if line.startswith("vlora_chunks_received_total{")]
    assert len(chunk_lines) == MAX_STREAM_LABELS + 1  # the first streams, then one shared series
    assert f'vlora_chunks_received_total{{stream="{OTHER_STREAMS}"}} 500.0' in text
    assert m.totals.chunks == m.totals.shed == n  # totals count everything
    assert len(m.totals.shed_by) == MAX_STREAM_LABELS + 1 and m.totals.shed_by[(OTHER_STREAMS, OTHER_STREAMS)] == 500
