"""The daemon's HTTP side: a live dashboard, Prometheus `/metrics`, `/healthz` and `/readyz` on one server.

    daemon thread ──taps──► Hub (bounded per-stream history, latest frame per stream; one lock, quick)
    server thread (own asyncio loop, aiohttp) ◄── Hub snapshots / updates, Daemon.snapshot(), the metrics registry
        GET /            the page (static/, plain HTML + CSS + JS, no build step, no CDN)
        GET /events      server-sent events: one snapshot on connect, then one update a second for all streams
        GET /metrics     Prometheus text format
        GET /healthz     200 while the process serves
        GET /readyz      200 once warmed up, every adapter loaded and every sink writable; 503 (and why) before

The server is on when `daemon.http_port` (or its older name `daemon.metrics_port`) is set, on
`daemon.http_host` (loopback by default). This module imports nothing heavy: the server needs aiohttp, the
`dashboard` extra (`pip install "vlora-va[dashboard]"`, part of `all`).
"""

from __future__ import annotations


def url_for(host: str, port: int) -> str:
    """The URL a local browser opens for a server bound on host:port (a wildcard bind is reached on loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"
