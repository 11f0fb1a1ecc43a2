"""Hot reload of rule files: the worker picks up edits without a restart.

A change that fails validation is refused as a whole: the rules in force stay, and
the refusal carries every error (file, line, path) for the log.
"""

from __future__ import annotations

from pathlib import Path

from detector.rules import RuleSet, RulesInvalid, load_rules

__all__ = ["RulesWatcher"]


class RulesWatcher:
    def __init__(self, path: str | Path, current: RuleSet) -> None:
        self.path = Path(path)
        self.current = current
        self.refused: RulesInvalid | None = None
        """The errors of the files on disk while they are refused (the rules in force are older ones, and a
        worker started now would refuse to start); None once a valid edit loads."""
        self._stamp = self._fingerprint()

    def _fingerprint(self) -> tuple:
        if self.path.is_dir():
            files = sorted(self.path.glob("*.y*ml"))
        else:
            files = [self.path, *(self.path.parent / name for name in ("pricing.yaml", "routing.yaml", "limits.yaml"))]
        stamp = []
        for file in files:
            try:
                info = file.stat()
            except OSError:
                continue
            stamp.append((str(file), info.st_mtime_ns, info.st_size))
        return tuple(stamp)

    def poll(self) -> tuple[RuleSet | None, RulesInvalid | None]:
        """(new rules, None) after a valid change; (None, errors) after an invalid one, the
        rules in force unchanged; (None, None) when nothing changed."""
        stamp = self._fingerprint()
        if stamp == self._stamp:
            return None, None
        self._stamp = stamp
        try:
            ruleset = load_rules(self.path)
        except RulesInvalid as exc:
            self.refused = exc
            return None, exc
        self.current, self.refused = ruleset, None
        return ruleset, None
