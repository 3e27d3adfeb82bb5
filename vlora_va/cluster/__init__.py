"""Cluster mode on Ray (`vlora-va run --cluster`, docs/cluster.md): the daemons and ingest workers of one pipeline
as Ray actors on several machines, frames still over ZeroMQ, every row to the sinks once.

    placement.py   which daemon serves each stream: adapter affinity, then measured load (standard library only)
    hosts.py       the actors' bodies: DaemonHost, IngestHost, CollectorHost
    collector.py   every daemon's rows to the configured sinks once; "daemon lost" rows; counts carried across moves
    controller.py  the Ray driver: start, place, watch, move, fail over, drain

Ray is imported only inside functions of hosts.py and controller.py: importing this package needs no Ray.
"""
