"""Quota over the queue tree, as queueing admits against it: ``QuotaState`` lives in
``shared/quota_state.py`` (the gateway's dry run asks it the same question), the tree's
arithmetic in ``shared/quota_tree.py``. Re-exported here for queueing's modules."""

from __future__ import annotations

from shared.events.reasons import WaitReason
from shared.quota_state import Decision, QuotaState, Reclaim
from shared.quota_tree import BIG, EPS, UNITS, ZERO, QueueTree, Vec

__all__ = ["BIG", "EPS", "UNITS", "ZERO", "Decision", "QueueTree", "QuotaState", "Reclaim",
           "Vec", "WaitReason"]
