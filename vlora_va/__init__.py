"""vlora-va: real-time video analytics with one backbone and many LoRA adapters.

Layers, bottom to top (imports point down only; ARCHITECTURE.md has the map):
    common      logging and JSON helpers
    contracts   config schema, wire format, requests, result rows, plug-in registries (no torch)
    kernels     ATMM: the batched heterogeneous-LoRA operator
    engine      backbone, LoRA modes, precision, heads, backbone backends, plan execution
    ingest      sources, chunks, the ingest worker (no torch)
    serving     the daemon loop, admission, scheduling, costs, rows, control socket, transport, metrics
    outputs     sinks, dashboard, draw
    training    adapters from teachers (beside serving, on the engine)
    supervisor  `vlora-va run`: the daemon and ingest workers as supervised processes
    cli         the `vlora-va` command
"""

__version__ = "0.1.0"
