"""The configuration a rules reload changes, as one immutable snapshot.

A reload used to update four objects by hand (the engine's rules, the alert manager's
rules, the decoder's limits, Slack's routing), and dropping one of those lines went
unnoticed. Now a reload builds one :class:`Config` from one valid rule set and swaps it
into :class:`LiveConfig`; the pipeline reads the snapshot at the start of each batch and
hands it on (:meth:`streams.pipeline.Pipeline.configure`), so a batch is decoded,
detected, routed and rendered under one configuration, never half of an edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from detector.detectors.anomaly import Scoring, use_scoring
from detector.events import EventDecoder
from detector.reload import RulesWatcher
from detector.rules import Routing, RuleSet, RulesInvalid, consistency_warnings, load_rules, unit_warnings

__all__ = ["Config", "LiveConfig"]

log = structlog.get_logger("burnwatch.config")


@dataclass(frozen=True)
class Config:
    """What the rule files say, ready to use: the rules and prices (engine, store), the routes,
    silences and realert (alert manager), the bounds on events (decoder), Slack's mentions and
    links (notifier)."""

    ruleset: RuleSet
    decoder: EventDecoder

    @classmethod
    def of(cls, ruleset: RuleSet) -> Config:
        return cls(ruleset=ruleset, decoder=EventDecoder(limits=ruleset.limits))

    @property
    def routing(self) -> Routing:
        return self.ruleset.routing


class LiveConfig:
    """The snapshot in force. :meth:`reload` replaces it whole after a valid edit of the rule
    files; readers take :attr:`current` once per unit of work and never see a mix. The anomaly
    rules of every snapshot score with one :attr:`scoring`, so a model reload (which swaps its
    scorer) and a rules reload never undo each other."""

    def __init__(self, config: Config, rules_path: str | Path | None = None) -> None:
        self.scoring = Scoring()
        """The anomaly model in use (:mod:`streams.timers` swaps its scorer)."""
        use_scoring(config.ruleset.rules, self.scoring)
        self.current = config
        self._watcher = RulesWatcher(rules_path, config.ruleset) if rules_path is not None else None

    @classmethod
    def load(cls, rules_path: str | Path) -> LiveConfig:
        """The rule files' configuration, watched for edits (:class:`RulesInvalid` if invalid)."""
        ruleset = load_rules(rules_path)
        _warn_inconsistent(ruleset, rules_path)
        return cls(Config.of(ruleset), rules_path)

    @property
    def refused(self) -> RulesInvalid | None:
        """The errors of the rule files on disk while the worker refuses them (``/healthz``, ``/metrics``)."""
        return self._watcher.refused if self._watcher is not None else None

    def reload(self) -> tuple[Config | None, RulesInvalid | None]:
        """Blocking (files): (the new snapshot, None) after a valid edit, now current;
        (None, every error) after an invalid one, the snapshot in force kept; (None, None)
        when nothing changed."""
        if self._watcher is None:
            return None, None
        ruleset, refused = self._watcher.poll()
        if ruleset is None:
            return None, refused
        _warn_inconsistent(ruleset, self._watcher.path)
        use_scoring(ruleset.rules, self.scoring)  # before any batch can read the new snapshot
        self.current = Config.of(ruleset)
        return self.current, None


def _warn_inconsistent(ruleset: RuleSet, path: str | Path) -> None:
    """Rules valid one by one that price wrong together, and numbers written without the unit a person may mean
    (``burnwatch rules check`` says the same)."""
    for warning in consistency_warnings(ruleset):
        log.warning("rules_inconsistent", path=str(path), warning=warning)
    for warning in unit_warnings(path):
        log.warning("rules_unit_unsaid", path=str(path), warning=warning)
