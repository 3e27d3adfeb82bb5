"""Contracts: what every part agrees on, torch-free (the bottom layer above common/). Ingest hosts import only this
(and common/); the engine, serving and outputs build on it; it imports none of them.

    config.py    PipelineConfig: the typed schema of pipelines.yaml (every error with its key path and line)
    plugins.py   the plug-in registries (heads, sources, sinks, policies, ATMM and backbone backends), lazy
    wire.py      the chunk message (header schema + raw frames), encode / decode; a chunk cut into requests
    geometry.py  Letterbox: original frame <-> model frame
    requests.py  Request: one task on one received chunk, in the daemon's clock
    results.py   ResultRecord and the typed payloads heads produce; what every sink writes
    security.py  ZeroMQ CURVE keys and sockets
"""
