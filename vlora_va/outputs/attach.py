"""A daemon with its outputs attached: the configured sinks (and the results PUB socket) get every row, and the HTTP
server (dashboard, /metrics, /healthz, /readyz) is up from warm-up to the end. What `vlora-va daemon`, the daemon
process of `vlora-va run`, the tests and the benchmarks run; the serving layer itself knows no sink or page."""

from __future__ import annotations

import threading
from contextlib import ExitStack

from vlora_va.contracts.config import PipelineConfig
from vlora_va.outputs.dashboard.server import start_http
from vlora_va.outputs.sinks import ZmqPubSink, close_all, make_sink
from vlora_va.serving.daemon import Daemon
from vlora_va.serving.prometheus import Totals


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
