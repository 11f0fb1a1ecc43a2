"""Per-resource state and the routing of events to the rules that apply.

The engine owns one :class:`KeyState` per key (resource id, or the project for run
events): what its newest usage event said about the resource, and each rule's
detector state: None for a rule that is lazy (:attr:`~detector.detectors.base.DetectorBase.lazy`)
until an event gives it something to track (:meth:`~detector.detectors.base.DetectorBase.starts`),
the engine skipping its step till then, so a rule about what most resources never do (egress,
Kubernetes allocation, missing tags) holds nothing on them. The streaming worker persists the
keys the engine marks dirty, and restores a key with :meth:`Engine.restore` after a restart or
rebalance; ``backtest`` simply never persists. In the worker, a key quiet for
``evict_after_s`` leaves memory once saved (:meth:`Engine.evict`) and is read back from the
store (``fetch``) at its next event, as it was: memory holds the resources that speak.

State lives ``state_ttl_s`` of event time after a key's latest event. The rule is decided per key at
its next event, by that event's time alone: one more than ``state_ttl_s`` after the key's latest
time starts the key afresh, as a key never seen, before the event is folded in: what it said and
what its rules tracked are forgotten (an episode left open is resolved, below); only its latest
time of each kind stays, so that its old life's events read again after a restart are skipped
(:meth:`Engine.already_seen`), not folded into the new one. So an engine that never sweeps, a worker
that ran through the gap, one restarted during it and one that evicted the key and reads it back
all detect alike, whenever their sweeps ran. Sweeps
(:meth:`Engine.expire`) reclaim memory and store rows, of keys whose latest time is more than
``state_ttl_s`` before the watermark: the rule would start each afresh at any event from the
watermark on. The one event that can tell is one older than the watermark (out of order: a topic or
an exporter running behind the others) for a key a sweep has reclaimed, yet within ``state_ttl_s``
of its latest time: it finds nothing and starts the key afresh, where an engine that had not swept
would have gone on from its state.

An episode open when its key goes quiet past the TTL is resolved where its key's events stopped
(:meth:`Engine.silent_resolutions`, ``reason: went_silent``): a resource that vanishes (terminated with no
stop event, its node removed, its exporter gone) would otherwise stay an open incident for ever.
Whichever forgets the state resolves it, from that state, so with the same figures, once: the key's
next event, or the sweep that reclaims the key (:attr:`Engine.last_ended`; the worker reads the
states of reclaimed keys that are only in the store, :attr:`Engine.last_unread`). ``backtest``
sweeps when a worker would (:attr:`Engine.sweep_due`) and once at the end of its data, as a worker's
sweep on the wall clock does once its stream stops.

An event older than a key's latest time is folded into the state
the key has (late, by kind), never into one forgotten. A usage event no newer than the key's newest
usage (sent again, or out of order) leaves what the key says of the resource as the newest said: its
rules read its own facts (:meth:`Engine._late_info`), the key's other events the newest's, as in time
order.

The engine's watermark (how far event time has got: what sweeps, the daily digest
and the freshness metric go by) is not the newest timestamp seen, which one
future-dated event would move by days and so reclaim every other key's state. A key
vouches only for the second-latest distinct time it has sent (its latest may be an
outlier), and the watermark is the time at least ``min(3, n)`` of the ``n`` keys that
moved past it have reached. It is computed once per batch, not per event. The TTL rule goes
by a key's own times, not by the watermark: a future-dated event more than ``state_ttl_s``
ahead of its key's latest time starts that key afresh, and no other.

A step reads its key's :class:`~detector.detectors.base.Context` (the resource, a look-up
of other resources, what the key's rules are tracking) and may defer work to the end of
the batch, where each detector's :meth:`~detector.detectors.base.Detector.end_batch`
judges it together (the anomaly rule scores a batch's windows in one model call per
group). The engine holds no model: the anomaly rule has its scorer injected
(:func:`detector.detectors.anomaly.use_scoring`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Container, Iterable, Mapping
from collections.abc import Set as AbstractSet
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import structlog

from detector.billing.rates import BilledRates
from detector.detectors import Detector, Finding, ResourceInfo
from detector.detectors.base import BatchPhase, Behaviour, Context, DetectorBase, intern
from detector.detectors.episode import SILENT
from detector.detectors.scrape import Scrape
from detector.events import Event, GpuMetric, RunEvent, UsageEvent
from detector.floats import enc_hook
from detector.pricing import Pricer
from detector.rules import CompiledRule, RuleSet
from detector.saved import read_state

__all__ = ["RULE_NO_LONGER_APPLIES", "RULE_REMOVED", "Engine", "KeyState", "SeenSample"]

RULE_REMOVED = "rule_removed"
"""The ``reason`` of an episode resolved because a reload removed its rule (or changed its type)."""
RULE_NO_LONGER_APPLIES = "rule_no_longer_applies"
"""The ``reason`` of an episode resolved because its resource changed so that its rule's ``match`` no
longer takes it (another type, account, region or owner tags)."""

log = structlog.get_logger("burnwatch.engine")

_SNAPSHOT_VERSION = 1
_WATERMARK_KEYS = 3
"""How many keys must have reached a time for the watermark to move there (fewer keys: all)."""
_SWEEP_EVERY = 1 / 8
"""The share of the eviction window (of the TTL without eviction) the watermark moves between two
sweeps the worker runs by event time (:attr:`Engine.sweep_due`): memory then holds the keys that
spoke within ``evict_after_s`` and an eighth, at any catch-up speed."""


Plan = tuple[tuple[Any, Any, Detector[Any], int], ...]
"""``(detector.step, detector.step_scrape, detector, slot)`` of the rules that see one event type
on one kind of resource, ``slot`` the place of the rule's state in the key's
:attr:`KeyState.states`: shared by every key whose rules match alike and whose states lie in the
same order (a key's route is this tuple alone: nothing per key but the reference)."""


_event = itemgetter(1)
_time = itemgetter(0)
_resource_id = attrgetter("resource_id")
_GPU_ONLY = {GpuMetric}


def _by_sample_then_rule(item: tuple[int, int, Any]) -> tuple[int, int]:
    return item[0], item[1]


def _samples(items: list[tuple[float, Any]]) -> list[Any]:
    """The samples of a scrape's items, in order: each a sample, or a list of them (a message's part of
    the scrape, :mod:`detector.align`), which is rare: a scrape split across messages."""
    samples = list(map(_event, items))
    if list not in set(map(type, samples)):
        return samples
    out: list[Any] = []
    for item in samples:
        if type(item) is list:
            out.extend(item)
        else:
            out.append(item)
    return out


_NEVER = -math.inf
"""A key's time for an event kind it has not sent (one float object shared by every key)."""


_NO_NAMES: tuple[str, ...] = ()


class SeenSample:
    """A GPU sample that another engine detects on (``backtest --jobs``: another shard's host), given
    to this one by its key and time alone: it moves the key's latest time, so the key starts afresh
    where it would in one engine (a sample more than ``state_ttl_s`` after the key's latest event),
    and nothing else. What the resource is comes from its usage events (``Engine(foreign=...)``)."""

    __slots__ = ("resource_id", "ts")

    def __init__(self, resource_id: str, ts: Any) -> None:
        self.resource_id = resource_id
        self.ts = ts
        """The sample's timestamp (a datetime, as the event's), which the aligner orders it by."""


class KeyState:
    """Everything known about one key. Its routes are derived, never saved.

    Its rules' states are a tuple in the order of ``names``, a tuple of their names shared by every
    key whose rules are the same (the engine's :meth:`Engine._names`), not a dict per key (a dict of
    a dozen rules is ~470 bytes; the tuple of states ~140, the names shared)."""

    __slots__ = ("info", "names", "states", "last_t", "gpu_t", "usage_t", "run_t", "gpu_route", "usage_route",
                 "run_route")  # fmt: skip

    def __init__(self, info: ResourceInfo, names: tuple[str, ...] = _NO_NAMES, states: tuple[Any, ...] = (),
                 last_t: float = 0.0, kind_t: dict[str, float] | None = None) -> None:  # fmt: skip
        self.info = info
        self.names = names
        """The rules this key holds state for, in order (what a snapshot saves them in)."""
        self.states = states
        """Each rule's detector state, in the order of :attr:`names`; None for a
        :attr:`~detector.detectors.base.DetectorBase.lazy` rule with nothing to track on the key yet
        (saved as None, restored as None)."""
        self.last_t = last_t
        kinds = kind_t or {}
        self.gpu_t: float = kinds.get("gpu", _NEVER)
        """The latest time of a GPU sample folded in (:data:`_NEVER`: none), and below of a usage and
        a run event: what a restart may skip of the events it reads again (:meth:`Engine.already_seen`).
        Three slots, not a dict by kind (~160 bytes a key)."""
        self.usage_t: float = kinds.get("usage", _NEVER)
        self.run_t: float = kinds.get("run", _NEVER)
        self.gpu_route: Plan | None = None
        """The plan of GPU samples, and below of usage and run events (None: not made yet); rebuilt
        when the resource or the rules change. Three slots, not a dict by event type (~150 bytes a key)."""
        self.usage_route: Plan | None = None
        self.run_route: Plan | None = None

    @property
    def rules(self) -> dict[str, Any]:
        """Rule name → that rule's detector state (a new dict: what a snapshot saves)."""
        return dict(zip(self.names, self.states, strict=True))

    def rule(self, name: str) -> Any:
        """Rule ``name``'s state on this key, or None."""
        names = self.names
        return self.states[names.index(name)] if name in names else None

    def clear_routes(self) -> None:
        """Forget the routes (the resource or the rules changed): the next event of each type makes its own."""
        self.gpu_route = self.usage_route = self.run_route = None

    @property
    def kind_t(self) -> dict[str, float]:
        """Event kind (:data:`_KIND`) → the latest time of that kind folded in, for the kinds seen
        (what a snapshot saves)."""
        return {kind: t for kind, t in (("gpu", self.gpu_t), ("usage", self.usage_t), ("run", self.run_t))
                if t != _NEVER}  # fmt: skip


class _Snapshot(msgspec.Struct, kw_only=True):
    v: int
    info: ResourceInfo
    rules: dict[str, msgspec.Raw]
    last_t: float
    kind_t: dict[str, float] = {}
    """Empty in snapshots saved before it existed."""
    types: dict[str, str] = {}
    """Rule name → the type its state was saved by (empty before it existed; a release before it ignores it):
    a rule of the name now of another type does not read it as its own (idle_gpu's and stuck_gpu's states
    are of one class)."""


_KIND: dict[type, str] = {GpuMetric: "gpu", UsageEvent: "usage", RunEvent: "run"}
_NIL = msgspec.msgpack.encode(None)
"""A rule state saved as None: a lazy rule's before its first state (:meth:`Engine.restore`)."""
_MAX_TAG_SETS = 100_000
_MAX_LAYOUTS = 4_096
"""Layouts of rule names whose tracking rules :meth:`Engine._others` keeps (a few per rule set) before it starts afresh."""
_MAX_PRICES = 10_000
"""Distinct prices the engine shares one float of (:meth:`Engine._shared_price`) before it starts afresh."""
_NO_TAGS: dict[str, str] = {}


_intern = intern


def _listens(rule: CompiledRule) -> bool:
    return rule.detector.listens


def _trackers(ruleset: RuleSet) -> dict[str, Callable[[Any, float], Behaviour]]:
    """Rule name → its detector's ``tracking``, for the rules that can track anything: asked at every
    event of a key while the anomaly model is loaded, of the key's few rules that say more than
    :meth:`DetectorBase.tracking`'s NONE (a detector of its own kind is always asked)."""
    return {r.detector.name: r.detector.tracking for r in ruleset.rules
            if getattr(type(r.detector), "tracking", None) is not DetectorBase.tracking}  # fmt: skip


class _KeyContext(Context):
    """The engine's :class:`Context`: one per engine, pointed at the key whose event is being
    folded (steps keep no context past their call), not one per key (~90 bytes a key)."""

    __slots__ = ("_engine", "_state")

    def __init__(self, engine: Engine) -> None:
        super().__init__(ResourceInfo())
        self._state: KeyState | None = None
        self._engine = engine

    def point(self, state: KeyState) -> None:
        """Make this the context of ``state``'s key."""
        self.resource, self._state = state.info, state

    def lookup(self, resource_id: str) -> ResourceInfo | None:
        return self._engine.resource(resource_id)

    def others(self, t: float) -> Behaviour:
        return self._engine._others(self._state, t) if self._state is not None else Behaviour.NONE

    def defer(self, detector: BatchPhase, item: Any) -> None:
        self._engine._deferred.append((detector, item))


class Engine:
    """Folds events into per-key state and returns the detectors' findings."""

    def __init__(
        self,
        ruleset: RuleSet,
        *,
        state_ttl_s: float = 2 * 86_400.0,
        loader: Callable[[str], bytes | None] | None = None,
        billed: BilledRates | None = None,
        evict_after_s: float | None = None,
        fetch: Callable[[str], bytes | None] | None = None,
        foreign: Callable[[str], bool] | None = None,
    ) -> None:
        self.ruleset = ruleset
        self.billed = billed
        """Rates and tags from the FOCUS bill (:mod:`detector.billing.rates`); None: the price list alone."""
        self.pricer = Pricer(ruleset.pricing, billed, say=True)
        """Prices each usage event once, for every detector (see :mod:`detector.pricing`)."""
        self.state_ttl_s = state_ttl_s
        self._loader = loader
        self.evict_after_s = evict_after_s
        """Keys quiet this long (event time) leave memory at :meth:`expire`; None: never (needs ``fetch``)."""
        self._fetch = fetch
        """The store's look-up of one key's saved state: how an evicted key comes back."""
        self._foreign = foreign
        """Keys another engine detects for (``backtest --jobs``: one engine a shard of the keys): of those
        their usage events come here, for what the resource is (:meth:`resource`: a run's hosts), their run
        events, and their GPU samples as :class:`SeenSample`, for when the key starts afresh; no rule runs on them. Their
        latest time and the TTL rule are kept as for any key, so what :meth:`resource` says of one is what
        one engine holding every key would say. None: every key is this engine's."""
        self._evicted: dict[str, float] = {}
        """Keys evicted (saved in the store, not in memory) → their time, for their TTL expiry."""
        self._read_ahead: dict[str, bytes | None] = {}
        """Saved states of evicted keys read together before a batch (:meth:`read_ahead`; None: not
        in the store), taken by the keys' first event instead of one look-up each."""
        self._leaving: dict[str, bytes] = {}
        """Snapshots of the keys evicted by the latest :meth:`expire`, kept until the next one: the
        write of their last batch may still be in flight when they speak again."""
        self._keys: dict[str, KeyState] = {}
        self._restored_t: dict[str, tuple[dict[str, float], float]] = {}
        """Key → the time its state had reached when restored (see :meth:`already_seen`)."""
        self.dirty: set[str] = set()
        self.watermark = 0.0
        """Event time reached: see the module's docstring."""
        self._swept_at = -math.inf
        """The watermark at the latest :meth:`expire` (:attr:`sweep_due`)."""
        self.last_evicted = 0
        """Keys the latest :meth:`expire` took out of memory."""
        self.last_ended: list[Finding] = []
        """The resolutions of the episodes left open on the keys the latest :meth:`expire` reclaimed
        from memory (:meth:`silent_resolutions`), for the caller to hand to its alert manager."""
        self.last_unread: list[str] = []
        """The keys the latest :meth:`expire` reclaimed that were evicted and may hold an open episode
        (:meth:`may_be_open`): their state is in the store (the worker reads them, :meth:`ended_in`)."""
        self._pending: list[Finding] = []
        """Resolutions made where no step runs (a reload, a route made again), handed on with the
        findings of the batch that made them, or of the next one."""
        self._maybe_open: set[str] = set()
        """Keys whose state may hold an open episode: a finding other than a resolution was made on
        them in their life here, or their state held one when it was restored. A superset (an episode
        resolved since leaves its key here until the key starts afresh or leaves), kept so that a sweep
        reads from the store only the states it may have to resolve (:meth:`may_be_open`)."""
        self._ahead: dict[str, float] = {}
        """Key → the time it vouches for (its second-latest distinct event time), for keys past
        the watermark (at most two between batches)."""
        self._deferred: list[tuple[BatchPhase, Any]] = []
        """What the batch's steps deferred to :meth:`Detector.end_batch`, in order."""
        self._trackers = _trackers(ruleset)
        self._tracked: dict[int, tuple[tuple[str, ...], tuple[tuple[int, Callable[[Any, float], Behaviour]], ...]]] = {}
        """A layout of rule names (its id: one tuple per layout) → the slots of its rules that track, each
        with its ``tracking``: what :meth:`_others` asks, at every event of a key while a model is loaded."""
        self.directory: Callable[[str, float], ResourceInfo | None] | None = None
        """Resources this engine does not hold, as of an event time: with several workers, a run's
        hosts may live on another (the worker looks them up in the store). None: every key is here."""
        self._run_t = 0.0
        """Event time of the run event being processed (what a directory look-up is as of)."""
        self.errors: dict[str, int] = {}
        """Rule name → events its detector raised on (skipped for that rule)."""
        self._errors_logged: set[tuple[str, str, type]] = set()
        self.unreadable: dict[str, int] = {}
        """Rule name ('' for a whole snapshot) → saved states :meth:`restore` could not read (another
        release's shape: an upgrade, a rollback, a rolling deploy) and started afresh."""
        self._encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
        self._plans: dict[tuple[tuple[str, ...], tuple[Detector[Any], ...]], Plan] = {}
        """A key's rule names and the detectors of a route → its plan (bound steps and slots), one per
        distinct pair."""
        self._layouts: dict[tuple[str, ...], tuple[str, ...]] = {}
        """Tuples of rule names seen → one shared tuple each (:attr:`KeyState.names`)."""
        self._context = _KeyContext(self)
        self._tags: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        """Tag sets seen → one shared dict each (resources of a team carry the same tags), completed with the keys
        the rules name in their spelling (:mod:`detector.tag_names`: ``Team`` is also ``team``)."""
        self._tag_names = ruleset.tag_names
        self._prices: dict[float, float] = {}
        """Interval costs and hourly rates seen → one float each: resources of a type and interval cost
        the same, and a float of its own is 24 bytes a key (:meth:`_shared_price`)."""
        self._decoder = msgspec.msgpack.Decoder(_Snapshot)
        self._types: dict[tuple[str, ...], msgspec.Raw] = {}
        """A layout of rule names → their types under the rules in force, encoded once (what a snapshot saves)."""
        self.carry: Mapping[str, str] | None = None
        """Rule name → type of the rules this engine does not load whose saved states it carries through a
        restore into its snapshots (:attr:`_carried`): a newer rule set's, loaded by the workers of a newer
        release beside this one in a rolling update. None: not yet known (after a start, an assignment or a
        reload), every such state is carried until :meth:`settle_carried` says which."""
        self._carried: dict[str, dict[str, tuple[str, msgspec.Raw]]] = {}
        """Key → rule name → (type, '' if not saved; the state's bytes) of the states a restore carried:
        empty but in a rolling update. Without it a worker of the older release dropped a newer rule's state
        when the key spoke, and the newer worker that got the key back had lost the rule's open episode: its
        incident open for ever, and a second one opened."""

    def __len__(self) -> int:
        return len(self._keys)

    # -- processing -----------------------------------------------------------------

    def process(self, events: Iterable[Event]) -> list[Finding]:
        """Fold events in order; return every finding they produced."""
        return self.process_timed((event.ts.timestamp(), event) for event in events)

    def process_timed(self, items: Iterable[tuple[float, Event | SeenSample | list[GpuMetric]]]) -> list[Finding]:
        """:meth:`process` for ``(t, event)`` pairs whose time is already computed (the aligner's), or
        ``(t, samples)``: a list of GPU samples of one host at ``t``, which the aligner makes of a
        message's samples (:mod:`detector.align`), taken as they are, in order, as their events would be.

        A scrape (consecutive GPU samples of one key at one time: one host's GPUs, which the
        aligner releases together) is folded into the key once, and each detector that has a
        ``step_scrape`` takes it in one call; findings keep the order of one step per event. A list
        is a scrape already (no check of its samples); one next to more samples of its host at its
        time (a scrape split across messages) is a part of the scrape they make together."""
        findings: list[Finding] = self._pending  # a reload's resolutions, made between batches
        self._pending = []
        keys = self._keys
        mark_dirty = self.dirty.add
        watermark = self.watermark
        ahead = self._ahead
        ttl = self.state_ttl_s
        foreign = self._foreign
        last_key: str | None = None
        state = KeyState(ResourceInfo())  # replaced at the first event (no key is None)
        ctx = self._context
        items = items if isinstance(items, list) else list(items)
        n = len(items)
        i = 0
        size = 1  # the latest scrape's samples: most hosts' scrapes are alike
        while i < n:
            t, item = items[i]
            etype = type(item)
            i += 1
            gathered: list[GpuMetric] | None = None
            if etype is list:  # a message's samples of one host at t (detector.align): a scrape, or its start
                gathered = item  # type: ignore[assignment]
                event: Event = gathered[0]  # type: ignore[index]
                etype = GpuMetric
            else:
                event = item  # type: ignore[assignment]  # (a SeenSample, told apart by its type below)
            key = event.key if etype is RunEvent else event.resource_id  # type: ignore[union-attr]
            if key != last_key:  # time-sorted input keeps a scrape's samples together
                held = keys.get(key)
                state = held if held is not None else self._load(key)
                ctx.point(state)
                mark_dirty(key)
                last_key = key
            if etype is GpuMetric:
                run_end = i
                guess, guessed = 0, None
                if gathered is None:
                    # As many samples as the host has GPUs (by its instance type), else as the latest scrape had?
                    expected = state.info.gpus
                    guess = i - 1 + (expected if expected > 1 else size)
                    if guess > i and guess <= n:  # checked in C, not item by item
                        chunk = items[i - 1 : guess]
                        if set(map(_time, chunk)) == {t}:
                            samples = list(map(_event, chunk))
                            if set(map(type, samples)) == _GPU_ONLY and set(map(_resource_id, samples)) == {key}:
                                run_end, guessed = guess, samples
                while run_end < n:  # the rest of its scrape: same key, same time, a sample or a list
                    nt, nxt = items[run_end]
                    if nt != t:
                        break
                    ntype = type(nxt)
                    if ntype is list:
                        nxt = nxt[0]  # type: ignore[index]
                    elif ntype is not GpuMetric:
                        break
                    if nxt.resource_id != key:  # type: ignore[union-attr]
                        break
                    run_end += 1
                # A sample alone is a scrape of one: every GPU sample takes one path, each rule's step_scrape.
                if run_end == i:
                    taken: list[Any] = [event] if gathered is None else gathered
                elif guessed is not None and run_end == guess:
                    taken = guessed
                else:
                    taken = _samples(items[i - 1 : run_end])
                scrape: list[Any] | None = taken
                size = len(taken)
                i = run_end
            else:
                scrape = None
            last_t = state.last_t
            if t > last_t:
                if t - last_t > ttl and last_t:  # quiet past the TTL: its open episodes end, the key starts afresh
                    findings.extend(self.silent_resolutions(key, state))
                    state = self._renew(key, state)
                state.last_t = t
                if last_t > watermark:  # the key vouches for its time before this one
                    ahead[key] = last_t
            elif last_t > t > watermark and t > ahead.get(key, 0.0):  # samples after an outlier
                ahead[key] = t
            if etype is GpuMetric:
                if t > state.gpu_t:
                    state.gpu_t = t
                    ctx.late = False
                else:
                    ctx.late = True
                route = state.gpu_route
            elif etype is UsageEvent:
                if t > state.usage_t:
                    state.usage_t = t
                    ctx.late = False
                    self._update_info(state, event)  # type: ignore[arg-type]
                else:  # the key keeps what its newest usage said; the rules read this event's own facts
                    ctx.late = True
                    ctx.resource = self._late_info(state, event)  # type: ignore[arg-type]
                    last_key = None  # (so the key's next event points the context back at its info)
                if foreign is not None and foreign(key):
                    continue  # another shard's resource: known for look-ups, detected there
                route = state.usage_route  # after the update: a changed resource has none
            else:
                if etype is not RunEvent:
                    continue  # a SeenSample: its key's time, moved above, is all it says
                if t > state.run_t:
                    state.run_t = t
                    ctx.late = False
                else:
                    ctx.late = True
                if foreign is not None and foreign(key):
                    continue  # another shard's project: its time moves the watermark as in one engine, detected there
                self._run_t = t
                route = state.run_route
            if route is None:
                route = self._route(state, etype)
                if self._pending:  # episodes of rules that no longer apply to the resource, resolved
                    findings += self._pending
                    self._pending = []
            if scrape is not None:
                found_in = self._scrape(route, state, ctx, key, Scrape(scrape), t)
                if found_in:
                    findings.extend(f if f.key == key else msgspec.structs.replace(f, key=key) for f in found_in)
                continue
            states = state.states
            for step, _, detector, slot in route:
                try:
                    rule_state = states[slot]
                    if rule_state is None:  # a lazy rule with nothing to track yet on this key
                        if not detector.starts(ctx, event):
                            continue
                        rule_state = self._start(state, detector, slot)
                        states = state.states
                    found = step(rule_state, ctx, event, t)
                except Exception as exc:  # noqa: BLE001 - one rule's bug on one event must not stop the rest
                    self._step_failed(detector, key, event, exc)
                    continue
                if found:
                    findings.extend(f if f.key == key else msgspec.structs.replace(f, key=key) for f in found)
        if ahead:
            self._advance(ahead)
        if self._deferred:
            findings.extend(self._end_batch())
        if findings:
            self._maybe_open.update(f.key or f.resource_id for f in findings if f.action != "resolve")
        return findings

    def may_be_open(self, key: str) -> bool:
        """Whether ``key``'s state may hold an open episode: saved beside the state, so that a sweep
        that reclaims the key past its TTL unread reads its state only if so (migration 0024). A key that carries
        states (:attr:`_carried`) may: this engine cannot read them, and a newer worker's sweep resolves them."""
        return key in self._maybe_open or key in self._carried

    def _open_in(self, key: str, state: KeyState) -> list[Finding]:
        """The episodes open in ``state``, as ``update`` findings with their dollars so far. A rule whose
        ``open_episodes`` raises is skipped, counted and logged once per rule and error type, as a step
        that raises is: a key reclaimed or started afresh must not stop the batch."""
        found: list[Finding] = []
        for rule in self.ruleset.rules:
            rule_state = state.rule(rule.detector.name)
            if rule_state is not None:
                found += self._episodes_of(rule.detector, rule_state, state.info, key)
        return found

    def _episodes_of(self, detector: Detector[Any], rule_state: Any, info: ResourceInfo, key: str) -> list[Finding]:
        """``detector.open_episodes`` of one rule's state; none where it raises, counted and logged as a step
        that raises is (once per rule and error type): one rule's bug must not stop the rest."""
        try:
            return detector.open_episodes(rule_state, info)
        except Exception as exc:  # noqa: BLE001 - a detector's bug, whatever it raises
            if self._count_failure(detector, exc, 1, "open_episodes"):
                log.error("detector_error", rule=detector.name, type=detector.type, key=key,
                          phase="open_episodes", error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            return []

    def _end_dropped(self, key: str, info: ResourceInfo, dropped: list[tuple[Detector[Any], Any]], reason: str) -> None:
        """Resolve the episodes open in the states of rules a key is losing (``reason``), dated where each
        stood, with its dollars so far: dropped with the state, an open incident would stay open for ever."""
        for detector, rule_state in dropped:
            if rule_state is not None:
                self._pending += [msgspec.structs.replace(f, action="resolve", key=key,
                                                          details={**f.details, "reason": reason})
                                  for f in self._episodes_of(detector, rule_state, info, key)]  # fmt: skip

    def silent_resolutions(self, key: str, state: KeyState) -> list[Finding]:
        """The episodes open in ``key``'s state, resolved as it went quiet past the TTL (see the
        module's docstring): at the time and with the dollars each last reached (its
        :meth:`~detector.detectors.base.Detector.open_episodes` figures), ``reason: went_silent``
        (:data:`~detector.detectors.episode.SILENT`), ``silent_s`` the TTL."""
        said = {"reason": SILENT, "silent_s": self.state_ttl_s}
        return [msgspec.structs.replace(f, action="resolve", key=key, details={**f.details, **said})
                for f in self._open_in(key, state)]  # fmt: skip

    def _renew(self, key: str, old: KeyState) -> KeyState:
        """The key's next event came more than ``state_ttl_s`` after its last: it starts afresh, as a
        key never seen (what it said and what its rules tracked are forgotten), whether it stayed in
        memory, was evicted or was restored after a restart (see the module's docstring). Only the
        latest time of each kind it folded in stays: an event of its old life read again after a
        restart is known as folded (:meth:`already_seen`, by kind), not taken into the new life as
        new, and one that comes late is late (the new life's first event of each kind is past them)."""
        state = self._keys[key] = KeyState(info=ResourceInfo(resource_id=key))
        state.gpu_t, state.usage_t, state.run_t = old.gpu_t, old.usage_t, old.run_t
        self._maybe_open.discard(key)
        self._carried.pop(key, None)
        self._context.point(state)
        return state

    def _scrape(self, route: Plan, state: KeyState, ctx: Context, key: str, scrape: Scrape,
                t: float) -> list[Finding]:  # fmt: skip
        """Fold one scrape (the samples of ``key`` at ``t``, one or more) into every rule of the route, one
        ``step_scrape`` call each. The findings come in the order one step per sample would give (by
        sample, then by rule)."""
        tagged: list[tuple[int, int, Finding]] = []
        states = state.states
        for j, (_, step_scrape, detector, slot) in enumerate(route):
            try:
                rule_state = states[slot]
                if rule_state is None:  # a lazy rule with nothing to track yet on this key
                    if not detector.starts_scrape(ctx, scrape):
                        continue
                    rule_state = self._start(state, detector, slot)
                    states = state.states
                got = step_scrape(rule_state, ctx, scrape, t)
            except Exception as exc:  # noqa: BLE001 - as for one event: the scrape is skipped for that rule
                self._step_failed(detector, key, scrape.samples[0], exc, len(scrape.samples))
                continue
            if got:
                for i, f in got:  # (a loop, not a generator: j would be a cell at every scrape, at_sample says why)
                    tagged.append((i, j, f))
        if not tagged:
            return []  # (most scrapes)
        if len(tagged) > 1:
            tagged.sort(key=_by_sample_then_rule)  # stable: a step's own findings keep their order
        return [f for _, _, f in tagged]

    def already_seen(self, t: float, event: Event) -> bool:
        """Whether the event's key, as its state was restored, had folded in an event at ``t`` or
        later: true of an event read again after a restart that the saved state already holds
        (the worker's replay check). The restored time, not the key's time now: events read
        again in another order than the first time must not hide one another."""
        key = event.key if type(event) is RunEvent else event.resource_id  # type: ignore[union-attr]
        if key not in self._keys:
            self._load(key)
        restored = self._restored_t.get(key)
        if restored is None:
            return False
        kinds, last_t = restored
        # Per kind: one topic can run ahead of another for the same key (a caught-up partition
        # does not wait), so the key's latest time may be past events of another kind that
        # were read, stored and still held when the state was saved. A snapshot from before
        # kinds were kept has only the key's time.
        return t <= (kinds.get(_KIND[type(event)], -math.inf) if kinds else last_t)

    def may_have_seen(self, keys: Iterable[str]) -> bool:
        """Whether :meth:`already_seen` could be true of an event of one of ``keys`` (each an event's
        ``key``, which is the key it asks of), or would load one's state first: false when every one
        is held and none was restored after a restart, and the worker's replay check asks nothing."""
        held, restored = self._keys, self._restored_t
        return any(key not in held or key in restored for key in keys)

    def _step_failed(self, detector: Detector[Any], key: str, event: Event, exc: Exception, events: int = 1) -> None:
        """A detector raised on an event: the event is skipped for that rule (the same in the
        worker and in backtest; a ``step_scrape`` that raises skips its scrape, ``events`` samples), counted,
        and logged once per rule and error type, so a hostile
        or unforeseen event can neither stop detection nor flood the log."""
        if self._count_failure(detector, exc, events, "step"):
            log.error("detector_error", rule=detector.name, type=detector.type, key=key,
                      error=f"{type(exc).__name__}: {exc}",
                      sample=msgspec.json.encode(event)[:500].decode("utf-8", "replace"))  # fmt: skip

    def _count_failure(self, detector: Detector[Any] | BatchPhase, exc: Exception, skipped: int, phase: str) -> bool:
        """Count ``skipped`` events or deferred items of ``detector``'s rule as failed (``detector_errors``);
        true the first time this rule fails in this phase with this error type: what is logged."""
        name = detector.name
        self.errors[name] = self.errors.get(name, 0) + skipped
        first = (name, phase, type(exc)) not in self._errors_logged
        self._errors_logged.add((name, phase, type(exc)))
        return first

    def _advance(self, ahead: dict[str, float]) -> None:
        """Move the watermark to the time reached by ``min(3, n)`` of the ``n`` keys past it;
        keep the (at most two) keys still past it for the next batch."""
        k = min(_WATERMARK_KEYS, len(ahead))
        watermark = heapq.nlargest(k, ahead.values())[-1] if k > 1 else max(ahead.values())
        self.watermark = watermark
        self._ahead = {key: t for key, t in ahead.items() if t > watermark}

    def _end_batch(self) -> list[Finding]:
        """The batch phase: each detector judges what its steps deferred in this batch, together
        (the anomaly rule: one model call per group, not per event), detectors in the order
        they first deferred."""
        deferred, self._deferred = self._deferred, []
        by_detector: dict[int, tuple[BatchPhase, list[Any]]] = {}
        for detector, item in deferred:
            by_detector.setdefault(id(detector), (detector, []))[1].append(item)
        found: list[Finding] = []
        for detector, items in by_detector.values():
            try:
                found.extend(detector.end_batch(items))
            except Exception as exc:  # noqa: BLE001 - as a step's: one rule's batch phase must not stop the rest
                # What its steps deferred in the batch is skipped for that rule, counted and logged once per
                # rule and error type, as a step's error is; the other rules' findings stand (raised, it
                # would stop the worker at every restart on the same batch).
                if self._count_failure(detector, exc, len(items), "batch"):
                    log.error("detector_batch_error", rule=detector.name, type=detector.type, deferred=len(items),
                              error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        return found

    @staticmethod
    def _start(state: KeyState, detector: Detector[Any], slot: int) -> Any:
        """A lazy rule's first state on the key, in its slot (the tuple of states is replaced)."""
        rule_state = detector.new_state()
        states = state.states
        state.states = (*states[:slot], rule_state, *states[slot + 1 :])
        return rule_state

    def _others(self, state: KeyState, t: float) -> Behaviour:
        """The most unusual behaviour the key's rules are tracking at ``t`` (a lazy rule with no state: none).
        None while the resource is unknown (samples read before its first usage event): its rules are
        then every candidate as written, not those that apply to it (an inference endpoint's idle samples
        would count as an idle host's pause until its usage says what it is, only where read first)."""
        if not state.info.known:
            return Behaviour.NONE
        names, states = state.names, state.states
        tracked = self._tracked.get(id(names))
        if tracked is None or tracked[0] is not names:  # (a few layouts per rule set: see _names)
            trackers = self._trackers  # the rules in force now (a reload swaps them)
            tracked = (names, tuple((i, trackers[name]) for i, name in enumerate(names) if name in trackers))
            if len(self._tracked) >= _MAX_LAYOUTS:
                self._tracked.clear()
            self._tracked[id(names)] = tracked
        most = Behaviour.NONE
        for slot, tracking in tracked[1]:
            rule_state = states[slot]
            if rule_state is not None:
                said = tracking(rule_state, t)
                if said > most:
                    if said is Behaviour.PAUSE:
                        return said  # (the most there is)
                    most = said
        return most

    def _route(self, state: KeyState, event_type: type) -> Plan:
        """The plan of the detectors that see this event type, with the slot of each one's state in the
        key's states (made where missing; None for a :attr:`~detector.detectors.base.DetectorBase.lazy`
        rule, made by its first event that needs one): of the rules whose match passes, each with the
        params its overrides give this resource; every candidate rule as written while the resource is unknown
        (no usage event yet). Cached until the resource changes or the rules are reloaded (the hot loop
        then does no lookups per detector), an unknown resource's too: its first usage event is a change
        (:meth:`_update_info`), and a key that never sends one (a run's project, a host that only a
        metrics bridge without an instance type reports) would otherwise make its plan at every event."""
        info = state.info
        candidates = [r for r in self.ruleset.rules if event_type in r.consumes]
        candidates.sort(key=_listens)  # (stable) a rule that asks what the others track steps after them
        if info.known:
            detectors = [r.for_resource(info) for r in candidates if r.matches(info)]
            live = {r.detector.name for r in self.ruleset.rules if r.matches(info)}
            if not live.issuperset(state.names):
                pairs = list(zip(state.names, state.states, strict=True))
                gone = [(rule.detector, s) for n, s in pairs if n not in live and (rule := self.ruleset.by_name(n))]
                self._end_dropped(info.resource_id, info, gone, RULE_NO_LONGER_APPLIES)
                kept = [(n, s) for n, s in pairs if n in live]
                self._set_rules(state, [n for n, _ in kept], [s for _, s in kept])
        else:
            detectors = [r.detector for r in candidates]
        missing = [d for d in detectors if d.name not in state.names]
        if missing:  # appended: the slots of the routes made already stay as they are
            self._set_rules(state, [*state.names, *(d.name for d in missing)],
                            [*state.states, *(None if d.lazy else d.new_state() for d in missing)])  # fmt: skip
        names = state.names
        signature = (names, tuple(detectors))
        plan = self._plans.get(signature)
        if plan is None:  # bound methods made once per plan, shared by every key's routes
            plan = self._plans[signature] = tuple((d.step, d.step_scrape, d, names.index(d.name)) for d in detectors)
        if event_type is GpuMetric:
            state.gpu_route = plan
        elif event_type is UsageEvent:
            state.usage_route = plan
        else:
            state.run_route = plan
        return plan

    def _set_rules(self, state: KeyState, names: list[str], states: list[Any]) -> None:
        """Give the key these rules' states, ``names`` as the tuple shared by every key with the same
        rules. A rule dropped moves the slots of those after it: the key's routes are made again."""
        if not set(names).issuperset(state.names):
            state.clear_routes()
        state.names = self._names(tuple(names))
        state.states = tuple(states)

    def _names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """One tuple per distinct sequence of rule names (a few per rule set), interned strings."""
        shared = self._layouts.get(names)
        if shared is None:
            shared = self._layouts[names] = tuple(map(_intern, names))
        return shared

    def resource(self, resource_id: str) -> ResourceInfo | None:
        """What is known of a resource (for detectors that look across keys, as a run's hosts):
        held by this engine, else from :attr:`directory` as of the run event's time (another
        worker holds it)."""
        state = self._keys.get(resource_id)
        if state is None and resource_id in self._evicted:
            state = self._load(resource_id)  # as if it had stayed: what it said last, not the directory's
        if state is not None and state.info.known:
            return state.info
        if self.directory is not None:
            return self.directory(resource_id, self._run_t)
        return None

    def _update_info(self, state: KeyState, ev: UsageEvent) -> None:
        """Keep the key's :class:`ResourceInfo` as its newest usage event says, priced. Each field is
        compared once (this runs for every usage event); only what changed is taken, interned: a
        million resources share a few dozen types, regions, accounts and tag sets instead of holding
        a copy each. A change of what routes the key's rules (its kind, owner tags, account, region,
        type, or the first interval) clears its routes."""
        info = state.info
        tags = self.billed.fill_tags(ev.resource_id, ev.tags) if self.billed is not None else ev.tags
        changed = not info.state  # (the first usage interval: nothing was known)
        if ev.resource_type != info.resource_type:
            info.resource_type = _intern(ev.resource_type)
            changed = True
        if ev.provider != info.provider:
            info.provider = _intern(ev.provider)
        if ev.account != info.account:
            info.account = _intern(ev.account)
            changed = True
        if ev.region != info.region:
            info.region = _intern(ev.region)
            changed = True
        if ev.instance_type != info.instance_type:
            info.instance_type = _intern(ev.instance_type)
            changed = True
        if ev.pricing != info.pricing:
            info.pricing = _intern(ev.pricing)
        if ev.state != info.state:
            info.state = _intern(ev.state)
        if tags != info.tags:  # (or the tags as written beside the keys the rules name: compared as completed)
            shared = self._shared_tags(tags)
            if shared != info.tags:
                info.tags = shared
                changed = True
        pricer = self.pricer
        usd, rate = pricer.interval(ev)
        listed = pricer.pricing.instances.get(ev.instance_type) if ev.instance_type else None
        info.gpus = listed.gpus if listed is not None else 0
        held = info.interval_usd  # (a price equal to the one held, of its type and not a zero, is kept as held)
        if usd != held or not usd or type(usd) is not type(held):
            info.interval_usd = self._shared_price(usd)
        held_rate = info.usd_per_hour
        if rate is not None and (rate != held_rate or not rate or type(rate) is not type(held_rate)):
            info.usd_per_hour = self._shared_price(rate)
        if changed:
            state.clear_routes()

    def _late_info(self, state: KeyState, ev: UsageEvent) -> ResourceInfo:
        """What a late usage event (no newer than the key's newest) says of its resource, priced, for
        its own rules' steps: a copy of the key's info updated by it, so a stop read late is a stop and
        an interval's dollars are its own, while the key's info stays what its newest usage said (the
        billing state and price its other events read, as in time order). Late events alone pay the copy."""
        scratch = KeyState(msgspec.structs.replace(state.info))
        self._update_info(scratch, ev)
        return scratch.info

    def _shared_price(self, usd: float) -> float:
        """One float object per distinct price (bounded like :meth:`_shared_tags`); a zero keeps its
        sign, as it came (0.0 and -0.0 are one key of a dict), and a price that is not a float (an event
        built in Python) stays itself (2 and 2.0 are one key too)."""
        if not usd or type(usd) is not float:
            return usd
        shared = self._prices.get(usd)
        if shared is None:
            if len(self._prices) >= _MAX_PRICES:
                self._prices.clear()
            shared = self._prices[usd] = usd
        return shared

    def _shared_tags(self, tags: dict[str, str]) -> dict[str, str]:
        """One dict per distinct tag set, its strings interned (never mutated: replaced on change).
        The table is bounded: past ``_MAX_TAG_SETS`` sets it starts afresh."""
        if not tags:
            return _NO_TAGS
        items = tuple(tags.items())
        shared = self._tags.get(items)
        if shared is None:
            if len(self._tags) >= _MAX_TAG_SETS:
                self._tags.clear()
            completed = self._tag_names.complete(tags)
            shared = self._tags[items] = {_intern(k): _intern(v) for k, v in completed.items()}
        return shared

    def set_billed(self, billed: BilledRates | None) -> None:
        """Price and tag from a newer bill (the worker, after ``burnwatch ingest focus``)."""
        self.billed = billed
        self.pricer = Pricer(self.ruleset.pricing, billed, say=True)

    def set_ruleset(self, ruleset: RuleSet) -> None:
        """Swap rules in place (hot reload). Open episodes of rules that remain continue
        with the new params; state of rules removed, or whose type changed, is dropped, the episodes
        open in it resolved (``reason: rule_removed``, handed on with the next batch's findings) on the
        keys held in memory. (A key evicted, or loaded at assignment and not heard from, has its
        state read with the rules it comes back to, a removed rule's dropped unread: the worker resolves
        its alert from the alert side, as those of a rule removed while it was down,
        :mod:`detector.orphaned_alerts`. Those of keys whose partitions move before the next batch are
        the next holder's, :meth:`forget_all`.)"""
        before = {r.detector.name: r for r in self.ruleset.rules}
        after = {r.detector.name: r for r in ruleset.rules}
        for key, state in self._keys.items():
            gone = []
            for name, rule_state in zip(state.names, state.states, strict=True):
                rule, old = after.get(name), before.get(name)
                if old is not None and (rule is None or rule.detector.type != old.detector.type):
                    gone.append((old.detector, rule_state))
            if gone:
                self._end_dropped(key, state.info, gone, RULE_REMOVED)
                self.dirty.add(key)  # saved without the rule's state, with the batch that stores the resolutions
        self.ruleset = ruleset
        self.pricer = Pricer(ruleset.pricing, self.billed, say=True)
        if (names := ruleset.tag_names) != self._tag_names:
            self._tag_names = names
            self._tags.clear()
            for state in self._keys.values():  # completed anew now: tags that gained nothing read as written, and
                state.info.tags = self._shared_tags(state.info.tags)  # compare equal at every later usage event
        self._trackers = _trackers(ruleset)
        self._tracked.clear()
        self._plans.clear()
        self._types.clear()
        self.carry = None  # (until the caller settles it against the newest rule set: :meth:`settle_carried`)
        for state in self._keys.values():
            state.clear_routes()
            kept = []
            for name, rule_state in zip(state.names, state.states, strict=True):
                rule, old = ruleset.by_name(name), before.get(name)
                # (a rule now of another type: its state was resolved above, and dropped, though of one class)
                if (rule is not None and (old is None or old.detector.type == rule.detector.type)
                        and (isinstance(rule_state, rule.detector.State) or (rule_state is None and rule.detector.lazy))):
                    kept.append((name, rule_state))
            if len(kept) < len(state.names):
                self._set_rules(state, [n for n, _ in kept], [s for _, s in kept])
        for key, carried in list(self._carried.items()):
            self._take_carried(key, self._keys[key], carried)

    def _take_carried(self, key: str, state: KeyState, carried: dict[str, tuple[str, msgspec.Raw]]) -> None:
        """A reload loads rules whose states the key carried: each becomes the rule's state if of its type; one of
        a rule now loaded under another type is dropped (a key holds one state a name)."""
        taken: dict[str, Any] = {}
        for name in list(carried):
            rule = self.ruleset.by_name(name)
            if rule is not None:
                saved_type, raw = carried.pop(name)
                self.dirty.add(key)  # (saved again: with the state taken, or without one not taken)
                if name not in state.names:
                    self._read_rule(key, rule, saved_type, raw, taken)
        if taken:
            self._set_rules(state, [*state.names, *taken], [*state.states, *taken.values()])
            self._flagged(key, state)
        if not carried:
            del self._carried[key]

    # -- end of data, TTL, persistence -------------------------------------------------

    def open_episodes(self) -> list[Finding]:
        """Every episode that has fired and not resolved, with its dollars so far."""
        return [f for key, state in self._keys.items() for f in self._open_in(key, state)]

    @property
    def sweep_due(self) -> bool:
        """The watermark has moved an eighth of the eviction window (of the TTL, when nothing is
        evicted) since the latest :meth:`expire`. The worker sweeps then, whatever the wall
        clock says: catching up a backlog, event time runs hundreds of times faster than wall
        time, and a sweep on a wall-clock timer alone would let every key of the hours between
        two of them stay in memory."""
        window = self.state_ttl_s
        if self.evict_after_s is not None and self._fetch is not None:
            window = min(window, self.evict_after_s)
        return self.watermark - self._swept_at >= window * _SWEEP_EVERY

    def expire(self, coming: Container[str] = frozenset()) -> list[str]:
        """Reclaim keys with no event for ``state_ttl_s`` of event time before the watermark (which
        a single future-dated event cannot move), held or evicted; return them (the worker
        deletes their saved state). Their next event would start them afresh anyway (the module's
        docstring): reclaiming changes no detection. Then :meth:`evict` what has gone quiet. A key
        that has folded in no event (``last_t`` 0: taken in by :meth:`already_seen` for events the
        worker's aligner still holds) is not quiet, nor is one in ``coming`` (the worker's aligner
        holds its next event, read in a batch that jumped event time past the key's TTL): its
        events are on their way, and the worker keeps the partition they came on."""
        self._swept_at = self.watermark
        horizon = self.watermark - self.state_ttl_s
        keys, maybe_open = self._keys, self._maybe_open
        held = [k for k, s in keys.items() if 0.0 < s.last_t < horizon and k not in coming]
        evicted = [k for k, t in self._evicted.items() if t < horizon and k not in coming]
        self.last_unread = [k for k in evicted if k in maybe_open]
        self.last_ended = [f for k in held if k in maybe_open for f in self.silent_resolutions(k, keys[k])]
        gone = held + evicted
        for key in gone:
            self.forget(key)
        self.evict(coming)
        return gone

    def ended_in(self, key: str, data: bytes) -> list[Finding]:
        """The resolutions of the episodes left open in a saved state of ``key`` (:meth:`snapshot`
        bytes) that is reclaimed past its TTL without being loaded: an evicted key
        (:attr:`last_unread`), or one a worker loaded at assignment and never heard from. The key is
        not held afterwards."""
        held, carried = self._keys.get(key), self._carried.get(key)
        state = self.restore(key, data, restart=False)
        if held is None:
            self._keys.pop(key, None)
            self._carried.pop(key, None)
        else:
            self._keys[key] = held
            if carried:
                self._carried[key] = carried
            else:
                self._carried.pop(key, None)
        return self.silent_resolutions(key, state)

    def evict(self, coming: Container[str] = frozenset()) -> list[str]:
        """Take keys with no event for ``evict_after_s`` of event time out of memory (the worker
        has saved them: a key is evicted only once no longer :attr:`dirty`); the next event of
        one restores it through ``fetch`` as it was, so detection is the same as if it had
        stayed. Without ``fetch`` (``backtest``), nothing is evicted, nor is a key in ``coming``
        (:meth:`expire`). Returns the keys evicted."""
        self._leaving, self.last_evicted = {}, 0
        if self.evict_after_s is None or self._fetch is None:
            return []
        horizon = self.watermark - self.evict_after_s
        dirty, leaving, evicted = self.dirty, self._leaving, self._evicted
        quiet = [k for k, s in self._keys.items() if 0.0 < s.last_t < horizon and k not in dirty and k not in coming]
        for key in quiet:
            leaving[key] = self.snapshot(key)  # type: ignore[assignment]  # held: never None
            evicted[key] = self._keys.pop(key).last_t
            self._carried.pop(key, None)  # (in the snapshot: carried again when the key comes back)
        self.last_evicted = len(quiet)
        return quiet

    @property
    def evicted(self) -> int:
        """Keys saved in the store and out of memory (:meth:`evict`)."""
        return len(self._evicted)

    def forget(self, key: str) -> None:
        """Drop a key from memory (after expiry, or when its partition moves away)."""
        self._keys.pop(key, None)
        self._restored_t.pop(key, None)
        self._evicted.pop(key, None)
        self._leaving.pop(key, None)
        self._read_ahead.pop(key, None)
        self._carried.pop(key, None)
        self._maybe_open.discard(key)
        self.dirty.discard(key)

    def forget_all(self) -> None:
        """Drop every key (partitions moved), and the watermark their times made: the keys of the
        partitions taken over next may be days behind it (a partition that lagged), and sweeps by
        it would reclaim them, and their saved states, within their TTL. It is made again from the
        new keys' times (0 till then: no sweep reclaims anything, the digest waits)."""
        self._keys.clear()
        self._restored_t.clear()
        self._evicted.clear()
        self._leaving.clear()
        self._read_ahead = {}
        self._carried.clear()
        self.carry = None  # (the partitions taken over next: a newer rule set may be recorded since)
        self._maybe_open.clear()
        self._pending = []  # a reload's resolutions of keys no longer here: not this worker's to post
        self.dirty.clear()
        self._ahead.clear()
        self.watermark = 0.0
        self._swept_at = -math.inf

    def snapshot(self, key: str) -> bytes | None:
        """The key's state as bytes, for a changelog-backed table."""
        state = self._keys.get(key)
        if state is None:
            return None
        rules = state.rules
        types: msgspec.Raw | dict[str, str] = self._types_of(state.names)
        carried = self._carried.get(key)
        if carried:
            types = {**self._loaded_types(state.names), **{n: t for n, (t, _) in carried.items() if t}}
            rules.update((name, raw) for name, (_, raw) in carried.items())
        return self._encoder.encode(
            {"v": _SNAPSHOT_VERSION, "info": state.info, "rules": rules, "last_t": state.last_t,
             "kind_t": state.kind_t, "types": types}
        )

    def _loaded_types(self, names: tuple[str, ...]) -> dict[str, str]:
        """Rule name → type of these rules (a key's: all loaded, since :meth:`set_ruleset` drops the others')."""
        return {name: rule.detector.type for name in names if (rule := self.ruleset.by_name(name)) is not None}

    def _types_of(self, names: tuple[str, ...]) -> msgspec.Raw:
        """:meth:`_loaded_types`, encoded once a layout until the rules change."""
        types = self._types.get(names)
        if types is None:
            types = self._types[names] = msgspec.Raw(self._encoder.encode(self._loaded_types(names)))
        return types

    def latest_time(self, key: str) -> float:
        """The time of the key's latest event folded in (0: none, or the key is not held): saved
        beside its snapshot, so a worker that loads it can reclaim it past the TTL unread."""
        state = self._keys.get(key)
        return state.last_t if state is not None else 0.0

    def restore(self, key: str, data: bytes, *, restart: bool = True) -> KeyState:
        """Rebuild a key's state from :meth:`snapshot` bytes. The state of a rule not loaded is carried into its
        snapshots if a newer rule set may have it (:attr:`carry`), else dropped; one saved by a rule of the name of
        another type is dropped.
        ``restart``: after a restart or handover, so events read again are checked
        (:meth:`already_seen`); not for a key coming back from eviction, which saw no restart."""
        try:
            snap = self._decoder.decode(data)
        except msgspec.DecodeError as exc:  # raised out of the batch, it made the worker exit at every start
            self._unreadable(key, "", exc)
            state = self._keys[key] = KeyState(info=ResourceInfo(resource_id=key))
            self._carried.pop(key, None)
            return state
        rules: dict[str, Any] = {}
        carried: dict[str, tuple[str, msgspec.Raw]] = {}
        saved_types = snap.types
        for name, raw in snap.rules.items():
            rule = self.ruleset.by_name(name)
            saved_type = saved_types.get(name, "")
            if rule is None:
                if self._carries(name, saved_type):
                    carried[name] = (saved_type, raw.copy())  # (a view of ``data``: it kept the whole snapshot alive)
            else:
                self._read_rule(key, rule, saved_type, raw, rules)
        info = snap.info
        info.resource_id = key
        info.resource_type, info.provider, info.account, info.region, info.instance_type, info.pricing, info.state = (
            _intern(info.resource_type), _intern(info.provider), _intern(info.account), _intern(info.region),
            _intern(info.instance_type), _intern(info.pricing), _intern(info.state))  # fmt: skip
        info.tags = self._shared_tags(info.tags)
        state = KeyState(info=snap.info, names=self._names(tuple(rules)), states=tuple(rules.values()),
                         last_t=snap.last_t, kind_t=snap.kind_t)  # fmt: skip
        self._keys[key] = state
        if carried:
            self._carried[key] = carried
        else:
            self._carried.pop(key, None)
        if restart:
            self._restored_t[key] = (dict(snap.kind_t), snap.last_t)
        return state

    def _read_rule(self, key: str, rule: CompiledRule, saved_type: str, raw: msgspec.Raw, into: dict[str, Any]) -> None:
        """Read a loaded rule's saved state (of ``saved_type``, '' if not saved) into ``into``, unless it is another
        type's (not this rule's: its open alert is an orphan's, resolved as one) or unreadable (started afresh)."""
        name, detector = rule.detector.name, rule.detector
        if saved_type and saved_type != detector.type:
            return
        if detector.lazy and bytes(raw) == _NIL:
            into[name] = None  # a lazy rule that had nothing to track (an eager one's nil is refused below)
            return
        try:
            into[name] = read_state(raw, type(detector.new_state()))  # or as saved before
        except msgspec.DecodeError as exc:
            self._unreadable(key, name, exc)  # the rule's state shape changed with a new version: start it afresh

    def _carries(self, name: str, saved_type: str) -> bool:
        """A saved state of rule ``name`` (of ``saved_type``, '' if not saved), which this engine does not load, is
        carried (:attr:`carry`)."""
        carry = self.carry
        if carry is None:
            return True
        known = carry.get(name)
        return known is not None and (not saved_type or saved_type == known)

    def settle_carried(self, carry: Mapping[str, str]) -> list[str]:
        """Say which rules' states not loaded here are carried from now on (:attr:`carry`: a newer rule set's), and
        drop the carried states of any other (a rule removed: its states carried while that was not yet known).
        Returns the keys that dropped one, marked dirty: saved again without it, so that a rule put back does not
        find an episode whose incident was resolved for its removal (:mod:`detector.orphaned_alerts`)."""
        self.carry = dict(carry)
        dropped = []
        for key, carried in list(self._carried.items()):
            kept = {name: entry for name, entry in carried.items() if self._carries(name, entry[0])}
            if len(kept) < len(carried):
                dropped.append(key)
                self.dirty.add(key)
                if kept:
                    self._carried[key] = kept
                else:
                    del self._carried[key]
        return dropped

    def evicted_among(self, keys: Iterable[str]) -> list[str]:
        """The keys among ``keys`` this engine evicted (saved, out of memory), just left ones included."""
        return [k for k in keys if k in self._evicted]

    def rewrite(self, snapshots: Mapping[str, bytes], dropped: Mapping[str, AbstractSet[str]] | None = None) -> None:
        """Bring these keys, not held (evicted, or loaded at an assignment and not heard from), into memory from
        their saved states under the rules in force, which drop the states of rules no longer loaded, and mark
        them dirty: saved again with the next write without those states. A rule removed and put back must not
        find an episode left open in a state saved before its removal, whose incident was resolved for the
        removal (:mod:`detector.orphaned_alerts`): it would go on under that resolved id, unseen. ``dropped``:
        key → the rules whose states go too though a rule of that name is loaded (now of another type, whose
        state the restore may read as its own: idle_gpu's and stuck_gpu's are of one class), as
        :meth:`set_ruleset` drops a held key's. A held key is left (its states were dropped by
        :meth:`set_ruleset`); an evicted one's state just left is taken as it left (:meth:`evict`), before the
        store's."""
        for key, data in snapshots.items():
            if key in self._keys:
                continue
            evicted = self._evicted.pop(key, None) is not None
            data = self._leaving.pop(key) if key in self._leaving else data
            self._read_ahead.pop(key, None)
            state = self.restore(key, data, restart=not evicted)
            gone = dropped.get(key) if dropped else None
            if gone and not gone.isdisjoint(state.names):
                kept = [(name, rule_state) for name, rule_state in zip(state.names, state.states, strict=True)
                        if name not in gone]  # fmt: skip
                self._set_rules(state, [name for name, _ in kept], [rule_state for _, rule_state in kept])
            self._flagged(key, state)
            self.dirty.add(key)

    def _flagged(self, key: str, state: KeyState) -> KeyState:
        """A restored key, known to :meth:`may_be_open` if its state holds an open episode."""
        if self._open_in(key, state):
            self._maybe_open.add(key)
        return state

    def _unreadable(self, key: str, rule: str, exc: Exception) -> None:
        """Count a saved state of ``rule`` ('' : the whole snapshot) that is started afresh, unread; log the
        first of each, so that an upgrade's or a rollback's lost state says so without a line per key."""
        self.unreadable[rule] = count = self.unreadable.get(rule, 0) + 1
        if count == 1:
            log.warning("saved_state_unreadable", key=key, rule=rule or None, error=f"{type(exc).__name__}: {exc}",
                        note=("the rule's" if rule else "the key's") + " state was saved in a shape this release "
                             "cannot read (another release's): started afresh; further keys alike are not logged")  # fmt: skip

    def unread(self, keys: Iterable[str]) -> list[str]:
        """The keys among ``keys`` whose first event would read their state from the store, one
        look-up each: evicted, and not still held as just left (:meth:`evict`). The worker reads
        them together, off the event loop, and hands them over with :meth:`read_ahead`."""
        if not self._evicted or self._fetch is None:
            return []
        evicted, leaving = self._evicted, self._leaving
        return [key for key in keys if key in evicted and key not in leaving]

    def read_ahead(self, snapshots: dict[str, bytes | None]) -> None:
        """The saved states of keys :meth:`unread` named (None: the store has none), for their
        first event to take instead of a look-up; replaces what an earlier batch left untaken."""
        self._read_ahead = snapshots

    def _load(self, key: str) -> KeyState:
        if key in self._evicted and self._fetch is not None:
            del self._evicted[key]
            data = self._leaving.pop(key, None)
            if data is None:
                ahead = self._read_ahead
                data = ahead.pop(key) if key in ahead else self._fetch(key)
            if data is not None:
                return self._flagged(key, self.restore(key, data, restart=False))
            log.error("evicted_state_missing", key=key, note="not in the store: the key starts afresh")
        if self._loader is not None:
            data = self._loader(key)
            if data is not None:
                return self._flagged(key, self.restore(key, data))
        state = self._keys[key] = KeyState(info=ResourceInfo(resource_id=key))
        return state
