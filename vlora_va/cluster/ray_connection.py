"""Connecting cluster mode to Ray: a local instance with the cluster's daemon resources, or an existing cluster
(token authentication required unless allowed off). Ray is imported inside connect(): importing this module needs
no Ray."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
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
    # A machine runs one Ray node, and Ray connects a driver to it. Where one process table holds several (test hosts
    # in network namespaces, scripts/hosts.sh), Ray would pick the head's: VLORA_VA_NODE_IP names this one's.
    own = os.environ.get("VLORA_VA_NODE_IP") if not address.startswith("ray://") else None  # (a client has no node)
    ray.init(address=address, log_to_driver=True, **({"_node_ip_address": own} if own else {}))
    from ray._raylet import AuthenticationMode, get_authentication_mode

    if get_authentication_mode() != AuthenticationMode.TOKEN and not config.cluster.allow_unauthenticated:
        ray.shutdown()
        raise ClusterError(f"the Ray cluster at {address} does not use token authentication: anyone who reaches its "
                           f"ports can run code on it. Start it with RAY_AUTH_MODE=token (docs/cluster.md), or set "
                           f"cluster.allow_unauthenticated: true")
    return True


class HeadWatch:
    """Whether Ray's head (its control store, GCS) still answers. Without it nothing can start or restart, and
    Ray's processes on every other node exit after RAY_gcs_rpc_server_reconnect_timeout_s (60 s by default); the
    actors that run meanwhile still answer direct calls, so a controller that is not on the head can drain the run
    in that time (docs/cluster.md#the-head-lost). One probe at a time, in a thread: a probe to a dead head may
    hang, and the controller's loop must not."""

    def __init__(self, timeout_s: float = 2.0, misses: int = 3):
        self.timeout_s, self.misses = timeout_s, misses
        self._missed = 0
        self._probe: threading.Thread | None = None
        self._since = 0.0  # when the probe in flight was started, or last counted as missed
        self._answered = threading.Event()

    def lost(self) -> bool:
        """One round (never blocks): True once the head missed `misses` probes in a row. A probe misses when it
        fails, or for every `timeout_s` it goes unanswered."""
        now = time.monotonic()
        if self._probe is not None:
            if self._answered.is_set():
                self._missed, self._probe = 0, None
            elif not self._probe.is_alive():  # it failed
                self._missed, self._probe = self._missed + 1, None
            elif now - self._since >= self.timeout_s:  # it hangs: a miss per timeout, and no second probe
                self._missed, self._since = self._missed + 1, now
        if self._probe is None:
            self._answered.clear()
            self._probe = threading.Thread(target=self._ask, name="ray-head-probe", daemon=True)
            self._since = now
            self._probe.start()
        return self._missed >= self.misses

    def _ask(self) -> None:
        import ray

        try:
            ray.nodes()
        except Exception:  # noqa: BLE001 - no answer is the answer
            return
        self._answered.set()
