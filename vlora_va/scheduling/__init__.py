"""Scheduling: which requests run next, in which LoRA mode, and what overload does.

    base.py      the queue and the rules every policy shares (credits, deadline-aware filling, shedding)
    policies.py  vlora (default), edf, merge-only, unmerge-only, dlora: one class each, chosen by daemon.policy
    overload.py  admission under sustained overload: lower priorities degraded first (shed / stride / frames)
"""

from .base import Scheduler, Settings, Shed
from .overload import Admission, OverloadControl
from .policies import POLICIES

__all__ = ["Scheduler", "Settings", "Shed", "Admission", "OverloadControl", "POLICIES"]
