"""The benchmarks' own logic (their figures come from running them, not from tests): bench/gpu.py skips
cleanly without CUDA; bench/serving.py's load schedule and its summary arithmetic."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import serving as S  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real benchmark")
def test_gpu_bench_says_it_skipped_and_exits_0_without_cuda():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "skipped: no CUDA device" in r.stdout


def test_gpu_agreement_pairs_boxes_both_ways_and_excuses_only_the_threshold():
    """bench/gpu.py's comparison of GPU rows with the CPU reference (issue 31's rule): IoU > 0.9, same class, scores
    within 0.02; a box within 0.02 of the threshold may be missing on the other side; labels must be equal."""
    import gpu as G

    def det(*boxes):
        return {"frames": [{"detections": [{"box": list(b), "class": c, "score": s} for b, c, s in boxes]}]}

    def act(label):
        return {"label": label, "scores": {"walking": 0.8, "standing": 0.2}}

    person = ((10, 10, 40, 100), "person", 0.66)
    ref = [det(person, ((100, 10, 130, 100), "person", 0.21)), act("walking")]
    assert G.agreement(ref, ref, threshold=0.2)["ok"]
    # the near-threshold box missing on the GPU: excused; the same box missing at a clear score: not
    assert G.agreement(ref, [det(person), act("walking")], 0.2)["ok"]
    assert not G.agreement(ref, [det(person), act("walking")], 0.1)["ok"]
    shifted = ((12, 10, 44, 104), "person", 0.66)  # IoU 0.82
    got = G.agreement(ref, [det(shifted, ((100, 10, 130, 100), "person", 0.21)), act("walking")], 0.2)
    assert not got["ok"] and len(got["unmatched"]) == 2  # missing on each side
    assert not G.agreement(ref, [det(person, ((100, 10, 130, 100), "car", 0.5)), act("walking")], 0.2)["ok"]
    assert not G.agreement(ref, [det(((10, 10, 40, 100), "person", 0.70), ((100, 10, 130, 100), "person", 0.21)),
                                 act("walking")], 0.2)["ok"]  # score off by 0.04
    assert not G.agreement(ref, [ref[0], act("standing")], 0.2)["ok"]


def test_serving_schedule_offers_the_asked_load_and_skew():
    w = S.Workload(streams=6, adapters=4, skew=0.9, load=3.0)
    plan = S.schedule(w, capacity=10.0, duration=20.0, seed=1)
    assert len(plan) == 600  # 3 x 10 images/s for 20 s
    assert plan == sorted(plan) and plan[1][0] - plan[0][0] == pytest.approx(1 / 30)
    share = sum(a == 0 for *_, a in plan) / len(plan)
    assert share == pytest.approx(0.9, abs=0.04)
    per_stream = {s: [q for _, st, q, _ in plan if st == s] for s in range(6)}
    assert all(v == list(range(len(v))) for v in per_stream.values())  # each stream's chunks numbered in order
    assert plan == S.schedule(w, 10.0, 20.0, seed=1)  # the same sequence for every policy


def test_serving_analysis_and_ratios():
    def row(stream, status, met=True, total=500.0):
        return {"stream": stream, "status": status, "deadline_met": met and status == "ok",
                "latency_ms": {"total": total}}
    rows = [row("s0", "ok")] * 99 + [row("s0", "ok", met=False, total=2500.0)] + [row("s1", "shed")] * 50 + \
        [row("s1", "ok")] * 50
    f = S.analyse(rows, offered=210, duration=10.0, n_switches=3)
    assert f["in_deadline_per_s"] == pytest.approx(14.9) and f["not_answered"] == 10
    assert f["shed_rate"] == pytest.approx(50 / 210) and f["miss_rate"] == pytest.approx(1 / 210)
    assert f["streams_held"] == 1 and f["p99_latency_ms"] == 500.0
    points = [{"backbone": "b", "workload": "w", "policy": p, "figures": dict(f, in_deadline_per_s=v)}
              for p, v in (("vlora", 12.0), ("edf", 10.0), ("unmerge-only", 8.0), ("merge-only", 6.0), ("dlora", 9.0))]
    summary = {r["policy"]: r for r in S.summarise(points)}
    assert summary["vlora"]["vs_best_baseline"] == pytest.approx(1.2)
    assert summary["vlora"]["vs_unmerge_only"] == pytest.approx(1.5)


def test_capacity_bench_runs_the_daemon_with_the_default_pipelines_backend(tmp_path):
    """bench/capacity.py measures cameras as `make run` serves them: pipelines.yaml's daemon.backend (auto: OpenVINO
    where it measures faster), not the configuration's default (torch), and the settings validate."""
    import capacity as C
    import yaml

    from vlora_va.contracts.config import parse_config

    daemon = yaml.safe_load((ROOT / "pipelines.yaml").read_text())["daemon"]
    default = daemon["backend"]
    assert C.default_backend() == default
    section = C.daemon_section(tmp_path, "dinov2-small", C.default_backend())
    assert section["backend"] == default and section["precision"] == "auto"
    assert section["max_batch_images"] == daemon["max_batch_images"]
    cfg = C.live.pipeline(section, [], tmp_path / "rows.jsonl")
    cfg["streams"] = [C.camera("c0", "busy", None)]
    assert parse_config(json.dumps(cfg), base_dir=ROOT).daemon.backend == default


def test_capacity_table_names_what_the_daemon_chose_per_isa():
    import capacity as C

    line = "  [daemon] vlora_va.serving.startup: backbone precision bf16: fastest here (backend openvino)"
    doc = {"runs": [{"isa": "native", "daemon_startup": ["  [daemon] x: precision speeds ...", line]},
                    {"isa": "avx2", "daemon_startup": []}]}
    assert C.chosen(doc) == {"native": "backbone precision bf16: fastest here (backend openvino)",
                             "avx2": "not logged"}
