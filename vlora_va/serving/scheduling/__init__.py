"""Scheduling: which requests run next, in which LoRA mode, and what overload does.

    base.py      the queue and the rules every policy shares (credits, deadline-aware filling, shedding)
    policies.py  vlora (default), edf, merge-only, unmerge-only, dlora: one class each, chosen by daemon.policy
    overload.py  admission under sustained overload: lower priorities degraded first (shed / stride / frames)
"""

from vlora_va.serving.scheduling.base import Scheduler, Settings, Shed
from vlora_va.serving.scheduling.overload import Admission, OverloadControl
from vlora_va.serving.scheduling.policies import POLICIES

__all__ = ["Scheduler", "Settings", "Shed", "Admission", "OverloadControl", "POLICIES"]
