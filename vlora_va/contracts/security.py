"""Authenticated ZeroMQ links (CURVE) and where sockets bind.

    vlora-va keys DIR  ─►  DIR/server.key  DIR/server.key_secret  DIR/client.key  DIR/client.key_secret
                           (ZeroMQ's own certificate format, as zmq.auth writes it; *.key_secret mode 0600)
    pipelines.yaml     security.curve: {server_secret, server_public, client_secret, client_public}

The daemon's three sockets (data PULL, control REP, results PUB) are CURVE servers: every message is encrypted
and only clients whose public key is listed in `client_public` (one .key file, or a directory of them) get
through; a ZAP handler on the socket's context checks each connecting key. Ingest workers, `vlora-va adapters`
and results subscribers are CURVE clients: they hold their own key pair (`client_secret`) and the daemon's
public key (`server_public`). A daemon host needs server_secret + client_public, a client host client_secret +
server_public; a single-machine `vlora-va run` uses all four.

Binding: everything binds loopback unless configured otherwise; `bind_warning` says clearly when a socket is
reachable from the network without authentication. This module is torch-free (ingest imports it).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KEY_NAMES = ("server", "client")
ZAP_DOMAIN = "vlora-va"
REFUSED_LOG_EVERY_S = 30.0  # a client that keeps knocking with a wrong key is logged at most this often


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class CurveConfig:
    """Paths of the CURVE keys (security.curve in pipelines.yaml); "" = not on this host."""

    server_secret: str = ""  # the daemon's key pair (on the daemon host)
    server_public: str = ""  # the daemon's public key (on every client host)
    client_secret: str = ""  # this client's key pair (ingest hosts, `vlora-va adapters`, `vlora-va run`)
    client_public: str = ""  # the clients the daemon accepts: one .key file, or a directory of .key files

    @property
    def server_side(self) -> bool:
        return bool(self.server_secret and self.client_public)

    @property
    def client_side(self) -> bool:
        return bool(self.client_secret and self.server_public)


@dataclass(frozen=True)
class SecurityConfig:
    """security: in pipelines.yaml (`parse_security`). curve: ZeroMQ CURVE on the data, control and results
    sockets; None = plain sockets (fine on loopback and ipc)."""

    curve: CurveConfig | None = None


def create_keys(directory: str | os.PathLike) -> dict[str, Path]:
    """Write a server and a client key pair into `directory` (made if missing); refuses to overwrite.
    Returns {"server.key": path, "server.key_secret": path, ...}."""
    import zmq.auth

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    existing = [d / f"{n}{ext}" for n in KEY_NAMES for ext in (".key", ".key_secret") if (d / f"{n}{ext}").exists()]
    if existing:
        raise FileExistsError(f"{existing[0]} exists: remove the old keys first (or choose another directory)")
    for name in KEY_NAMES:
        old_umask = os.umask(0o077)  # the secret half is never readable by others, not even for a moment
        try:
            public, secret = zmq.auth.create_certificates(str(d), name)
        finally:
            os.umask(old_umask)
        os.chmod(secret, 0o600)
        os.chmod(public, 0o644)
        out[f"{name}.key"], out[f"{name}.key_secret"] = Path(public), Path(secret)
    return out


def read_public(path: str | os.PathLike) -> bytes:
    """The Z85 public key of a certificate file (public or secret)."""
    public, _ = _load(path)
    return public


def read_secret(path: str | os.PathLike) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys of a secret certificate file, which only its owner may read."""
    p = Path(path)
    public, secret = _load(p)
    if not secret:
        raise KeyFileError(f"{p} holds no secret key (the *.key_secret file of `vlora-va keys` does)")
    mode = stat.S_IMODE(p.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise KeyFileError(f"{p} is readable by other users (mode {mode:04o}): chmod 600 it")
    return public, secret


def read_authorized(path: str | os.PathLike) -> set[bytes]:
    """Client public keys from one certificate file or every *.key file of a directory."""
    p = Path(path)
    files = sorted(p.glob("*.key")) if p.is_dir() else [p]
    if not files:
        raise KeyFileError(f"{p} holds no *.key file")
    return {read_public(f) for f in files}


def _load(path: str | os.PathLike) -> tuple[bytes, bytes | None]:
    import zmq.auth

    p = Path(path)
    if not p.is_file():
        raise KeyFileError(f"{p}: no such key file (make keys with `vlora-va keys DIR`)")
    try:
        public, secret = zmq.auth.load_certificate(str(p))
    except (ValueError, OSError, KeyError) as e:
        raise KeyFileError(f"{p} is not a ZeroMQ certificate: {e}") from None
    if not public or len(public) != 40 or (secret is not None and len(secret) != 40):
        raise KeyFileError(f"{p} is not a ZeroMQ certificate (a key must be 40 Z85 characters)")
    return public, secret


_CURVE_READERS = {"server_secret": read_secret, "server_public": read_public, "client_secret": read_secret,
                  "client_public": read_authorized}


def parse_security(c: Any, raw: Any, base_dir: Path) -> SecurityConfig:
    """security: in pipelines.yaml (c: config_checker.Checker); relative key files are read from base_dir."""
    d = c.mapping(raw, "security", {"curve"})
    if d is None or d.get("curve") is None:
        return SecurityConfig()
    cv = c.mapping(d["curve"], "security.curve", set(_CURVE_READERS))
    if cv is None:
        return SecurityConfig()
    kw = {}
    for key, read in _CURVE_READERS.items():
        value = c.get(cv, key, "security.curve", str, "")
        if value:
            p = Path(value)
            value = str(p if p.is_absolute() else base_dir / p)
            try:
                read(value)
            except KeyFileError as e:
                c.error(f"security.curve.{key}", str(e))
        kw[key] = value
    # a key written but wrong (reported above) still counts as given: its partner is not missing
    given = {key: bool(kw[key]) or c.failed(f"security.curve.{key}") for key in _CURVE_READERS}
    for a, b, host in (("server_secret", "client_public", "the daemon's host"),
                       ("client_secret", "server_public", "a client's host")):
        if given[a] != given[b]:
            missing = b if given[a] else a
            c.error(f"security.curve.{missing}", f"required beside {a if given[a] else b} ({host} needs both)")
    if not any(given.values()) and not c.failed("security.curve"):  # e.g. a misspelt key, reported as unknown
        c.error("security.curve", "needs server_secret + client_public (the daemon's host) and/or client_secret + "
                                  "server_public (a client's host); `vlora-va keys DIR` makes all four")
    return SecurityConfig(curve=CurveConfig(**kw))


class _Authorized:
    """ZAP credentials provider: the configured client keys; a refusal is logged (rate-limited)."""

    def __init__(self, keys: set[bytes], what: str):
        self.keys, self.what = keys, what
        self.refused = 0
        self._last_log = 0.0

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log >= REFUSED_LOG_EVERY_S:
            self._last_log = now
            log.warning("%s: refused a client whose CURVE key %s is not in security.curve.client_public "
                        "(%d refused so far)", self.what, key.decode(errors="replace")[:12] + "...", self.refused)
        return False


class CurveServer:
    """The daemon side: keys loaded once, applied to each server socket before it binds."""

    def __init__(self, cfg: CurveConfig):
        missing = [k for k in ("server_secret", "client_public") if not getattr(cfg, k)]
        if missing:
            raise KeyFileError(f"security.curve.{missing[0]}: the daemon needs server_secret and client_public "
                               f"(its key pair and the clients it accepts)")
        self.public, self.secret = read_secret(cfg.server_secret)
        self.authorized = read_authorized(cfg.client_public)

    def secure(self, ctx, sock, what: str):
        """Make `sock` (not yet bound) a CURVE server and start the key check on its context. Returns the
        authenticator: stop() it when the socket is closed."""
        import zmq
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(ctx, log=logging.getLogger(f"{__name__}.zap"))
        auth.start()
        auth.configure_curve_callback(ZAP_DOMAIN, _Authorized(self.authorized, what))
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        log.info("%s: CURVE on (encrypted; %d authorised client key(s))", what, len(self.authorized))
        return auth


class CurveClient:
    """A client side: its key pair and the daemon's public key."""

    def __init__(self, cfg: CurveConfig):
        missing = [k for k in ("client_secret", "server_public") if not getattr(cfg, k)]
        if missing:
            raise KeyFileError(f"security.curve.{missing[0]}: a client needs client_secret and server_public "
                               f"(its key pair and the daemon's public key)")
        self.public, self.secret = read_secret(cfg.client_secret)
        self.server = read_public(cfg.server_public)

    def secure(self, sock) -> None:
        """Make `sock` (not yet connected) a CURVE client of the daemon."""
        import zmq

        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)


def curve_server(cfg: CurveConfig | None) -> CurveServer | None:
    return CurveServer(cfg) if cfg is not None else None


def curve_client(cfg: CurveConfig | None) -> CurveClient | None:
    return CurveClient(cfg) if cfg is not None else None


def bind_server(ctx, sock, endpoint: str, curve: CurveConfig | None, what: str):
    """Bind one of the daemon's server sockets (`what`, e.g. 'daemon.endpoint'): CURVE with the daemon's keys
    where security.curve is set, a warning for a network bind without them. `ctx` must be the socket's own
    context (the key check is per context). Returns the authenticator (None without CURVE) for close_server;
    a bind that fails closes the socket, the authenticator and the context, and raises zmq.ZMQError."""
    import zmq

    server = curve_server(curve)
    auth = server.secure(ctx, sock, what) if server else None
    warn_bind(endpoint, server is not None, what)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError:
        close_server(ctx, sock, auth)
        raise
    return auth


def close_server(ctx, sock, auth) -> None:
    """Undo bind_server: the socket, then the key check, then the context."""
    sock.close()
    if auth is not None:
        auth.stop()
    ctx.term()


# ---------------------------------------------------------------- where sockets bind


def is_local_host(host: str) -> bool:
    """True for a loopback address or 'localhost'; False for a wildcard, an interface or another address."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local_endpoint(endpoint: str) -> bool:
    """ipc:// and inproc:// stay on this machine; tcp:// only on a loopback address."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0]
    host = host.rsplit(";", 1)[-1]  # tcp://source;host:port
    return is_local_host(host)


def bind_warning(endpoint: str, authenticated: bool, what: str) -> str | None:
    """The warning to log (or None) for binding `what` (e.g. 'daemon.endpoint') on `endpoint`."""
    if authenticated or is_local_endpoint(endpoint):
        return None
    return (f"{what} binds {endpoint}, which is reachable from the network, WITHOUT authentication: anyone who "
            f"can reach it can use it; set security.curve (keys: `vlora-va keys DIR`) or bind a loopback address")


def warn_bind(endpoint: str, authenticated: bool, what: str) -> None:
    message = bind_warning(endpoint, authenticated, what)
    if message:
        log.warning("%s", message)
