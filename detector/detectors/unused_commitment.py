"""``unused_commitment``: a Savings Plan or reserved capacity paid for and left unused, per UTC day.

Example rule::

    - name: unused-commitment
      type: unused_commitment
      match: {resource_type: commitment}
      params:
        min_unused_share: 5%    # a day with at least this share of the commitment's cost unused...
        min_unused_usd: 10      # ...and at least this many dollars unused counts
        for: 1d                 # whole days in a row before alerting
        expire_after: 2d        # a gap in the commitment's data this long ends the episode
      severity: warning

Only the bill shows this waste: ``burnwatch ingest focus --publish-usage`` sends one usage
event per commitment and charge period (``resource_type: commitment``; ``cost_usd`` is the
EffectiveCost of its ``CommitmentDiscountStatus = Unused`` rows, ``metrics.commitment_used_usd``
that of its Used rows). Each charge period is put in the UTC day(s) of its event time; a
day is judged once it is covered (24 h of charge periods), or once data has reached a
full day past its end, and days are judged in order (a complete day waits for a late
day before it, up to that day of further data). A period read again replaces itself, so
a re-read or restated period is never counted twice; a period of a day already judged is
left out.

Why these defaults: the FinOps Foundation's commitment utilisation KPI (used / purchased
commitment) and AWS Cost Explorer's RI and Savings Plans utilisation alerts, commonly set
at 95-100 %, treat anything under about 95 % used as money to act on; 5 % unused and
$10 a day keeps rounding and tiny commitments quiet. One whole day matches the bill's
granularity (daily data: the first complete day). The episode resolves when a judged
day is back under the bar (``reason: used``). A commitment that stops sending data
(expired) resolves when its data resumes after ``expire_after`` (``reason: expired``);
one that never sends again is not resolved by this rule (a detector only runs on its
key's events), the engine forgets it after its state TTL.

Dollars are the unused dollars of the episode's days; per hour, the latest day's unused
dollars over the hours it covered.
"""

from __future__ import annotations

import builtins
import math
from datetime import datetime, timezone
from functools import partial
from typing import Any, ClassVar

from pydantic import Field, field_validator

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.detectors.episode import Episode, advance, end
from detector.events import Event, UsageEvent
from detector.units import Duration, Money, Percent, money

__all__ = ["UnusedCommitment", "UnusedCommitmentParams", "UnusedCommitmentState"]

DAY_S = 86_400.0
_MAX_PERIOD_S = 31 * DAY_S
"""A commitment's charge period is an hour, a day or at most a month."""


class UnusedCommitmentParams(Params):
    min_unused_share: Percent = 5.0
    """A day counts when at least this share of the commitment's cost that day went unused..."""
    min_unused_usd: Money = 10.0
    """...and at least this many dollars of it."""
    for_: Duration = Field(default=DAY_S, alias="for", gt=0)
    expire_after: Duration = Field(default=2 * DAY_S, gt=0)
    update_every: Duration = Field(default=DAY_S, gt=0)

    @field_validator("for_")
    @classmethod
    def _whole_days(cls, value: float) -> float:
        if value % DAY_S:
            raise ValueError("commitment use is judged per UTC day: give whole days (1d, 2d, ...)")
        return value


class UnusedCommitmentState(Episode, kw_only=True):
    pending: dict[int, dict[int, tuple[float, float, float]]] = {}
    """Days not judged yet (UTC midnight, epoch s) → charge-period start (epoch ms) → (used, unused,
    seconds of that day it covers). Keyed by period so a period read again replaces itself."""
    judged_until: float = 0.0
    """End of the latest judged day: periods before it are re-read or too late."""
    reached: float = 0.0
    """The latest charge-period end seen."""
    unused_usd: float = 0.0
    used_usd: float = 0.0
    days: int = 0
    day: float = 0.0
    """Start of the latest day counted in the episode, and its figures below."""
    day_used: float = 0.0
    day_unused: float = 0.0
    day_s: float = 0.0
    commitment_type: str = ""
    commitment_name: str = ""

    def clear(self) -> None:
        super().clear()
        self.unused_usd = self.used_usd = self.day_used = self.day_unused = self.day_s = self.day = 0.0
        self.days = 0


def _kind(commitment_type: str) -> str:
    """``savings_plan``, ``reserved`` or ``committed_use`` from the provider's CommitmentDiscountType."""
    text = commitment_type.lower()
    if "saving" in text:
        return "savings_plan"
    if "reserv" in text:
        return "reserved"
    if "committed" in text or "cud" in text:
        return "committed_use"
    return ""


class UnusedCommitment(DetectorBase):
    type: ClassVar[str] = "unused_commitment"
    title: ClassVar[str] = "Unused commitment"
    Params: ClassVar[builtins.type[UnusedCommitmentParams]] = UnusedCommitmentParams
    State: ClassVar[builtins.type[UnusedCommitmentState]] = UnusedCommitmentState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    dollars: ClassVar[str] = "left unused"
    group_by: ClassVar[str | None] = "account"
    suggestion: ClassVar[str] = (
        "Move eligible workloads of the family and region it covers onto it (shift on-demand or spot "
        "hosts of that family there); size the next purchase to the measured use, not the commitment."
    )
    _BY_KIND: ClassVar[dict[str, str]] = {
        "savings_plan": (
            "Move on-demand usage the plan covers onto it (a compute plan covers any family and region, an "
            "instance plan its family in its region): shift spot or on-demand hosts of that family there. "
            "A Savings Plan cannot be sold or exchanged: size the next purchase to the measured use."
        ),
        "reserved": (
            "Run instances of the family and region it covers on it (shift spot or on-demand hosts of that "
            "family there); if none are needed, exchange it (convertible reservations) or sell it where the "
            "provider allows (AWS's Reserved Instance Marketplace); size the next purchase to the measured use."
        ),
        "committed_use": (
            "Move workloads of the machine series and region it covers onto it (shift spot or on-demand VMs "
            "there); a committed use discount cannot be cancelled: size the next purchase to the measured use."
        ),
    }

    @classmethod
    def suggest(cls, details: dict[str, Any]) -> str:
        return cls._BY_KIND.get(_kind(str(details.get("commitment_type", ""))), cls.suggestion)

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        kind = {"savings_plan": "Savings Plan", "reserved": "Reserved", "committed_use": "Committed use"}.get(
            _kind(str(details.get("commitment_type", ""))), "")
        named = str(details.get("commitment_type", "")) + (f" ({kind})" if kind and kind.lower() not in
                                                             str(details.get("commitment_type", "")).lower() else "")
        used, unused = float(details.get("day_used_usd", 0.0)), float(details.get("day_unused_usd", 0.0))
        return [
            ("Commitment", f"{named or 'commitment'}: {details.get('commitment_name') or '(no name)'}"),
            ("Unused share", f"{100 * float(details.get('unused_share', 0.0)):.1f} % on {details.get('day', '?')}"),
            ("Used vs unused per day", f"{money(used, exact=True)} used, {money(unused, exact=True)} unused"),
            ("Days unused", str(details.get("days", 0))),
        ]  # fmt: skip

    def step(self, state: UnusedCommitmentState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is not UsageEvent or event.resource_type != "commitment":
            return []
        resource = ctx.resource
        used = event.metrics.get("commitment_used_usd")
        if used is None or not math.isfinite(used) or used < 0:
            raise ValueError(f"metrics.commitment_used_usd of commitment {event.resource_id!r} is missing or negative")
        unused = resource.interval_usd  # cost_usd: the unused dollars, as the store keeps them
        interval = event.interval_s
        if interval > _MAX_PERIOD_S:
            raise ValueError(f"interval_s of commitment {event.resource_id!r} is longer than 31 days")
        found: list[Finding] = []
        if state.reached and t >= state.reached + self.params.expire_after:
            found += self._judge(state, resource, force=True)
            found += end(state, partial(self._finding, "resolve", state, resource, state.reached, reason="expired"))
            # A day is judged once, so this never goes back: the rest of a day whose expiry (an expire_after under
            # a day) judged it was judged again, opening an episode with the resolved one's start (its alert id).
            state.judged_until = max(state.judged_until, _day(t))
        period_end = t + interval
        if period_end <= state.judged_until:
            return found  # a re-read period, or one of a day already judged
        state.commitment_type = str(event.extra.get("commitment_type", "") or "")[:200]
        state.commitment_name = str(event.extra.get("commitment_name", "") or "")[:200]
        day = _day(t)
        while day < period_end:
            overlap = min(period_end, day + DAY_S) - max(t, day)
            if overlap > 0 and day >= state.judged_until:
                share = overlap / interval
                state.pending.setdefault(int(day), {})[round(t * 1000)] = (used * share, unused * share, overlap)
            day += DAY_S
        state.reached = max(state.reached, period_end)
        return found + self._judge(state, resource)

    def _judge(self, st: UnusedCommitmentState, res: ResourceInfo, force: bool = False) -> list[Finding]:
        """Judge the pending days that are ready, in order."""
        found: list[Finding] = []
        p = self.params
        while st.pending:
            day = min(st.pending)
            periods = st.pending[day]
            covered = sum(s for _, _, s in periods.values())
            in_turn = not st.judged_until or day <= st.judged_until
            if not (force or (covered >= DAY_S - 1e-6 and in_turn) or st.reached >= day + 2 * DAY_S):
                break
            del st.pending[day]
            st.judged_until = day + DAY_S
            used = sum(u for u, _, _ in periods.values())
            unused = sum(u for _, u, _ in periods.values())
            total = used + unused
            share = unused / total if total > 0 else 0.0
            day_end = day + DAY_S
            if total <= 0 or share * 100 < p.min_unused_share or unused < p.min_unused_usd:
                resolve = self._finding_at(st, res, day_end, reason="used", resolved_share=round(share, 4))
                found += end(st, resolve)
                continue
            if st.since is None:
                st.since = float(day)
            st.days += 1
            st.used_usd += used
            st.unused_usd += unused
            st.day, st.day_used, st.day_unused, st.day_s = float(day), used, unused, covered
            action = advance(st, day_end, start=st.since, held_s=day_end - st.since, need_s=p.for_,
                             every_s=p.update_every)  # fmt: skip
            if action is not None and st.fired_at is not None:
                found.append(self._finding(action, st, res, day_end))
        return found

    def _finding(self, action: str, st: UnusedCommitmentState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        day_total = st.day_used + st.day_unused
        details = {
            "commitment_type": st.commitment_type, "commitment_name": st.commitment_name,
            "day": datetime.fromtimestamp(st.day, tz=timezone.utc).date().isoformat(),
            "day_used_usd": round(st.day_used, 4), "day_unused_usd": round(st.day_unused, 4),
            "unused_share": round(st.day_unused / day_total, 4) if day_total > 0 else 0.0,
            "days": st.days, "used_usd": round(st.used_usd, 4),
            # the rule's line, for the chart to write (as the GPU rules' util_below_pct)
            "min_unused_share": self.params.min_unused_share, "min_unused_usd": self.params.min_unused_usd, **extra,
        }  # fmt: skip
        per_hour = st.day_unused * 3600.0 / st.day_s if st.day_s > 0 else 0.0
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=st.unused_usd, details=details, usd_per_hour=per_hour)  # fmt: skip

    def _finding_at(self, st: UnusedCommitmentState, res: ResourceInfo, at: float, **extra: object) -> Any:
        """A resolve finding of ``st`` as of ``at``, made when called (before ``end`` clears it)."""
        return lambda: self._finding("resolve", st, res, at, **extra)

    def open_episode(self, state: UnusedCommitmentState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.judged_until)


def _day(t: float) -> float:
    """Start of the UTC day holding ``t``."""
    return math.floor(t / DAY_S) * DAY_S

