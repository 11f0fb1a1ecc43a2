"""The documented contract is the one the decoder enforces."""

from __future__ import annotations

import json
import re

import pytest

from detector.events import TOPICS, EventDecoder
from detector.schemas import topic_schema
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "events.md").read_text()


@pytest.mark.parametrize("topic", TOPICS)
def test_committed_schemas_match_the_decoder(topic):
    committed = json.loads((ROOT / "docs" / "schemas" / f"{topic}.schema.json").read_text())
    assert committed == topic_schema(topic), "run: python -m detector.schemas docs/schemas"


@pytest.mark.parametrize("topic", TOPICS)
def test_documented_example_decodes(topic):
    section = DOC.split(f"## `{topic}`")[1]
    example = re.search(r"```json\n(.*?)\n```", section, re.S).group(1)
    events = EventDecoder().decode(topic, example.encode())
    assert events and all(e.ts.tzinfo is not None for e in events)
