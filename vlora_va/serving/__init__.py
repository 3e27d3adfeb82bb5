"""Serving: the inference daemon and what it moves data through.

    daemon.py         the loop: receive -> admit -> plan -> execute -> rows (decides nothing itself)
    transport.py      the PULL socket on its own thread: decode, validate, clock offsets
    admission.py      which requests reach the queue; overload control by priority
    scheduling/       the queue, credits, deadlines, shedding and the policies (which batch, which LoRA mode)
    rows.py           the one row every request gets, to the sinks and observers
    adapter_slots.py  adapters loaded and unloaded at run time (LRU, pinned, held requests)
    status.py         the status snapshot, gauges and throughput log
    startup.py        the engine for a pipeline, the cost profile, warm-up
    costs.py          CostModel: what a plan costs here, corrected online
    profiling.py      measuring and caching the cost profile
    capacity.py       the configured load against this machine, said at start
    control.py        the control socket (vlora-va adapters load / unload / list)
    prometheus.py     the counters and gauges (/metrics)
"""
