"""kernels/tuned.py and kernels/tuning.py: bucket keys, O(1) lookup with a default for unseen shapes, the shipped CPU table, the tuner."""

import json

import torch

from kernels import Segments, cpu, tuned, tuning


def test_bucket_key_rounds_rows_runs_and_rank():
    seg = Segments.from_elements([0, 0, 1, 2, 2], 257)
    key = tuned.bucket_key(384, 1536, seg, [16, 8, 48])
    assert key == "384x1536/rows2048/runs4/ad4/r64/g"
    assert tuned.bucket_key(384, 1536, Segments.from_elements([0, 1, 0], 257), [16, 16]).endswith("/u")


def test_unseen_shape_gets_rule_default_and_is_memoised():
    seg = Segments.from_elements([0, 1, 0, 1], 257)
    assert tuned.lookup_cpu(7, 9, seg, [16, 16]) == cpu.default_strategy(seg) == "runs"
    tiny = Segments.from_row_slots([0, 1, 2] * 20)  # one row per run: two GEMMs over all rows win
    assert cpu.default_strategy(tiny) == "fused"
    assert any(k[0] == "choice" for k in seg._cache)  # second layer of the same shape: one dict hit


def test_shipped_cpu_table_is_valid():
    path = tuned.table_path("cpu-x86_64-avx512")
    table = json.loads(path.read_text())
    assert table["entries"], "no entries"
    assert all(e["choice"] in cpu.STRATEGIES for e in table["entries"].values())
    assert any(k.startswith("384x384/") for k in table["entries"])


def test_tuner_writes_table_with_progress(tmp_path, capsys):
    out = tmp_path / "t.json"
    rc = tuning.main(["--device", "cpu", "--hidden", "32", "--mlp", "64", "--tokens", "5", "--images", "1,3",
                      "--adapters", "1,2", "--ranks", "4;4,8", "--mixes", "uniform,shuffled", "--repeats", "1",
                      "--out", str(out)])
    assert rc == 0
    table = json.loads(out.read_text())
    assert table["device_kind"] == tuned.device_kind("cpu") and table["entries"]
    assert all(e["choice"] in cpu.STRATEGIES for e in table["entries"].values())
    err = capsys.readouterr().err
    assert "[1/" in err and "eta" in err


def test_composition_grid_mixes():
    grid = tuning.composition_grid(257, [8], [4], [[16]], ["uniform", "skewed", "shuffled"])
    slots = {label.rsplit("/", 1)[1]: s for s, _, label in grid}
    assert slots["uniform"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert slots["skewed"][:4] == [0, 0, 0, 0] and slots["skewed"] == sorted(slots["skewed"])
    assert slots["shuffled"] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert torch.is_tensor(tuning.make_problem(8, 8, [0, 1], [4, 8], 3)[0])
