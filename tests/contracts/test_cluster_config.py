"""vlora_va.contracts.cluster: the `cluster:` section and the streams' `group`; every error names its key path and
line, and is the only one reported for its mistake."""

import textwrap

import pytest

from vlora_va.contracts.cluster import DAEMON_RESOURCE, GROUP, NODE_LABEL_KEY, ClusterConfig, DaemonSpec
from vlora_va.contracts.config import ConfigError, parse_config

BASE = textwrap.dedent("""\
    adapters:
      detect: adapters/detect
    streams:
      - id: cam1
        source: rtsp://127.0.0.1:8554/cam1
        tasks: [{adapter: detect}]
      - id: cam2
        source: rtsp://127.0.0.1:8554/cam2
        tasks: [{adapter: detect}]
    """)

LONG = textwrap.dedent("""\
    cluster:
      daemons:
        - name: a
          resources: {vlora_daemon: 1, gpu_box: 0.5}
          node_label: site-a
          threads: 4
          num_cpus: 2
        - {}
      max_restarts: 3
      ping_s: 0.25
      rebalance_high: 1.2
      rebalance_low: 0.5
      rebalance_after_s: 0
      allow_unauthenticated: true
    """)


def _parse(text: str):
    return parse_config(text, "p.yaml")


def _error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        _parse(text)
    return err.value


def test_no_cluster_section_is_not_enabled_and_streams_have_no_group():
    cfg = _parse(BASE)
    assert cfg.cluster == ClusterConfig() and not cfg.cluster.enabled
    assert [s.group for s in cfg.streams] == ["", ""]


def test_short_form_makes_that_many_default_daemons():
    cluster = _parse(BASE + "cluster: {daemons: 2}\n").cluster
    assert cluster.enabled
    assert cluster.daemons == (DaemonSpec("daemon-0"), DaemonSpec("daemon-1"))
    assert cluster.daemons[0].resources == ((DAEMON_RESOURCE, 1.0),) and cluster.daemons[0].node_label == ""
    assert (cluster.max_restarts, cluster.ping_s, cluster.rebalance_high, cluster.rebalance_low,
            cluster.rebalance_after_s, cluster.allow_unauthenticated) == (-1, 0.5, 0.95, 0.75, 10.0, False)


def test_long_form_reads_every_key_and_names_an_unnamed_daemon_by_its_place():
    cluster = _parse(BASE + LONG).cluster
    assert cluster.daemons == (
        DaemonSpec(name="a", resources=(("vlora_daemon", 1.0), ("gpu_box", 0.5)), node_label="site-a", threads=4,
                   num_cpus=2.0),
        DaemonSpec(name="daemon-1"))
    assert all(isinstance(q, float) for _, q in cluster.daemons[0].resources)
    assert cluster == ClusterConfig(daemons=cluster.daemons, max_restarts=3, ping_s=0.25, rebalance_high=1.2,
                                    rebalance_low=0.5, rebalance_after_s=0.0, allow_unauthenticated=True)


def test_a_daemon_may_reserve_cpus_instead_of_a_custom_resource():
    cluster = _parse(BASE + "cluster: {daemons: [{resources: {}, num_cpus: 4}]}\n").cluster
    assert cluster.daemons == (DaemonSpec(name="daemon-0", resources=(), num_cpus=4.0),)


@pytest.mark.parametrize("section, path, marker, message", [
    ("cluster: 2", "cluster", "cluster:", "expected a mapping, got int"),
    ("cluster: {}", "cluster.daemons", "cluster:", "required key is missing"),
    ("cluster: {daemons: 2, colour: red}", "cluster.colour", "cluster:", "unknown key (allowed: allow_unauth"),
    ("cluster:\n  daemons: 0", "cluster.daemons", "daemons:", "must be 1 to 256 daemons, got 0"),
    ("cluster:\n  daemons: 257", "cluster.daemons", "daemons:", "must be 1 to 256 daemons, got 257"),
    ("cluster:\n  daemons: true", "cluster.daemons", "daemons:", "expected a count of daemons"),
    ("cluster:\n  daemons: []", "cluster.daemons", "daemons:", "or a non-empty list of daemons, got list []"),
    ("cluster:\n  daemons: two", "cluster.daemons", "daemons:", "got str 'two'"),
    ("cluster:\n  daemons:\n" + "    - {}\n" * 257, "cluster.daemons", "daemons:", "257 daemons, at most 256"),
    ("cluster:\n  daemons:\n    - 3", "cluster.daemons[0]", "- 3", "expected a mapping, got int"),
    ("cluster:\n  daemons:\n    - {nme: a}", "cluster.daemons[0].nme", "nme", "unknown key (allowed: name, node_label"),
    ("cluster:\n  daemons:\n    - {name: a}\n    - {name: x}\n    - {name: a}", "cluster.daemons[2].name",
     "- {name: a}\n", "duplicate daemon name 'a' (also cluster.daemons[0])"),
    ("cluster:\n  daemons:\n    - {name: daemon-1}\n    - {}", "cluster.daemons[1].name", "- {}",
     "duplicate daemon name 'daemon-1'"),
    ("cluster:\n  daemons:\n    - {name: a.b}", "cluster.daemons[0].name", "name:", "must be 1-64 letters, digits"),
    ("cluster:\n  daemons:\n    - {name: daemon-1}\n    - {name: 7}", "cluster.daemons[1].name", "name: 7",
     "expected str, got int"),
    ("cluster:\n  daemons:\n    - resources: 1", "cluster.daemons[0].resources", "resources:",
     "expected a mapping of Ray resource name -> amount"),
    ("cluster:\n  daemons:\n    - resources:\n        vlora_daemon: 0", "cluster.daemons[0].resources.vlora_daemon",
     "vlora_daemon:", "must be > 0, got 0.0"),
    ("cluster:\n  daemons:\n    - resources:\n        vlora_daemon: -1",
     "cluster.daemons[0].resources.vlora_daemon", "vlora_daemon:", "must be >= 0, got -1.0"),
    ("cluster:\n  daemons:\n    - resources:\n        vlora_daemon: many",
     "cluster.daemons[0].resources.vlora_daemon", "vlora_daemon:", "expected float, got str 'many'"),
    ("cluster:\n  daemons:\n    - resources:\n        vlora_daemon:", "cluster.daemons[0].resources.vlora_daemon",
     "vlora_daemon:", "expected an amount > 0"),
    ("cluster:\n  daemons:\n    - resources:\n        vlora_daemon: 0.00001",
     "cluster.daemons[0].resources.vlora_daemon", "vlora_daemon:", "steps of 0.0001"),
    ("cluster:\n  daemons:\n    - resources:\n        CPU: 2", "cluster.daemons[0].resources.CPU", "CPU:",
     "give the daemon's num_cpus instead"),
    ("cluster:\n  daemons:\n    - resources:\n        GPU: 1", "cluster.daemons[0].resources.GPU", "GPU:",
     "Ray counts GPUs apart from custom resources"),
    ("cluster:\n  daemons:\n    - resources:\n        'a b': 1", "cluster.daemons[0].resources.a b", "'a b'",
     "a Ray resource name is 1-128"),
    ("cluster:\n  daemons:\n    - resources: {}", "cluster.daemons[0].resources", "resources:",
     "this daemon reserves nothing"),
    ("cluster:\n  daemons:\n    - node_label: -site", "cluster.daemons[0].node_label", "node_label:",
     "must be 1-63 letters, digits"),
    ("cluster:\n  daemons:\n    - node_label: site_", "cluster.daemons[0].node_label", "node_label:",
     "starting and ending with a letter or digit"),
    ("cluster:\n  daemons:\n    - threads: -1", "cluster.daemons[0].threads", "threads:", "must be >= 0, got -1"),
    ("cluster:\n  daemons:\n    - num_cpus: -2", "cluster.daemons[0].num_cpus", "num_cpus:", "must be >= 0"),
    ("cluster:\n  daemons: 1\n  max_restarts: -2", "cluster.max_restarts", "max_restarts:", "must be >= -1, got -2"),
    ("cluster:\n  daemons: 1\n  max_restarts: 1.5", "cluster.max_restarts", "max_restarts:", "expected int"),
    ("cluster:\n  daemons: 1\n  ping_s: 0", "cluster.ping_s", "ping_s:", "must be > 0, got 0.0"),
    ("cluster:\n  daemons: 1\n  rebalance_high: 2", "cluster.rebalance_high", "rebalance_high:",
     "must be in (0, 1.5]"),
    ("cluster:\n  daemons: 1\n  rebalance_low: 0", "cluster.rebalance_low", "rebalance_low:", "must be in (0, 1.5]"),
    ("cluster:\n  daemons: 1\n  rebalance_high: 0.8\n  rebalance_low: 0.8", "cluster.rebalance_low",
     "rebalance_low:", "must be below rebalance_high (0.8), got 0.8"),
    ("cluster:\n  daemons: 1\n  rebalance_after_s: -1", "cluster.rebalance_after_s", "rebalance_after_s:",
     "must be >= 0"),
    ("cluster:\n  daemons: 1\n  allow_unauthenticated: 'yes'", "cluster.allow_unauthenticated",
     "allow_unauthenticated:", "expected bool, got str 'yes'"),
])
def test_each_problem_is_reported_once_with_its_key_path_and_line(section, path, marker, message):
    text = BASE + section + "\n"
    line = text[:text.rindex(marker)].count("\n") + 1  # the last occurrence: the section follows BASE
    err = _error(text)
    assert [e.key_path for e in err.errors] == [path], str(err)
    assert err.line == line and message in err.message, str(err)
    assert str(err).startswith(f"p.yaml:{line}: {path}: ")


def test_independent_cluster_problems_are_all_reported():
    section = "cluster:\n  daemons:\n    - {name: 'a b', threads: x}\n  ping_s: -1\n"
    err = _error(BASE + section)
    assert [(e.key_path, e.line) for e in err.errors] == [
        ("cluster.daemons[0].name", 12), ("cluster.daemons[0].threads", 12), ("cluster.ping_s", 13)], str(err)


def test_a_bad_rebalance_bound_is_not_compared_with_the_other():
    err = _error(BASE + "cluster: {daemons: 1, rebalance_high: 0.5, rebalance_low: 9}\n")
    assert [e.key_path for e in err.errors] == ["cluster.rebalance_low"] and "(0, 1.5]" in err.message


def test_streams_group_is_parsed():
    text = BASE.replace("id: cam2\n", "id: cam2\n    group: site-a.north_2\n")
    assert [s.group for s in _parse(text).streams] == ["", "site-a.north_2"]


@pytest.mark.parametrize("value, message", [
    ("'-a'", "must be 1-63 letters, digits, '_', '.', '-', starting and ending with a letter or digit"),
    ("'a b'", "got 'a b'"),
    ("x" * 64, "must be 1-63"),
    ("3", "expected str, got int"),
])
def test_a_bad_stream_group_names_its_key_path_and_line(value, message):
    err = _error(BASE.replace("id: cam2\n", f"id: cam2\n    group: {value}\n"))
    assert [e.key_path for e in err.errors] == ["streams[1].group"], str(err)
    assert err.line == 8 and message in err.message, str(err)


def test_a_group_and_daemon_node_labels_need_not_match():
    text = BASE.replace("id: cam1\n", "id: cam1\n    group: site-a\n") + "cluster:\n  daemons: [{node_label: b}]\n"
    cfg = _parse(text)
    assert cfg.streams[0].group == "site-a" and cfg.cluster.daemons[0].node_label == "b"


def test_names_agree_with_rays_label_rules():
    """What is accepted here as a group or node label, and the label key, Ray accepts too (and the reverse)."""
    labels = pytest.importorskip("ray._private.label_utils")
    assert labels.validate_label_key(NODE_LABEL_KEY) is None
    assert not NODE_LABEL_KEY.startswith("ray.io/")  # Ray's own labels
    for value in ("a", "site-a", "a.b_c-9", "9", "x" * 63, "-a", "a-", "_a", "a b", "x" * 64, "a/b", "é"):
        try:
            labels.validate_label_value(value)
            ray_ok = True
        except ValueError:
            ray_ok = False
        assert bool(GROUP.fullmatch(value)) == ray_ok, value
