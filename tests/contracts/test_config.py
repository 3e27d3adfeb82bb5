"""vlora_va.contracts.config: the typed schema of pipelines.yaml; every error names the key path and the line."""

import textwrap

import pytest

from vlora_va.contracts.config import DEGRADE_OPTIONS, ConfigError, DaemonConfig, TaskConfig, load_config, parse_config
from vlora_va.contracts.plugins import POLICIES
from vlora_va.contracts.wire import MAX_FRAMES, MAX_TASKS

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
    assert cam1.source == str(tmp_path / "videos/a.mp4") and cam1.scheme == "file"
    assert cam2.source == "rtsp://127.0.0.1:8554/cam" and cam2.scheme == "rtsp"
    assert cam1.frames_per_chunk == 10 and cam2.frames_per_chunk == 30
    assert cam1.tasks[0].name == "detect" and cam1.tasks[0].deadline_ms == 1500.0
    assert cam2.tasks[0].name == "act" and cam2.tasks[0].deadline_ms == 1000.0
    assert cfg.adapters["detect"] == str(tmp_path / "adapters/detect")
    assert cfg.sinks[0].options.path == str(tmp_path / "out/results.jsonl")
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


def _error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "p.yaml")
    return err.value


# ---------------------------------------------------------------- daemon: scheduling keys


def test_scheduling_keys_default_and_parse():
    d = parse_config(GOOD, "p.yaml").daemon
    assert (d.policy, d.starvation_ms, d.degrade, d.profile_cache) == ("vlora", 500.0, "shed", "")
    assert POLICIES.names() == ("vlora", "edf", "merge-only", "unmerge-only", "dlora")
    assert DEGRADE_OPTIONS == ("shed", "frames", "stride")
    text = GOOD.replace("  image_size: 224\n", "  image_size: 224\n  policy: merge-only\n  starvation_ms: 250\n"
                                               "  degrade: stride\n  profile_cache: /tmp/profiles\n")
    d = parse_config(text, "p.yaml").daemon
    assert d == DaemonConfig(image_size=224, policy="merge-only", starvation_ms=250.0, degrade="stride",
                             profile_cache="/tmp/profiles")
    assert type(d.starvation_ms) is float


@pytest.mark.parametrize("policy", POLICIES.names())
def test_every_policy_is_accepted(policy):
    cfg = parse_config(GOOD.replace("  image_size: 224\n", f"  image_size: 224\n  policy: {policy}\n"), "p.yaml")
    assert cfg.daemon.policy == policy


@pytest.mark.parametrize("line, message", [
    ("policy: fifo", "p.yaml:4: daemon.policy: must be one of vlora, edf, merge-only, unmerge-only, dlora, got 'fifo'"),
    ("policy: VLoRA", "p.yaml:4: daemon.policy: must be one of vlora, edf, merge-only, unmerge-only, dlora, "
                      "got 'VLoRA'"),
    ("policy: 3", "p.yaml:4: daemon.policy: expected str, got int 3"),
    ("degrade: drop", "p.yaml:4: daemon.degrade: must be one of shed, frames, stride, got 'drop'"),
    ("degrade: [shed]", "p.yaml:4: daemon.degrade: expected str, got list"),
    ("starvation_ms: -1", "p.yaml:4: daemon.starvation_ms: must be >= 0, got -1.0"),
    ("starvation_ms: soon", "p.yaml:4: daemon.starvation_ms: expected float, got str 'soon'"),
    ("profile_cache: 5", "p.yaml:4: daemon.profile_cache: expected str, got int 5"),
    ("polcy: edf", "p.yaml:4: daemon.polcy: unknown key (allowed: "),
])
def test_scheduling_key_errors_name_the_choices_and_the_line(line, message):
    err = _error(GOOD.replace("  image_size: 224\n", f"  image_size: 224\n  {line}\n"))
    assert str(err).startswith(message), str(err)
    assert err.line == 4


# ---------------------------------------------------------------- priorities

PRIORITIES = textwrap.dedent("""\
    adapters: {detect: a/detect, actions: a/actions}
    streams:
      - id: cam1
        source: a.mp4
        priority: 5
        tasks:
          - {name: det, adapter: detect}
          - {name: act, adapter: actions, priority: -2}
          - {name: zero, adapter: actions, priority: 0}
      - id: cam2
        source: b.mp4
        tasks:
          - {name: det, adapter: detect}
          - {name: act, adapter: actions, priority: 1000}
    """)


def test_priority_is_inherited_from_the_stream_and_overridden_per_task():
    cam1, cam2 = parse_config(PRIORITIES, "p.yaml").streams
    assert cam1.priority == 5 and cam2.priority == 0
    assert [(t.name, t.priority) for t in cam1.tasks] == [("det", 5), ("act", -2), ("zero", 0)]
    assert [(t.name, t.priority) for t in cam2.tasks] == [("det", 0), ("act", 1000)]
    assert TaskConfig("t", "a", 1, 100.0).priority == 0


@pytest.mark.parametrize("old, new, line, message", [
    ("priority: 5", "priority: 1001", 5, "streams[0].priority: must be in [-1000, 1000], got 1001"),
    ("priority: 5", "priority: -1001", 5, "streams[0].priority: must be in [-1000, 1000], got -1001"),
    ("priority: -2", "priority: -5000", 8, "streams[0].tasks[1].priority: must be in [-1000, 1000], got -5000"),
    ("priority: 1000", "priority: 1001", 14, "streams[1].tasks[1].priority: must be in [-1000, 1000], got 1001"),
    ("priority: 5", "priority: high", 5, "streams[0].priority: expected int, got str 'high'"),
    ("priority: 5", "priority: 2.5", 5, "streams[0].priority: expected int, got float 2.5"),
    ("priority: 5", "priority: true", 5, "streams[0].priority: expected int, got bool True"),
    ("priority: -2", "priority: 1.0", 8, "streams[0].tasks[1].priority: expected int, got float 1.0"),
    ("priority: -2", "prio: -2", 8, "streams[0].tasks[1].prio: unknown key"),
])
def test_priority_errors(old, new, line, message):
    assert old in PRIORITIES
    err = _error(PRIORITIES.replace(old, new, 1))
    assert str(err).startswith(f"p.yaml:{line}: {message}"), str(err)


# ---------------------------------------------------------------- names and limits


@pytest.mark.parametrize("old, new, line, message", [
    ("- name: act", "- name: 'my act'", 18, "streams[1].tasks[0].name: must be 1-64 characters of letters, digits"),
    ("- name: act", "- name: act/1", 18, "streams[1].tasks[0].name: must be 1-64 characters"),
    ("- name: act", "- name: " + "a" * 65, 18, "streams[1].tasks[0].name: must be 1-64 characters"),
    ("- name: act", "- name: ''", 18, "streams[1].tasks[0].name: must be 1-64 characters"),
    ("- name: act", "- name: 12", 18, "streams[1].tasks[0].name: expected str, got int 12"),
    ("deadline_ms: 1500", "deadline_ms: 3600001", 14,
     "streams[0].tasks[0].deadline_ms: must be at most one hour (3600000)"),
    ("deadline_ms: 1500", "deadline_ms: 1.0e+9", 14, "streams[0].tasks[0].deadline_ms: must be at most one hour"),
    ("deadline_ms: 1500", "deadline_ms: 0.5", 14, "streams[0].tasks[0].deadline_ms: must be >= 1"),
    ("deadline_ms: 1500", "deadline_ms: .inf", 14, "streams[0].tasks[0].deadline_ms: must be a finite number"),
    ("deadline_ms: 1500", "deadline_ms: 3600001", 14, "streams[0].tasks[0].deadline_ms: must be at most one hour"),
    ("    fps: 10\n", "    fps: 30\n    chunk_seconds: 5\n", 11,
     "streams[0].chunk_seconds: a chunk of 150 frames (fps x chunk_seconds) is more than the 128 one message "
     "may carry"),
    ("    fps: 10\n", "    fps: 129\n", 8, "streams[0].chunk_seconds: a chunk of 129 frames"),
    ("  detect: adapters/detect\n", "  'my detect': adapters/detect\n", 5,
     "adapters.my detect: an adapter name is 1-64 characters of letters, digits, '_', '.', '-'"),
    ("  detect: adapters/detect\n", "  ../detect: adapters/detect\n", 5, "adapters.../detect: an adapter name is"),
    ("  detect: adapters/detect\n", f"  {'d' * 65}: adapters/detect\n", 5,
     f"adapters.{'d' * 65}: an adapter name is 1-64 characters"),
])
def test_name_and_limit_errors(old, new, line, message):
    assert old in GOOD
    err = _error(GOOD.replace(old, new, 1))
    assert str(err).startswith(f"p.yaml:{line}: {message}"), str(err)


def test_limits_are_inclusive():
    text = (GOOD.replace("deadline_ms: 1500", "deadline_ms: 3600000").replace("    fps: 10\n", "    fps: 32\n"
            "    chunk_seconds: 4\n").replace("frames_per_chunk: 2", f"frames_per_chunk: {MAX_FRAMES}"))
    cam1 = parse_config(text, "p.yaml").streams[0]
    assert cam1.frames_per_chunk == MAX_FRAMES and cam1.tasks[0].frames_per_chunk == MAX_FRAMES
    assert cam1.tasks[0].deadline_ms == 3_600_000.0
    name64 = "n" * 64
    assert parse_config(GOOD.replace("- name: act", f"- name: {name64}"), "p.yaml").streams[1].tasks[0].name == name64


def _many_tasks(n: int) -> str:
    tasks = "".join(f"      - {{name: t{i}, adapter: detect}}\n" for i in range(n))
    return f"adapters: {{detect: a}}\nstreams:\n  - id: cam\n    source: a.mp4\n    tasks:\n{tasks}"


def test_too_many_tasks_in_one_stream():
    assert len(parse_config(_many_tasks(MAX_TASKS), "p.yaml").streams[0].tasks) == MAX_TASKS
    err = _error(_many_tasks(MAX_TASKS + 1))
    assert str(err).startswith(f"p.yaml:5: streams[0].tasks: {MAX_TASKS + 1} tasks, at most {MAX_TASKS} per stream")


def test_duplicate_task_names_in_one_stream():
    err = _error(_many_tasks(2).replace("name: t1", "name: t0"))
    assert str(err).startswith("p.yaml:7: streams[0].tasks[1].name: duplicate task name 't0' in this stream"), str(err)


@pytest.mark.parametrize("old, new, path", [
    ("- name: act", '- name: "act\\n"', "streams[1].tasks[0].name"),
    ("id: cam2", 'id: "cam2\\n"', "streams[1].id"),
    ("  detect: adapters/detect\n", '  "detect\\n": adapters/detect\n', "adapters.detect\n"),
], ids=["task-name", "stream-id", "adapter-name"])
def test_names_with_a_trailing_newline_are_refused(old, new, path):
    """The name patterns end in `$`, which also matches before a final newline: "act\\n" is not a name."""
    assert old in GOOD
    err = _error(GOOD.replace(old, new, 1))
    assert err.key_path == path


NUMBERS = textwrap.dedent("""\
    daemon: {max_wait_ms: 20, starvation_ms: 500}
    ingest: {reconnect_max_s: 10}
    adapters: {d: a}
    streams:
      - id: cam
        source: a.mp4
        fps: 10
        chunk_seconds: 1
        tasks:
          - {adapter: d, deadline_ms: 100}
    """)


@pytest.mark.parametrize("old, new, path", [
    ("deadline_ms: 100", "deadline_ms: .nan", "streams[0].tasks[0].deadline_ms"),
    ("deadline_ms: 100", "deadline_ms: 1" + "0" * 400, "streams[0].tasks[0].deadline_ms"),
    ("fps: 10", "fps: .nan", "streams[0].fps"),
    ("fps: 10", "fps: .inf", "streams[0].fps"),
    ("fps: 10", "fps: 1" + "0" * 400, "streams[0].fps"),
    ("chunk_seconds: 1", "chunk_seconds: .inf", "streams[0].chunk_seconds"),
    ("max_wait_ms: 20", "max_wait_ms: .nan", "daemon.max_wait_ms"),
    ("starvation_ms: 500", "starvation_ms: .inf", "daemon.starvation_ms"),
    ("reconnect_max_s: 10", "reconnect_max_s: .nan", "ingest.reconnect_max_s"),
], ids=["deadline-nan", "deadline-huge-int", "fps-nan", "fps-inf", "fps-huge-int", "chunk-inf", "max_wait-nan",
        "starvation-inf", "reconnect-nan"])
def test_numbers_must_be_finite(old, new, path):
    """NaN / infinity / integers no float holds are config errors at their key, not a crash (ValueError,
    OverflowError) nor a value accepted here that every chunk then carries and the daemon refuses."""
    assert old in NUMBERS
    parse_config(NUMBERS, "p.yaml")  # the file itself is fine
    err = _error(NUMBERS.replace(old, new, 1))
    assert err.key_path == path, str(err)


# ---------------------------------------------------------------- every problem, not only the first


def test_every_independent_problem_is_reported_in_file_order():
    """Three unrelated mistakes in three sections: one ConfigError naming all three, each with its key path and
    line, in the order of the file (the daemon's is found last but is first in the file)."""
    text = (GOOD.replace("image_size: 224", "image_size: 225").replace("adapter: actions", "adapter: detekt")
            .replace("type: jsonl", "type: kafka"))
    err = _error(text)
    assert [(e.key_path, e.line) for e in err.errors] == [
        ("daemon.image_size", 3), ("streams[1].tasks[0].adapter", 19), ("sinks[0].type", 22)]
    assert str(err).splitlines() == [
        "p.yaml:3: daemon.image_size: must be a multiple of the patch size 14, got 225",
        "p.yaml:19: streams[1].tasks[0].adapter: unknown adapter 'detekt' (known: detect, actions)",
        "p.yaml:22: sinks[0].type: must be one of jsonl, mqtt, stdout, webhook, got 'kafka'",
    ]
    assert (err.key_path, err.line, err.file) == ("daemon.image_size", 3, "p.yaml")  # the first problem's


def test_one_problem_reads_as_before():
    err = _error(GOOD.replace("adapter: actions", "adapter: detekt"))
    assert err.errors == [err]
    assert str(err) == "p.yaml:19: streams[1].tasks[0].adapter: unknown adapter 'detekt' (known: detect, actions)"


@pytest.mark.parametrize("old, new, path", [
    # adapters: broken as a whole: the tasks' adapters are not each reported unknown
    ("  detect: adapters/detect\n  actions: adapters/actions\n", "  - detect\n", "adapters"),
    # a bad fps: the chunk's size is unknown, so the task asking 31 frames is not reported (the default fps 30
    # would make a 30-frame chunk)
    ("fps: 10\n    tasks:\n      - adapter: detect\n        frames_per_chunk: 2\n",
     "fps: -1\n    tasks:\n      - adapter: detect\n        frames_per_chunk: 31\n", "streams[0].fps"),
    # an out-of-range stream priority is not inherited by (and reported again for) its tasks
    ("fps: 10\n", "fps: 10\n    priority: 5000\n", "streams[0].priority"),
    # a sink of an unknown type: its keys are not each reported as not its options
    ("type: jsonl", "type: kafka", "sinks[0].type"),
    # a bad http_port is not also reported as clashing with metrics_port
    ("image_size: 224", "image_size: 224\n  http_port: 70000\n  metrics_port: 9000", "daemon.http_port"),
    # a task's bad name does not read as its adapter's name, reported again as a duplicate of the next task's
    ("  - name: act\n        adapter: actions\n        frames_per_chunk: 8\n",
     "  - name: 5\n        adapter: actions\n        frames_per_chunk: 8\n      - {name: actions, adapter: actions}\n",
     "streams[1].tasks[0].name"),
], ids=["adapters-broken", "bad-fps", "stream-priority", "sink-type", "http-port", "bad-task-name"])
def test_a_problem_is_not_reported_again_through_what_depends_on_it(old, new, path):
    assert old in GOOD
    err = _error(GOOD.replace(old, new, 1))
    assert [e.key_path for e in err.errors] == [path], str(err)


def test_checking_goes_on_past_a_broken_list_item_and_a_broken_section():
    text = textwrap.dedent("""\
        daemon: 5
        adapters: {d: a}
        streams:
          - 7
          - id: b
            source: b.mp4
            tasks: [3, {adapter: d, name: 4}]
        """)
    err = _error(text)
    assert [(e.key_path, e.line) for e in err.errors] == [
        ("daemon", 1), ("streams[0]", 4), ("streams[1].tasks[0]", 7), ("streams[1].tasks[1].name", 7)], str(err)


def test_missing_top_level_keys_are_reported_without_a_line():
    err = _error("daemon: {}\n")
    assert str(err).splitlines() == ["p.yaml: adapters: required key is missing (map adapter name -> directory)",
                                     "p.yaml: streams: expected a non-empty list of streams"]
