"""The HTTP webhook sink (`type: webhook`): rows POSTed in batches as JSON arrays, retried with backoff under an
Idempotency-Key, optionally signed (HMAC-SHA256 of the body), and the URL helpers that keep credentials out of its
name."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlsplit

from vlora_va.contracts.config import SinkConfig
from vlora_va.contracts.results import ResultRecord
from vlora_va.outputs.sinks.queued import CLOSE_TIMEOUT_S, QueuedSink, Rejected

log = logging.getLogger(__name__)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a POST is never silently turned into a GET elsewhere
        return None


RETRYABLE_HTTP = {408, 425, 429}  # 4xx statuses that mean "try again later"; other 4xx/3xx are final


class WebhookSink(QueuedSink):
    """POSTs rows in batches: body = a JSON array of rows (`Content-Type: application/json`), at most
    batch_max rows, sent when batch_max rows are queued or the oldest has waited flush_interval_s. A failed
    POST (connection refused, timeout, 5xx, 408/425/429) is retried with exponential backoff up to
    retry_max_s, the batch kept whole and in order; a retried batch carries the same `Idempotency-Key`
    header, so a receiver can discard one it already has. Other 3xx/4xx answers drop the batch (counted).
    With hmac_secret, every POST carries `X-Vlora-Signature: sha256=<hex>`, the HMAC-SHA256 of the exact body
    bytes under that secret: a receiver recomputes it (in constant time) and refuses what it did not send."""

    def __init__(self, url: str, *, batch_max: int = 100, flush_interval_s: float = 1.0, queue_max: int = 10_000,
                 timeout_s: float = 5.0, retry_max_s: float = 30.0, headers: dict | None = None,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, retry_initial_s: float = 0.5, name: str | None = None,
                 hmac_secret: str = ""):
        super().__init__(name or f"webhook:{_public_url(url)}", queue_max=queue_max, batch_max=batch_max,
                         flush_interval_s=flush_interval_s, retry_initial_s=min(retry_initial_s, retry_max_s),
                         retry_max_s=retry_max_s, close_timeout_s=close_timeout_s)
        self.url, self.timeout_s = url, timeout_s
        self.headers = {"Content-Type": "application/json", "User-Agent": "vlora-va", **(headers or {})}
        self._secret = hmac_secret.encode()
        self._run_id = uuid.uuid4().hex[:12]
        self._opener = urllib.request.build_opener(_NoRedirect())

    @classmethod
    def from_config(cls, cfg: SinkConfig) -> "WebhookSink":
        return cls(cfg.url, batch_max=cfg.batch_max, flush_interval_s=cfg.flush_interval_s, queue_max=cfg.queue_max,
                   timeout_s=cfg.timeout_s, retry_max_s=cfg.retry_max_s, headers=dict(cfg.headers),
                   close_timeout_s=cfg.close_timeout_s, hmac_secret=cfg.hmac_secret)

    def _start(self) -> None:
        log.info("sink %s: posting results in batches of up to %d rows", self.name, self.batch_max)

    def _deliver(self, rows: list[ResultRecord]) -> None:
        body = json.dumps([r.to_json() for r in rows], separators=(",", ":")).encode()
        headers = {**self.headers, "Idempotency-Key": f"{self._run_id}-{self._batch_seq}"}
        if self._secret:
            headers["X-Vlora-Signature"] = "sha256=" + hmac.new(self._secret, body, hashlib.sha256).hexdigest()
        req = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
        left = self._remaining_close_s()
        timeout = self.timeout_s if left is None else max(0.05, min(self.timeout_s, left))
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                resp.read(65536)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code < 500 and e.code not in RETRYABLE_HTTP:
                raise Rejected(f"HTTP {e.code} {e.reason}: {len(rows)} rows dropped") from None
            raise


def _public_url(url: str) -> str:
    """The URL without credentials or query (which may hold tokens): safe for logs and metric labels."""
    u = urlsplit(url)
    host = u.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{u.port}" if u.port else ""
    except ValueError:
        port = ""
    return f"{u.scheme}://{host}{port}{u.path}"
