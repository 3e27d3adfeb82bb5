"""Cluster mode on Ray (`vlora-va run --cluster`, docs/cluster.md): the daemons and ingest workers of one pipeline
as Ray actors on several machines, frames still over ZeroMQ, every row to the sinks once.

    placement.py   which daemon serves each stream: adapter affinity, then measured load (standard library only)
    loads.py       what placement works on: StreamLoad, DaemonLoad, Move; reading and applying an assignment
    packing.py     the packing state placement builds on: loads, adapters and streams per daemon; the greedy
    overload.py    OverloadWatch: which daemons stay overloaded, which streams leave them
    hosts.py       the actors' bodies: DaemonHost, IngestHost, CollectorHost
    collector.py   every daemon's rows to the configured sinks once; "daemon lost" rows; counts carried across moves
    controller.py  the Ray driver: start, place, watch, move, fail over, drain
    ray_connection.py  connect: a local Ray instance or an existing cluster (token authentication)

Ray is imported only inside functions of hosts.py, controller.py and ray_connection.py: importing this package
needs no Ray.
"""
