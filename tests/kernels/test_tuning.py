"""kernels/tuning_tables.py and kernels/tuning.py: bucket keys, O(1) lookup with a default for unseen shapes, the
shipped CPU table, the tuner."""

import json

import pytest
import torch

from vlora_va.kernels import Segments, cpu, tuning, tuning_tables


def test_bucket_key_rounds_rows_runs_and_rank():
    seg = Segments.from_elements([0, 0, 1, 2, 2], 257)
    key = tuning_tables.bucket_key(384, 1536, seg, [16, 8, 48])
    assert key == "384x1536/rows2048/runs4/ad4/r64/g"
    assert tuning_tables.bucket_key(384, 1536, Segments.from_elements([0, 1, 0], 257), [16, 16]).endswith("/u")


def test_unseen_shape_gets_rule_default_and_is_memoised():
    seg = Segments.from_elements([0, 1, 0, 1], 257)
    assert cpu.lookup(7, 9, seg, [16, 16]) == cpu.default_strategy(seg) == "runs"
    tiny = Segments.from_row_slots([0, 1, 2] * 20)  # one row per run: two GEMMs over all rows win
    assert cpu.default_strategy(tiny) == "fused"
    assert any(k[0] == "choice" for k in seg._cache)  # second layer of the same shape: one dict hit


def test_shipped_cpu_table_is_valid():
    path = tuning_tables.table_path("cpu-x86_64-avx512")
    table = json.loads(path.read_text())
    assert table["entries"], "no entries"
    assert all(e["choice"] in cpu.STRATEGIES for e in table["entries"].values())
    assert any(k.startswith("384x384/") for k in table["entries"])


def test_shipped_gpu_tables_hold_tiles_the_kernels_take():
    """Each shipped CUDA table (vlora-va tune on that GPU) parses into Triton tile configs with tiles >= 16 (what
    tl.dot needs), and covers the per-image layout CUDA graphs replay."""
    paths = sorted(tuning_tables.TABLE_DIR.glob("cuda-*.json"))
    assert paths, "no GPU table shipped"
    for path in paths:
        table = json.loads(path.read_text())
        assert table["device_kind"] == path.stem and table["dtype"] == "bfloat16"
        assert any(k.startswith("images/") for k in table["entries"])
        for key, e in table["entries"].items():
            for kernel in ("shrink", "expand"):
                t = e["choice"][kernel]
                assert min(t["block_m"], t["block_n"], t["block_k"]) >= 16 and t["num_warps"] in (1, 2, 4, 8), key


def test_tuner_writes_table_with_progress(tmp_path, capsys):
    out = tmp_path / "t.json"
    rc = tuning.main(["--device", "cpu", "--hidden", "32", "--mlp", "64", "--tokens", "5", "--images", "1,3",
                      "--adapters", "1,2", "--ranks", "4;4,8", "--mixes", "uniform,shuffled", "--repeats", "1",
                      "--out", str(out)])
    assert rc == 0
    table = json.loads(out.read_text())
    assert table["device_kind"] == tuning_tables.device_kind("cpu") and table["entries"]
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


@pytest.mark.parametrize("kind, available, want", [
    ("cpu-x86_64-avx2", ["cpu-x86_64-avx512"], "cpu-x86_64-avx512"),
    ("cpu-x86_64-avx512", ["cpu-x86_64-avx2", "cpu-x86_64-default"], "cpu-x86_64-avx2"),  # narrower first
    ("cpu-x86_64-default", ["cpu-x86_64-avx512", "cpu-x86_64-avx2"], "cpu-x86_64-avx2"),
    ("cpu-aarch64-default", ["cpu-x86_64-avx512"], None),  # another processor family: nothing to borrow
    ("cuda-nvidia-h100", ["cpu-x86_64-avx512"], None),
])
def test_nearest_kind(kind, available, want):
    assert tuning_tables.nearest_kind(kind, available) == want


@pytest.fixture
def fresh_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("VLORA_VA_TABLES", str(tmp_path))
    saved = dict(tuning_tables._TABLES)
    tuning_tables._TABLES.clear()
    yield tmp_path
    tuning_tables._TABLES.clear()
    tuning_tables._TABLES.update(saved)


def test_a_cpu_without_its_own_table_borrows_the_nearest_and_says_so(fresh_tables, caplog):
    if (tuning_tables.TABLE_DIR / "cpu-x86_64-avx2.json").exists():
        pytest.skip("an avx2 table ships now: nothing to borrow")
    table = tuning_tables.load_table("cpu-x86_64-avx2")  # only the avx512 table ships
    assert table["entries"] and table is tuning_tables.load_table("cpu-x86_64-avx512")
    assert "no ATMM tuning table for cpu-x86_64-avx2: using cpu-x86_64-avx512's" in caplog.text
    caplog.clear()
    tuning_tables.load_table("cpu-x86_64-avx2")  # cached: said once
    assert "no ATMM tuning table" not in caplog.text


def test_shipped_table_hits_return_the_measured_choice_not_the_rule():
    """The table's whole point: where it measured another strategy than the rule, lookups return it."""
    table = tuning_tables.load_table("cpu-x86_64-avx512")
    for key, entry in table["entries"].items():
        shape, rows, runs, ad, r, grouped = key.split("/")
        n_in, n_out = map(int, shape.split("x"))
        n_ad, rank, n_runs = int(ad[2:]), int(r[1:]), int(runs[4:])
        tokens = int(rows[4:]) // n_runs if grouped == "g" else 1
        slots = [i * n_ad // n_runs for i in range(n_runs)] if grouped == "g" else [i % n_ad for i in range(n_runs)]
        seg = Segments.from_elements(slots, tokens)
        ranks = [rank] * n_ad
        if tuning_tables.bucket_key(n_in, n_out, seg, ranks) != key or entry["choice"] == cpu.default_strategy(seg):
            continue
        assert tuning_tables.lookup("cpu-x86_64-avx512", n_in, n_out, seg, ranks) == entry["choice"]
        return
    pytest.fail("no table entry whose choice differs from the rule could be rebuilt")


def test_triton_table_hits_parse_the_tile_config(fresh_tables):
    from vlora_va.kernels import triton_atmm
    from vlora_va.kernels.triton_atmm import TileConfig, TritonConfig
    seg = Segments.from_elements([0, 0, 1, 1], 64)
    kind = tuning_tables.device_kind("cpu")
    cfg = TritonConfig(TileConfig(64, 16, 32, 4, 3), TileConfig(16, 128, 16, 8, 2))
    key = tuning_tables.bucket_key(384, 1536, seg, [16, 16])
    (fresh_tables / f"{kind}.json").write_text(json.dumps({"entries": {key: {"choice": cfg.to_json()}}}))
    assert triton_atmm.lookup(384, 1536, seg, [16, 16], "cpu") == cfg
    other = Segments.from_elements([0, 1], 64)
    from vlora_va.kernels.triton_atmm import DEFAULT_CONFIG
    assert triton_atmm.lookup(384, 1536, other, [16, 16], "cpu") == DEFAULT_CONFIG
