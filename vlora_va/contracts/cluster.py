"""The `cluster:` section of pipelines.yaml and the streams' `group`: which daemons cluster mode starts on Ray.

Short form, N daemons with the defaults (named daemon-0 ... daemon-<N-1>):

    cluster: {daemons: 2}

Long form, each daemon placed by the Ray resources it asks for and, optionally, a node label:

    cluster:
      daemons:
        - {name: a, resources: {vlora_daemon: 1}, node_label: site-a, threads: 4}
        - {name: b}
      max_restarts: 3
      rebalance_high: 0.95

Per stream, `group: site-a` says on which nodes its ingest worker runs (those whose NODE_LABEL_KEY label is site-a).
The section only takes effect with `vlora-va run --cluster ...` (vlora_va/cluster/); without it the section is still
checked here, so a file is valid or not whatever the command line. This module only describes and checks: it
imports no Ray (contracts import only common). Names of node labels follow Ray's (Kubernetes') label syntax, so a
value Ray would refuse at start-up is refused here with its key path instead. The parsing functions take
config.py's checker (duck typed), like scene.py, so this module does not import config.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The Ray node label that names a node's group (`ray start --labels vlora-va/group=site-a`). Ray 2.58 takes a
# "prefix/name" key whose prefix is a DNS subdomain (ray/_private/label_utils.py validate_label_key); "ray.io/" is
# Ray's own prefix, so ours is the project's.
NODE_LABEL_KEY = "vlora-va/group"
DAEMON_RESOURCE = "vlora_daemon"  # the custom Ray resource a node offers per daemon it may run
MAX_DAEMONS = 256
DAEMON_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # used with fullmatch
# A label value as Ray checks it (label_utils.LABEL_REGEX): 1-63 characters, letters and digits at both ends.
GROUP = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
RESOURCE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# Ray keeps resource quantities in units of 1/10000: a smaller non-zero amount is refused by Ray at start-up.
MIN_QUANTITY = 0.0001
MAX_REBALANCE = 1.5  # utilisation is need_s per second of video: above 1 the daemon is already behind

_DAEMON_KEYS = {"name", "resources", "node_label", "threads", "num_cpus"}
_CLUSTER_KEYS = {"daemons", "max_restarts", "ping_s", "rebalance_high", "rebalance_low", "rebalance_after_s",
                 "allow_unauthenticated"}
_GROUP_RULE = "1-63 letters, digits, '_', '.', '-', starting and ending with a letter or digit (a Ray label value)"


@dataclass(frozen=True)
class DaemonSpec:
    """One daemon of cluster mode, a Ray actor."""

    name: str  # unique; DAEMON_NAME
    resources: tuple[tuple[str, float], ...] = ((DAEMON_RESOURCE, 1.0),)  # Ray resources the actor asks for
    node_label: str = ""  # "" = any node; else only nodes whose NODE_LABEL_KEY label equals it
    threads: int = 0  # torch threads for this daemon; 0 = daemon.threads
    num_cpus: float = 0.0  # Ray CPUs the actor reserves (0: the custom resource is what places it)


@dataclass(frozen=True)
class ClusterConfig:
    daemons: tuple[DaemonSpec, ...] = ()  # empty: no cluster section
    max_restarts: int = -1  # Ray restarts a dead daemon actor this often (-1: always)
    ping_s: float = 0.5  # the controller asks each daemon this often whether it lives
    rebalance_high: float = 0.95  # utilisation above which a daemon is overloaded...
    rebalance_low: float = 0.75  # ...streams move only to daemons that stay below this
    rebalance_after_s: float = 10.0  # ...once it has stayed overloaded this long
    allow_unauthenticated: bool = False  # join a Ray cluster that does not use token authentication

    @property
    def enabled(self) -> bool:
        return bool(self.daemons)


# ---------------------------------------------------------------- parsing (c: config_checker.Checker)
def parse_group(c, d: dict, path: str) -> str:
    """A stream's `group` ("" when not given or bad: reported)."""
    group = c.get(d, "group", path, str, "")
    if group and not GROUP.fullmatch(group):
        c.error(f"{path}.group", f"must be {_GROUP_RULE}, got {group!r}")
        return ""
    return group


def parse_cluster(c, raw: Any) -> ClusterConfig:
    """The top-level `cluster:`; ClusterConfig() (not enabled) when absent, or when it is broken (reported)."""
    if raw is None:
        return ClusterConfig()
    d = c.mapping(raw, "cluster", _CLUSTER_KEYS)
    if d is None:
        return ClusterConfig()
    daemons = _daemons(c, d.get("daemons"))
    dflt = ClusterConfig()
    ping_s = c.get(d, "ping_s", "cluster", float, dflt.ping_s)
    if ping_s <= 0:
        c.error("cluster.ping_s", f"must be > 0, got {ping_s}")
    high = _fraction(c, d, "rebalance_high", dflt.rebalance_high)
    low = _fraction(c, d, "rebalance_low", dflt.rebalance_low)
    if low >= high and not (c.failed("cluster.rebalance_high") or c.failed("cluster.rebalance_low")):
        c.error("cluster.rebalance_low", f"must be below rebalance_high ({high}), got {low}: the gap is what keeps "
                                         f"a moved stream from moving back")
    return ClusterConfig(
        daemons=daemons,
        max_restarts=c.get(d, "max_restarts", "cluster", int, dflt.max_restarts, minimum=-1),
        ping_s=ping_s, rebalance_high=high, rebalance_low=low,
        rebalance_after_s=c.get(d, "rebalance_after_s", "cluster", float, dflt.rebalance_after_s, minimum=0),
        allow_unauthenticated=c.get(d, "allow_unauthenticated", "cluster", bool, dflt.allow_unauthenticated))


def _fraction(c, d: dict, key: str, default: float) -> float:
    v = c.get(d, key, "cluster", float, default)
    if not 0 < v <= MAX_REBALANCE:
        c.error(f"cluster.{key}", f"must be in (0, {MAX_REBALANCE}] (a daemon's utilisation), got {v}")
    return v


def _daemons(c, raw: Any) -> tuple[DaemonSpec, ...]:
    """cluster.daemons: a count (the defaults) or a list of daemons; () when broken (reported)."""
    path = "cluster.daemons"
    if raw is None:
        c.error(path, "required key is missing (a count of daemons, e.g. 2, or a list of {name, resources, ...})")
        return ()
    if isinstance(raw, int) and not isinstance(raw, bool):
        if not 1 <= raw <= MAX_DAEMONS:
            c.error(path, f"must be 1 to {MAX_DAEMONS} daemons, got {raw}")
            return ()
        return tuple(DaemonSpec(name=f"daemon-{i}") for i in range(raw))
    if not isinstance(raw, list) or not raw:
        c.error(path, f"expected a count of daemons (1 to {MAX_DAEMONS}) or a non-empty list of daemons, "
                      f"got {type(raw).__name__} {repr(raw)[:40]}")
        return ()
    if len(raw) > MAX_DAEMONS:
        c.error(path, f"{len(raw)} daemons, at most {MAX_DAEMONS}")
        return ()
    specs = [_daemon(c, item, f"{path}[{i}]", i) for i, item in enumerate(raw)]
    c.unique(specs, "name", path, "daemon name")
    return tuple(s for s in specs if s is not None)


def _daemon(c, raw: Any, path: str, index: int) -> DaemonSpec | None:
    """One daemon of the long form; None when it cannot be built (reported)."""
    d = c.mapping(raw, path, _DAEMON_KEYS)
    if d is None:
        return None
    name = c.get(d, "name", path, str, f"daemon-{index}")
    if c.failed(f"{path}.name"):
        name = None  # not its default name either: it could clash with another daemon's, a second report
    elif not DAEMON_NAME.fullmatch(name):
        c.error(f"{path}.name", f"must be 1-64 letters, digits, '_', '-', got {name!r}")
        name = None  # so it is not also reported as a duplicate
    resources = _resources(c, d.get("resources"), f"{path}.resources")
    node_label = c.get(d, "node_label", path, str, "")
    if node_label and not GROUP.fullmatch(node_label):
        c.error(f"{path}.node_label", f"must be {_GROUP_RULE}, got {node_label!r}")
    threads = c.get(d, "threads", path, int, 0, minimum=0)
    num_cpus = _quantity(c, d, "num_cpus", path, 0.0)
    if resources is not None and not resources and num_cpus == 0 and not c.failed(f"{path}.num_cpus"):
        c.error(f"{path}.resources", f"this daemon reserves nothing, so Ray may start it on any node beside any "
                                     f"other: give resources (e.g. {{{DAEMON_RESOURCE}: 1}}) or num_cpus")
    if name is None or resources is None:
        return None
    return DaemonSpec(name=name, resources=resources, node_label=node_label, threads=threads, num_cpus=num_cpus)


def _resources(c, raw: Any, path: str) -> tuple[tuple[str, float], ...] | None:
    """A daemon's Ray resources, in file order (the default when not given); None when broken (reported)."""
    if raw is None:
        return DaemonSpec.resources
    if not isinstance(raw, dict):
        c.error(path, f"expected a mapping of Ray resource name -> amount, e.g. {{{DAEMON_RESOURCE}: 1}}, "
                      f"got {type(raw).__name__}")
        return None
    out = []
    for name, amount in raw.items():
        p = f"{path}.{name}"
        if not isinstance(name, str) or not RESOURCE_NAME.fullmatch(name):
            c.error(p, "a Ray resource name is 1-128 letters, digits, '_', '.', ':', '-'")
        elif name == "CPU":  # Ray refuses CPU and GPU among custom resources
            c.error(p, "Ray counts CPUs apart from custom resources: give the daemon's num_cpus instead")
        elif name == "GPU":
            c.error(p, "Ray counts GPUs apart from custom resources (num_gpus, which a daemon here does not "
                       "reserve): place GPU daemons with a custom resource of their nodes or a node_label")
        elif amount is None:
            c.error(p, f"expected an amount > 0, e.g. {{{DAEMON_RESOURCE}: 1}}")
        elif (amount := _quantity(c, raw, name, path, None)) is not None:
            if amount > 0:
                out.append((name, amount))
            else:
                c.error(p, f"must be > 0, got {amount}")
    return None if c.failed(path) else tuple(out)


def _quantity(c, d: dict, key: str, path: str, default: float | None) -> float | None:
    """A Ray resource amount >= 0 (default None: required); a bad one is reported and reads as the default."""
    v = c.get(d, key, path, float, ... if default is None else default, minimum=0)
    if v is not None and 0 < v < MIN_QUANTITY:  # Ray keeps amounts in units of MIN_QUANTITY
        c.error(f"{path}.{key}", f"Ray counts resources in steps of {MIN_QUANTITY}: use 0 or at least that, got {v}")
        return default
    return v
