"""`vlora-va validate`: a pipeline file checked beyond its schema (files that are not there, sockets open to the
network, clips of another length than an adapter learnt, lines and zones outside their video's frames) and, with
--profile, whether its load fits this machine. `vlora-va run` logs the same input warnings before it starts."""

from __future__ import annotations

import sys


def input_warnings(cfg) -> list[str]:
    """What in the pipeline will not work as asked, though it runs: files that are not there (a running pipeline
    logs these and keeps going), and action tasks that send clips of another length than their adapter learnt."""
    import json
    from pathlib import Path

    from vlora_va.contracts.security import bind_warning, is_local_host

    problems = [f"streams[{i}].source: no such file {s.source}" for i, s in enumerate(cfg.streams)
                if s.scheme == "file" and not Path(s.source).is_file()]
    d, curve = cfg.daemon, cfg.security.curve is not None
    binds = [(d.endpoint, "daemon.endpoint"), (d.control_endpoint, "daemon.control_endpoint"),  # derived: loopback
             (d.results_endpoint, "daemon.results_endpoint")]
    problems += [w for e, what in binds if e and (w := bind_warning(e, curve, what))]
    if d.http_port and not is_local_host(d.http_host):
        problems.append(f"daemon.http_host is {d.http_host}, not loopback: the dashboard, /metrics and the health "
                        f"checks are open to the network, with no authentication")
    problems += [f"adapters.{name}: no adapter_config.json in {path}" for name, path in cfg.adapters.items()
                 if not (Path(path) / "adapter_config.json").is_file()]
    clip_lens = {}
    for name, path in cfg.adapters.items():
        try:
            head = json.loads((Path(path) / "head_config.json").read_text())
        except (OSError, ValueError):
            continue  # a broken adapter is the daemon's to report, with the reason
        if isinstance(head, dict) and head.get("task") == "action" and isinstance(head.get("clip_len"), int):
            clip_lens[name] = head["clip_len"]
    for i, s in enumerate(cfg.streams):
        for j, t in enumerate(s.tasks):
            want = clip_lens.get(t.adapter)
            if want is not None and t.frames_per_chunk != want:
                problems.append(f"streams[{i}].tasks[{j}].frames_per_chunk: {t.frames_per_chunk}, but adapter "
                                f"{t.adapter!r} learnt {want}-frame clips (its accuracy was measured on those)")
    return problems


def scene_problems(cfg) -> list[str]:
    """Lines and zones with points outside their file's frames (a live stream's are checked by ingest at its first
    frame). A file that cannot be opened is not reported here: ingest says why when it starts."""
    from vlora_va.contracts.scene import scene_outside_frame

    out = []
    for i, s in enumerate(cfg.streams):
        if s.scheme != "file" or not (s.lines or s.zones):
            continue
        try:
            import av

            with av.open(s.source) as container:
                video = container.streams.video[0]
                width, height = video.codec_context.width, video.codec_context.height
        except (ImportError, OSError, IndexError, av.FFmpegError):
            continue
        out += [f"streams[{i}] ({s.id}): {p}" for p in scene_outside_frame(s.lines, s.zones, width, height)]
    return out


def cmd_validate(args) -> int:
    from vlora_va.contracts.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        for problem in e.errors:  # every problem of the file, one line each
            print(f"invalid: {problem}", file=sys.stderr)
        return 2
    for problem in input_warnings(cfg):
        print(f"warning: {problem}", file=sys.stderr)
    scene = scene_problems(cfg)
    for problem in scene:
        print(f"invalid: {problem}", file=sys.stderr)
    if scene:
        return 2
    tasks = sum(len(s.tasks) for s in cfg.streams)
    print(f"{args.config}: OK ({len(cfg.streams)} streams, {tasks} tasks, {len(cfg.adapters)} adapters, "
          f"{len(cfg.sinks)} sinks)")
    if args.profile or args.remeasure:
        return _print_capacity(cfg, args.remeasure)
    return 0


def _print_capacity(cfg, remeasure: bool = False) -> int:
    """Build the daemon's engine, measure (or load the cached) cost profile, and say what the configured load
    needs on this machine."""
    from vlora_va.engine.backbones import ModelError
    from vlora_va.serving.capacity import estimate
    from vlora_va.serving.startup import build_engine, cost_model

    try:
        engine, failed = build_engine(cfg)
    except (ModelError, RuntimeError, ValueError) as e:
        print(f"cannot build the engine: {e}", file=sys.stderr)
        return 1
    for name, why in failed.items():
        print(f"warning: adapter {name} cannot be served: {why}", file=sys.stderr)
    costs = cost_model(cfg, engine, remeasure)
    print(f"capacity: {estimate(cfg, engine.catalog(), costs).message}")
    if cfg.cluster.enabled:
        _print_cluster_capacity(cfg, engine.catalog(), costs)
    return 0


def _print_cluster_capacity(cfg, catalog, costs) -> None:
    """The cluster: section's daemons, each taken to run on a machine like this one: the streams placement would
    give each (vlora_va/cluster/placement.py: affinity, then load) and what they need there, and the cluster's total."""
    import dataclasses

    from vlora_va.cluster.placement import DaemonLoad, StreamLoad, daemon_loads, place
    from vlora_va.serving.admission import TARGET_UTILISATION
    from vlora_va.serving.capacity import estimate

    streams = [StreamLoad(s.id, frozenset(t.adapter for t in s.tasks),
                          estimate(dataclasses.replace(cfg, streams=(s,)), catalog, costs).need_s,
                          max((t.priority for t in s.tasks), default=s.priority)) for s in cfg.streams]
    daemons = [DaemonLoad(d.name, TARGET_UTILISATION, cfg.daemon.max_slots) for d in cfg.cluster.daemons]
    assignment = place(streams, daemons)
    loads = daemon_loads(assignment, streams)
    for d in daemons:
        mine = sorted(sid for sid, name in assignment.items() if name == d.name)
        need = loads.get(d.name, 0.0)
        print(f"cluster: daemon {d.name}: {len(mine)} stream(s) {', '.join(mine) or '-'}: needs {need:.2f} s of "
              f"compute per second on a machine like this one: {'fits' if need <= TARGET_UTILISATION else 'over'}")
    total, room = sum(loads.values()), TARGET_UTILISATION * len(daemons)
    print(f"cluster: {len(daemons)} daemon(s) need {total:.2f} s of compute per second in all, of {room:.2f} "
          f"({'fits' if max(loads.values(), default=0.0) <= TARGET_UTILISATION else 'a daemon is over'}; daemons "
          f"sharing one machine share its cores: count one machine's capacity once)")
