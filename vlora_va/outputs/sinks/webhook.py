"""The HTTP webhook sink (`type: webhook`): rows POSTed in batches as JSON arrays, retried with backoff under an
Idempotency-Key, optionally signed (HMAC-SHA256 of the body); its keys in pipelines.yaml (`WebhookOptions`), and the
URL helpers that keep credentials out of its name."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from vlora_va.contracts.results import ResultRecord
from vlora_va.contracts.sinks import SinkConfig, SinkEntry, SinkOptions
from vlora_va.outputs.sinks.queued import CLOSE_TIMEOUT_S, QueuedSink, Rejected

log = logging.getLogger(__name__)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a POST is never silently turned into a GET elsewhere
        return None


RETRYABLE_HTTP = {408, 425, 429}  # 4xx statuses that mean "try again later"; other 4xx/3xx are final
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)


@dataclass(frozen=True)
class WebhookOptions(SinkOptions):
    """A webhook sink's keys in pipelines.yaml."""

    url: str  # http:// or https://, with a host
    batch_max: int = 100  # rows per POST, at most the entry's queue_max
    flush_interval_s: float = 1.0  # how long a partial batch waits for more rows
    timeout_s: float = 5.0  # per POST
    retry_max_s: float = 30.0  # backoff cap
    headers: tuple[tuple[str, str], ...] = ()  # extra HTTP headers
    # sign every POST: X-Vlora-Signature: sha256=<HMAC-SHA256 of the body, hex>; "" = unsigned (never printed)
    hmac_secret: str = field(default="", repr=False)

    @classmethod
    def read(cls, entry: SinkEntry) -> WebhookOptions | None:
        url = entry.get("url", str)
        if url is not None and not _http_url(url):
            entry.error("url", f"expected an http:// or https:// URL with a host, got {url!r}")
        rest = dict(batch_max=entry.get("batch_max", int, cls.batch_max, minimum=1),
                    flush_interval_s=entry.get("flush_interval_s", float, cls.flush_interval_s, minimum=0,
                                               maximum=3600),
                    timeout_s=entry.get("timeout_s", float, cls.timeout_s, minimum=0.05, maximum=3600),
                    retry_max_s=entry.get("retry_max_s", float, cls.retry_max_s, minimum=0.05, maximum=86400),
                    headers=_headers(entry, entry.written.get("headers")),
                    hmac_secret=entry.get("hmac_secret", str, cls.hmac_secret))
        # a batch bigger than the queue could never fill; compared only where both numbers are right
        if entry.queue_max is not None and not entry.failed("batch_max") and rest["batch_max"] > entry.queue_max:
            entry.error("batch_max", f"must be at most queue_max ({entry.queue_max}), got {rest['batch_max']}")
        return cls(url=url, **rest) if url is not None else None

    def destination(self) -> tuple[str, str, str]:
        return "url", self.url, "the same URL as"


def _http_url(url: str) -> bool:
    try:
        u = urlsplit(url)
        return u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 1) > 0
    except ValueError:
        return False


def _headers(entry: SinkEntry, raw: Any) -> tuple[tuple[str, str], ...]:
    """headers: name -> value; a bad one is reported (never sent) and the rest kept."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        entry.error("headers", f"expected a mapping of header name -> value, got {type(raw).__name__}")
        return ()
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            entry.error(f"headers.{name}", "not a valid HTTP header name")
        elif not isinstance(value, str):
            entry.error(f"headers.{name}", f"expected str, got {type(value).__name__} {repr(value)[:40]}")
        elif "\r" in value or "\n" in value:
            entry.error(f"headers.{name}", "a header value cannot contain line breaks")
        else:
            out.append((name, value))
    return tuple(out)


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
        o: WebhookOptions = cfg.options
        return cls(o.url, batch_max=o.batch_max, flush_interval_s=o.flush_interval_s, queue_max=cfg.queue_max,
                   timeout_s=o.timeout_s, retry_max_s=o.retry_max_s, headers=dict(o.headers),
                   close_timeout_s=cfg.close_timeout_s, hmac_secret=o.hmac_secret)

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
