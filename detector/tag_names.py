"""Tag keys as the configuration spells them, whatever case a fleet writes them in.

Rules and routing name tags in lower case (``team``, ``project``, ``owner``: ``routing.yaml``'s ``by_tag`` and
``owner_tag``, ``untagged``'s ``required_tags``), and the store's reports read ``team``. AWS's own examples
and many fleets write ``Team``, ``Project``, ``Owner``; a Cost and Usage Report exports them as ``user:Team``. Read
as written, every resource of such a fleet was untagged (an alert each on day one), its alerts went to the default
channel and its waste to no team. So a resource's tags gain the configured spelling of a key that differs from one
only in case (or by CUR's ``user:`` prefix), beside the key as written, unless the configured key is there already.
The store keeps tags as written, and its rollups and reports read them the same way (:func:`stored_tag`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_NAMES", "TagNames", "fold", "stored_tag", "tag_value"]

DEFAULT_NAMES = ("team", "project", "owner")
"""Read by the store's reports and the digest whatever the rules say."""


class TagNames:
    """The configured tag keys, and how a resource's tags are completed with them."""

    def __init__(self, names: Iterable[str] = DEFAULT_NAMES) -> None:
        self.names = frozenset(n for n in (*DEFAULT_NAMES, *names) if n)
        self._by_folded: dict[str, tuple[str, ...]] = {}
        """A key as compared → every configured spelling of it (``routing``'s ``Team`` beside the store's ``team``)."""
        for name in sorted(self.names):
            self._by_folded[fold(name)] = (*self._by_folded.get(fold(name), ()), name)

    def complete(self, tags: Mapping[str, str]) -> dict[str, str]:
        """``tags`` with each configured spelling of a key that folds to one (``Team`` → ``team``; with ``by_tag:
        Team``, ``team`` → ``Team`` too) whose configured key is absent or empty; the keys as written are kept.
        A key written in a configured spelling is read first, then the first other one written."""
        names = self.names
        extra: dict[str, str] = {}
        for configured in (True, False):
            for key, value in tags.items():
                if not value or (key in names) is not configured:
                    continue
                for name in self._by_folded.get(fold(key), ()):
                    if name != key and not tags.get(name) and name not in extra:
                        extra[name] = value
        return {**tags, **extra} if extra else dict(tags)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TagNames) and other.names == self.names

    __hash__ = None  # type: ignore[assignment]


def tag_value(tags: Mapping[str, str], name: str) -> str:
    """The value of tag ``name`` (a lower-case key) in ``tags`` as written: the key itself if not empty, else the
    first non-empty key that folds to it (``Owner``, ``user:OWNER``), as :func:`stored_tag` reads it in SQL. For
    what is read from an event's tags before they are completed (a run event's owner in its alert's details)."""
    value = tags.get(name)
    if value:
        return value
    return next((v for k, v in tags.items() if v and fold(k) == name), "")


def stored_tag(name: str, column: str = "tags") -> str:
    """A ClickHouse expression for the value of tag ``name`` (a lower-case key, as the store's reports name
    them) in the Map ``column`` as it was written: the key itself if not empty, else the first non-empty key
    that folds to it (``Team``, ``TEAM``, ``user:Team``), as :meth:`TagNames.complete` reads an event's tags.
    The stored events and the bill keep their tags as written, so the rollups and reports read them so."""
    if name != fold(name) or not name.isidentifier():
        raise ValueError(f"stored_tag: {name!r} is not a lower-case tag name")
    key = f"{column}['{name}']"
    return (f"if({key} != '', {key}, arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN "
            f"('{name}', 'user:{name}'), {column}))))")


def fold(key: str) -> str:
    """A key as compared: without CUR's ``user:`` prefix, in lower case (``Team``, ``user:TEAM`` → ``team``)."""
    key = key.casefold()
    return key[5:] if key.startswith("user:") else key
