import textwrap

import pytest

from vlora_va.config import ConfigError, load_config, parse_config

GOOD = textwrap.dedent("""\
    version: 1
    daemon:
      image_size: 224
    adapters:
      detect: adapters/detect
      actions: adapters/actions
    streams:
      - id: cam1
        source: videos/a.mp4
        fps: 10
        tasks:
          - adapter: detect
            frames_per_chunk: 2
            deadline_ms: 1500
      - id: cam2
        source: rtsp://127.0.0.1:8554/cam
        tasks:
          - name: act
            adapter: actions
            frames_per_chunk: 8
    sinks:
      - type: jsonl
        path: out/results.jsonl
    """)


def test_good_config_parses_with_defaults_and_resolved_paths(tmp_path):
    cfg = parse_config(GOOD, "p.yaml", base_dir=tmp_path)
    assert [s.id for s in cfg.streams] == ["cam1", "cam2"]
    cam1, cam2 = cfg.streams
    assert cam1.source == str(tmp_path / "videos/a.mp4") and not cam1.is_rtsp
    assert cam2.source == "rtsp://127.0.0.1:8554/cam" and cam2.is_rtsp
    assert cam1.frames_per_chunk == 10 and cam2.frames_per_chunk == 30
    assert cam1.tasks[0].name == "detect" and cam1.tasks[0].deadline_ms == 1500.0
    assert cam2.tasks[0].name == "act" and cam2.tasks[0].deadline_ms == 1000.0
    assert cfg.adapters["detect"] == str(tmp_path / "adapters/detect")
    assert cfg.sinks[0].path == str(tmp_path / "out/results.jsonl")
    assert cfg.ingest.drop_policy == "drop_oldest" and cfg.daemon.endpoint.startswith("tcp://")


@pytest.mark.parametrize("old, new, line, message", [
    ("adapter: actions", "adapter: detekt", 19,
     "streams[1].tasks[0].adapter: unknown adapter 'detekt' (known: detect, actions)"),
    ("image_size: 224", "image_size: 225", 3, "daemon.image_size: must be a multiple of the patch size 14"),
    ("image_size: 224", "image_size: big", 3, "daemon.image_size: expected int, got str 'big'"),
    ("fps: 10", "fps: -1", 10, "streams[0].fps: must be >= 0.1"),
    ("frames_per_chunk: 2", "frames_per_chunk: 11", 13, "streams[0].tasks[0].frames_per_chunk: 11 frames asked but a chunk holds only 10"),
    ("id: cam2", "id: cam1", 15, "streams[1].id: duplicate stream id 'cam1'"),
    ("id: cam2", "id: 'cam 2'", 15, "streams[1].id: must be 1-64 characters"),
    ("sinks:", "sink:", 21, "sink: unknown key"),
    ("type: jsonl", "type: kafka", 22, "sinks[0].type: must be one of jsonl"),
    ("    fps: 10\n", "    fsp: 10\n", 10, "streams[0].fsp: unknown key"),
    ("    source: videos/a.mp4\n", "", 8, "streams[0].source: required key is missing"),
])
def test_schema_errors_name_key_path_and_line(old, new, line, message):
    assert old in GOOD
    with pytest.raises(ConfigError) as err:
        parse_config(GOOD.replace(old, new, 1), "p.yaml")
    assert message in str(err.value)
    assert err.value.line == line, str(err.value)
    assert str(err.value).startswith(f"p.yaml:{line}: ")


@pytest.mark.parametrize("text, message", [
    ("streams: [", "invalid YAML"),
    ("- just\n- a list\n", "expected a mapping"),
    ("version: 2\n", "unsupported config version 2"),
    ("adapters: {a: x}\nstreams: []\n", "streams: expected a non-empty list of streams"),
    ("adapters: {}\n", "adapters: expected a non-empty mapping"),
])
def test_invalid_documents(text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_config(text, "p.yaml")


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_repository_default_pipeline_is_valid():
    cfg = load_config("pipelines.yaml")
    assert {t.adapter for s in cfg.streams for t in s.tasks} == set(cfg.adapters)
