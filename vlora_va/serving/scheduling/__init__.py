"""Scheduling: which queued requests run next, and in which LoRA mode.

    base.py      the queue and the rules every policy shares (credits, deadline-aware filling, shedding), and how
                 a batch becomes a plan (make_plan: one forward per image size, each with its shared prefix)
    policies.py  vlora (default), edf, merge-only, unmerge-only, dlora: one class each, registered by name in
                 contracts.plugins.POLICIES (daemon.policy)
"""

from vlora_va.serving.scheduling.base import Scheduler, Settings, Shed, make_plan, shared_prefix

__all__ = ["Scheduler", "Settings", "Shed", "make_plan", "shared_prefix"]
