"""The contract every detector keeps.

A detector is a small class: its rule ``type``, a pydantic model of its params,
a msgspec struct for its per-resource state, and a pure ``step`` that folds one
event into that state and returns findings. No I/O and no clock: time is the
event's, so the worker, ``backtest`` and a replay all see the same findings.

:class:`Detector` declares everything the engine and the rest of burnwatch use of a
detector, and nothing is probed: what a step may read besides its state and the
event comes in a :class:`Context`, a detector that judges a batch's work together
(the anomaly model) does it in :meth:`Detector.end_batch`, and what a rule is
tracking on its resource (for the anomaly model to stay out of it) is
:meth:`Detector.tracking`. :class:`DetectorBase` gives the defaults.
"""

from __future__ import annotations

import builtins
import enum
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict

from detector.events import Event
from detector.pricing import Pricer, Pricing

if TYPE_CHECKING:
    from detector.detectors.scrape import Scrape


def intern(text: str) -> str:
    """A short string interned (types, regions, tag values, GPU models: a million resources share a
    few dozen instead of holding a copy each); a long one is kept as it is."""
    return sys.intern(text) if len(text) <= 64 else text


T = TypeVar("T")
_TUPLES: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_MAX_TUPLES = 10_000


def shared(items: tuple[T, ...]) -> tuple[T, ...]:
    """One tuple for every equal tuple of short strings that many keys hold alike (a resource's missing
    tags): each key holds a reference, not a copy. The table is bounded: past ``_MAX_TUPLES`` it
    starts afresh."""
    if not items:
        return ()
    found = _TUPLES.get(items)
    if found is None:
        if len(_TUPLES) >= _MAX_TUPLES:
            _TUPLES.clear()
        found = _TUPLES[items] = items
    return found


def at_sample(i: int, found: list[Finding]) -> list[tuple[int, Finding]]:
    """``found`` with the index of the sample that made them, as ``step_scrape`` returns findings.

    A function of its own so that the per-scrape and per-event code that calls it holds no closure
    (a comprehension or lambda over its locals): CPython 3.11 makes every variable a closure reads
    into a cell at each call of the function that holds it, whether or not the closure runs, and
    on the usual scrape or usage interval none does."""
    return [(i, f) for f in found]

__all__ = ["BatchPhase", "Behaviour", "Context", "Detector", "DetectorBase", "Finding", "Params", "ResourceInfo",
           "at_sample", "intern", "make_finding", "shared"]


class Params(BaseModel):
    """Base of every detector's params: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)


class ResourceInfo(msgspec.Struct, kw_only=True, gc=False):
    """What the newest usage event (by event time) said about a resource: who owns it, whether it is
    billed, its price."""

    resource_id: str = ""
    resource_type: str = ""
    provider: str = ""
    account: str = ""
    region: str = ""
    instance_type: str = ""
    pricing: str = ""
    state: str = ""
    """running | stopped | terminated; empty until a usage event has been seen."""
    usd_per_hour: float | None = None
    """The rate its latest priced running interval was billed at (:class:`~detector.pricing.Pricer`)."""
    gpus: int = 0
    """GPUs its instance type has (``rules/pricing.yaml``); 0 when not known. A share of the host
    is priced over these, not over the GPUs that happen to report."""
    interval_usd: float = 0.0
    """What its latest usage interval cost, priced once by the engine's pricer: detectors that
    add up spend add this, so their dollars are the stored rows' dollars."""
    tags: dict[str, str] = {}

    @property
    def known(self) -> bool:
        return bool(self.state)

    @property
    def billed(self) -> bool:
        return self.state == "running"


class Finding(msgspec.Struct, kw_only=True, frozen=True):
    """What a detector concluded about one problem of one resource at one event time.

    ``fire`` opens an episode, ``update`` reports its growing cost, ``resolve``
    closes it. ``episode_start`` together with rule and resource identifies the
    episode, so the same input always yields the same alert id.
    """

    action: Literal["fire", "update", "resolve"]
    rule: str
    type: str
    resource_id: str
    episode_start: float
    fired_at: float
    at: float
    waste_usd: float
    usd_per_hour: float
    severity: str
    details: dict[str, Any] = {}
    resource: ResourceInfo | None = None
    """A copy of what was known about the resource when the finding was made (owner tags, account)."""
    key: str = ""
    """The engine key whose state made it (the resource; the project for run events), set by
    the engine: the worker that holds the key's partition delivers the alert."""


class Behaviour(enum.IntEnum):
    """What unusual behaviour of its resource a rule is tracking now (:meth:`Detector.tracking`).
    Ordered: of several rules on one resource, the highest answer stands."""

    NONE = 0
    """Nothing unusual (or a rule about attribution, capacity or advice)."""
    LEVEL = 1
    """An unusual level while the work goes on (a runaway): the anomaly model's baselines learn it."""
    PAUSE = 2
    """The resource's work paused (idle, hung, dark): the anomaly model's baselines wait it out."""


SPELL_S = 60.0
"""How long a spell of GPUs idle (or hung) must have lasted, at an event's time, for its rule to
track it as behaviour (:meth:`Detector.tracking`): a stall shorter than a minute (a scrape or two
at 30 s) is the work's own rhythm (a checkpoint, an input wait), and pausing the anomaly model's
window for it would leave a host that stalls every few minutes never judged nor learnt. A minute:
when only usage events, a minute apart, asked, a spell that long was always heard and a shorter one
by chance. At 60 s scrapes two idle scrapes are exactly a minute apart and count (a tie: jitter
decides it either way)."""


class BatchPhase(Protocol):
    """What the engine calls at the end of a batch (:meth:`Detector.end_batch`), and the rule it is."""

    name: str
    type: ClassVar[str]

    def end_batch(self, items: list[Any]) -> list[Finding]: ...


class Context:
    """What a step may read besides its state and the event: the engine keeps one and points it at
    the key whose event a step folds, so a step reads it during its call and keeps no reference.

    ``resource`` is what the key's newest usage event said, with the pricer's figures for
    it (``usd_per_hour``, ``interval_usd``: see :mod:`detector.pricing`); to the steps of a
    :attr:`late` usage event, what that event says (a stop read late is a stop). :meth:`lookup`
    finds another resource (a run's hosts), :meth:`others` says what the key's rules are
    tracking, and :meth:`defer` hands work to the batch phase (:meth:`Detector.end_batch`).
    The engine builds it; a test can build one with only a resource."""

    __slots__ = ("resource", "late", "_lookup", "_others", "_defer")

    def __init__(
        self,
        resource: ResourceInfo,
        lookup: Callable[[str], ResourceInfo | None] | None = None,
        others: Callable[[float], Behaviour] | None = None,
        defer: Callable[[BatchPhase, Any], None] | None = None,
        late: bool = False,
    ) -> None:
        self.resource = resource
        self.late = late
        """The event is no newer than the latest of its kind (GPU sample, usage, run event) the key had
        folded in before it: a duplicate, a re-read or one out of order. What a :attr:`~DetectorBase.lazy`
        rule with no state knows of the times it would have kept (:meth:`DetectorBase.starts`)."""
        self._lookup = lookup
        self._others = others
        self._defer = defer

    def lookup(self, resource_id: str) -> ResourceInfo | None:
        """What is known of another resource (held here, or by another worker), or None."""
        return self._lookup(resource_id) if self._lookup is not None else None

    def others(self, t: float) -> Behaviour:
        """The most unusual behaviour any rule on this key is tracking at event time ``t``."""
        return self._others(t) if self._others is not None else Behaviour.NONE

    def defer(self, detector: BatchPhase, item: Any) -> None:
        """Hand ``item`` to ``detector.end_batch`` at the end of this batch."""
        if self._defer is not None:
            self._defer(detector, item)


class DetectorBase:
    """What every detector's constructor and state factory do; subclasses declare the rest."""

    State: ClassVar[builtins.type[msgspec.Struct]]

    def __init__(self, name: str, severity: str, params: Any, pricing: Pricing | None = None) -> None:
        self.name = name
        self.severity = severity
        self.params = params
        self.pricing = pricing or Pricing()
        """The rule set's price list, for detectors that compare prices (spot, a smaller instance, tiers)."""
        self.pricer = Pricer(self.pricing)
        """Its dollars (:mod:`detector.pricing`): what detectors use to turn usage into money."""

    dollars: ClassVar[str] = "wasted"
    """What an alert's dollars are, in words: "wasted", "spent untagged", "could be saved",
    or "" for forecasts whose news is not money already gone."""
    burning: ClassVar[bool | str] = True
    """Whether an open alert of this type is still spending its ``usd_per_hour``: True for
    waste that goes on until someone acts (an idle host); False when the money is sunk (what
    cost it had already ended when it fired); or the name of a boolean detail that is true on
    the alerts that still burn (``failed_run_spend``: ``crash_loop``, a loop retries until
    stopped, while a failed run has ended). The incidents list leaves sunk ones out of the
    open dollars per hour, and Slack shows no monthly burn for them."""
    behaviour: ClassVar[bool] = False
    """Its episodes are a resource behaving unusually (idle, hung, runaway): the anomaly model
    leaves those windows out of training. False for attribution, capacity and advice."""
    group_by: ClassVar[str | None] = "team"
    """What openings of this type are grouped by (``team``, ``account``): those that share
    it and fire together are posted as one Slack message listing them. None: never."""

    lazy: ClassVar[bool] = False
    """Its state is made at the first event that :meth:`starts` it: until then a key holds None for
    the rule (a rule about what most resources never do holds nothing on them). False: made with
    the key's route, as every state was before."""
    listens: ClassVar[bool] = False
    """It reads what the key's other rules track (:meth:`Context.others`): the engine steps it after
    them, so that it hears what they made of the same event whatever order the rules are declared in."""

    def new_state(self) -> Any:
        return self.State()

    def starts(self, ctx: Context, event: Event) -> bool:
        """Whether ``event`` gives a :attr:`lazy` rule something to track on a key that holds no state
        for it. False promises that the state the rule would hold had it been made at the key's first
        event is, after this one, still new but for the key's own latest time of each event kind
        (:attr:`Context.late` says it): that a step would find nothing and leave nothing to remember."""
        return True

    def starts_scrape(self, ctx: Context, scrape: Scrape) -> bool:
        """:meth:`starts` for a scrape: whether any of its samples starts the state."""
        starts = self.starts
        for event in scrape.samples:  # (a loop, not a generator over ctx: see at_sample)
            if starts(ctx, event):
                return True
        return False

    def tracking(self, state: Any, t: float) -> Behaviour:
        return Behaviour.NONE

    def end_batch(self, items: list[Any]) -> list[Finding]:
        return []

    def step_scrape(self, state: Any, ctx: Context, scrape: Scrape, t: float) -> list[tuple[int, Finding]]:
        """One step per sample; the GPU detectors, which see every sample, do a scrape in one call."""
        out: list[tuple[int, Finding]] = []
        step = self.step  # type: ignore[attr-defined]  # every detector defines it
        for i, event in enumerate(scrape.samples):
            found = step(state, ctx, event, t)
            if found:
                out += at_sample(i, found)
        return out

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        """(label, value) pairs from a finding's details, for the alert message."""
        return []

    @classmethod
    def suggest(cls, details: dict[str, Any]) -> str:
        """The next step for one alert, from its details (a pod's idle GPUs want a command, not
        "stop the instance"): the class's ``suggestion`` unless a detector knows better. Our own
        words only: what came from events goes in the details, where it is escaped."""
        return str(getattr(cls, "suggestion", ""))

    def open_episode(self, state: Any, resource: ResourceInfo) -> Finding | None:
        return None

    def open_episodes(self, state: Any, resource: ResourceInfo) -> list[Finding]:
        """Every episode in ``state`` that fired and has not resolved, as ``update`` findings
        with the dollars so far (for reports at the end of data). Most detectors hold at
        most one per key and define :meth:`open_episode` instead."""
        finding = self.open_episode(state, resource)
        return [finding] if finding is not None else []


def make_finding(
    detector: Any,
    action: str,
    resource: ResourceInfo,
    *,
    episode_start: float,
    fired_at: float,
    at: float,
    usd: float,
    details: dict[str, Any],
    usd_per_hour: float | None = None,
) -> Finding:
    """A finding of ``detector`` about ``resource``: the fields every detector fills the same way.
    ``usd_per_hour`` defaults to the resource's price (the rate of waste of an idle host)."""
    return Finding(
        action=action,  # type: ignore[arg-type]
        rule=detector.name,
        type=detector.type,
        resource_id=resource.resource_id,
        episode_start=episode_start,
        fired_at=fired_at,
        at=at,
        waste_usd=round(usd, 4),
        usd_per_hour=round(usd_per_hour if usd_per_hour is not None else resource.usd_per_hour or 0.0, 4),
        severity=detector.severity,
        details=details,
        resource=msgspec.structs.replace(resource),
    )


S = TypeVar("S", bound=msgspec.Struct)


class Detector(Protocol, Generic[S]):
    """One rule type. Instances are built from a validated rule and keep no per-resource state
    themselves (that is ``S``, which the engine holds and persists)."""

    type: ClassVar[str]
    Params: ClassVar[builtins.type[Params]]
    State: ClassVar[builtins.type[msgspec.Struct]]
    consumes: ClassVar[tuple[builtins.type, ...]]
    """Event classes the detector wants; the engine routes nothing else to it."""
    title: ClassVar[str]
    """What the problem is called in alerts ("Idle GPUs")."""
    dollars: ClassVar[str]
    """What an alert's dollars are, in words ("wasted"); "" for forecasts."""
    suggestion: ClassVar[str]
    """The next step a person should take, shown in the alert."""
    behaviour: ClassVar[bool]
    """Its episodes are unusual behaviour (left out of the anomaly model's training)."""
    group_by: ClassVar[str | None]
    burning: ClassVar[bool | str]
    """Whether an open alert still spends its $/h: True, False (sunk), or a boolean detail's name."""
    """What openings of this type are grouped by in Slack (``team``, ``account``), or None."""

    name: str
    severity: str
    params: Any

    def __init__(self, name: str, severity: str, params: Any, pricing: Pricing | None = None) -> None: ...

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        """(label, value) pairs from a finding's details, for the alert message."""
        ...

    @classmethod
    def suggest(cls, details: dict[str, Any]) -> str:
        """The next step for the alert with these details (``suggestion`` unless the details say more)."""
        ...

    lazy: ClassVar[bool]
    """Its state is made at the first event that :meth:`starts` it (None on the key until then)."""
    listens: ClassVar[bool]
    """It reads :meth:`Context.others`: stepped after the key's other rules."""

    def new_state(self) -> S: ...

    def starts(self, ctx: Context, event: Event) -> bool:
        """Whether ``event`` starts a :attr:`lazy` rule's state on a key that has none. False promises
        that a step would find nothing and leave nothing to remember but the key's latest time of the
        event's kind (:attr:`Context.late`): the engine skips it."""
        ...

    def starts_scrape(self, ctx: Context, scrape: Scrape) -> bool:
        """:meth:`starts` for a scrape (any of its samples)."""
        ...

    def step(self, state: S, ctx: Context, event: Event, t: float) -> list[Finding]:
        """Fold one event (``t`` is its time in epoch seconds) into ``state``; return findings."""
        ...

    def step_scrape(self, state: S, ctx: Context, scrape: Scrape, t: float) -> list[tuple[int, Finding]]:
        """:meth:`step` for each sample of a scrape (consecutive GPU samples of one host at ``t``,
        in order, with what several rules ask of them: :class:`~detector.detectors.scrape.Scrape`),
        in one call: what every sample costs is paid once per scrape. Returns the
        findings with the index of the sample that made each (the engine orders them as steps
        would). ``DetectorBase`` steps each sample."""
        ...

    def end_batch(self, items: list[Any]) -> list[Finding]:
        """The batch phase: judge together what this detector's steps deferred in the batch
        (:meth:`Context.defer`), in the order deferred. Most detectors defer nothing."""
        ...

    def tracking(self, state: S, t: float) -> Behaviour:
        """What unusual behaviour of its resource ``state`` is tracking at event time ``t``. Asked for an
        event of ``t``, which live may reach detection after later events of another topic (a usage
        flush after the samples that follow its start): answer for ``t`` where the state can (a dark
        spell is dark until the sample that ended it, an idle one from :data:`SPELL_S` into it to its
        latest sample), so that what a window hears, asked at each of its events, does not depend on
        which topic was read first."""
        ...

    def open_episodes(self, state: S, resource: ResourceInfo) -> list[Finding]:
        """The still-open episodes in ``state`` as ``update`` findings, for reports at the end of data."""
        ...
