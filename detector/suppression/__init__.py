"""Why an alert is recorded but not posted: the alert manager's stages, as Prometheus
Alertmanager builds its notification pipeline.

Every change a detector finds passes, in order:

    dedup → route → inhibit → silence → realert

- :class:`~detector.suppression.stages.Dedup` drops a change already handled (input re-read
  after a restart or a rebalance);
- :class:`~detector.suppression.stages.Route` picks the Slack channel;
- :class:`~detector.suppression.stages.Inhibit` holds back an anomaly on a resource where a
  rule's incident is open (the rule's alert already says what is wrong);
- :class:`~detector.suppression.stages.Silencing` holds back what a silence covers at the
  opening's event time (:mod:`detector.suppression.silence`);
- :class:`~detector.suppression.stages.Realert` holds back a problem back sooner than its
  rule's ``realert`` interval.

The first stage that holds an opening back says why, as a typed
:class:`~detector.suppression.hold.Hold` (stored in the ``held``, ``held_by`` and
``silenced`` columns of ``alerts``); the alert's later changes carry the same hold. What
the stages remember is one :class:`~detector.suppression.memory.AlertMemory`, which a
restarted worker loads from the store.
"""

from detector.suppression.hold import Hold, HoldKind, describe_holds
from detector.suppression.memory import AlertMemory
from detector.suppression.silence import Silence, SilenceInvalid, snooze

__all__ = ["AlertMemory", "Hold", "HoldKind", "Silence", "SilenceInvalid", "describe_holds", "snooze"]
