"""A daemon with its outputs attached: the configured sinks (and the results PUB socket) get every row, and the HTTP
server (dashboard, /metrics, /healthz, /readyz) is up from warm-up to the end. What `vlora-va daemon`, the daemon
process of `vlora-va run`, the tests and the benchmarks run; the serving layer itself knows no sink or page."""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack

from vlora_va.contracts.config import PipelineConfig
from vlora_va.engine.backbones import ModelError
from vlora_va.outputs.dashboard.server import start_http
from vlora_va.outputs.sinks import ZmqPubSink, close_all, make_sink
from vlora_va.serving.daemon import Daemon
from vlora_va.serving.prometheus import Totals

log = logging.getLogger(__name__)


def configured_sinks(config: PipelineConfig):
    """A function that enters every configured sink on a stack and returns them. A sink never blocks: its failures
    are logged and counted in its stats(). On exit all sinks start their final flush together."""
    def open_sinks(stack: ExitStack) -> list:
        sinks = [stack.enter_context(make_sink(c)) for c in config.sinks]
        if config.daemon.results_endpoint:
            sinks.append(stack.enter_context(ZmqPubSink(config.daemon.results_endpoint, curve=config.security.curve)))
        stack.callback(close_all, sinks)  # runs before the sinks' own exits (last in, first out)
        return sinks
    return open_sinks


def run_with_outputs(daemon: Daemon, stop: threading.Event | None = None, ready: threading.Event | None = None,
                     drained: threading.Event | None = None) -> Totals:
    """Daemon.run with the configured sinks and the HTTP server (daemon.http_port) attached."""
    http = start_http(daemon)  # /healthz, /readyz, /metrics, dashboard: up during warm-up
    try:
        return daemon.run(stop, ready, drained, open_sinks=configured_sinks(daemon.config))
    finally:
        if http is not None:
            http.close()


def serve(config: PipelineConfig, stop: threading.Event | None = None, ready: threading.Event | None = None,
          drained: threading.Event | None = None) -> int:
    """A daemon for `config`, run with its outputs attached until stop (`vlora-va daemon`, and the daemon process of
    `vlora-va run`). Returns 0, or 1 when it cannot start (the backbone or the device it asks for is not here: said
    in one line)."""
    try:
        daemon = Daemon(config)
    except (ModelError, RuntimeError, ValueError) as e:
        log.error("the daemon cannot start: %s", e)
        return 1
    run_with_outputs(daemon, stop, ready, drained)
    return 0
