"""Connecting cluster mode to Ray: a local instance with the cluster's daemon resources, or an existing cluster
(token authentication required unless allowed off). Ray is imported inside connect(): importing this module needs
no Ray."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from vlora_va.contracts.config import PipelineConfig

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """Cluster mode cannot start (said in one line)."""


def connect(address: str, config: PipelineConfig) -> bool:
    """Ray for `address`: "local" starts a local instance with the cluster's daemon resources; "auto" or
    "ray://host:port" joins an existing cluster (refused without token authentication unless
    cluster.allow_unauthenticated). Returns True when this call started Ray (and must shut it down)."""
    if address == "local" and "ray" not in sys.modules:
        # Ray's own ports (GCS, raylet) listen on every interface even for a one-machine instance: token
        # authentication keeps strangers out. Ray reads the mode when it is imported, so before that; the token it
        # makes (~/.ray/auth_token) is then made private.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    if ray.is_initialized():
        return False  # a caller (a test, a notebook) already connected
    if address == "local":
        need: dict[str, float] = {}
        for spec in config.cluster.daemons:
            for name, amount in spec.resources:
                need[name] = need.get(name, 0.0) + amount
        # one machine: everything on loopback (nothing of Ray's or ours listens on the network)
        ray.init(num_cpus=os.cpu_count() or 1, resources=need, include_dashboard=False, log_to_driver=True,
                 _node_ip_address="127.0.0.1")
        token = Path.home() / ".ray" / "auth_token"
        if token.is_file() and token.stat().st_uid == os.getuid():
            token.chmod(0o600)
        if any(s.node_label for s in config.cluster.daemons) or any(s.group for s in config.streams):
            log.info("cluster: local: one node, so node_label and group are not used")
        return True
    ray.init(address=address, log_to_driver=True)
    from ray._raylet import AuthenticationMode, get_authentication_mode

    if get_authentication_mode() != AuthenticationMode.TOKEN and not config.cluster.allow_unauthenticated:
        ray.shutdown()
        raise ClusterError(f"the Ray cluster at {address} does not use token authentication: anyone who reaches its "
                           f"ports can run code on it. Start it with RAY_AUTH_MODE=token (docs/cluster.md), or set "
                           f"cluster.allow_unauthenticated: true")
    return True
