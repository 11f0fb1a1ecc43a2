"""JSON Schemas of the three input topics, derived from the event structs.

``python -m detector.schemas docs/schemas`` writes them; a test keeps the
committed files equal to what the code accepts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from detector.events import _TYPES, TOPICS

__all__ = ["topic_schema", "write_schemas"]


def topic_schema(topic: str) -> dict[str, Any]:
    """The schema of one message value: an event object or an array of them."""
    cls = _TYPES[topic]
    event = msgspec.json.schema(cls)["$defs"][cls.__name__]
    event["properties"].pop("extra", None)
    event["additionalProperties"] = True  # unknown fields are kept, never rejected
    event["properties"]["ts"]["description"] = (
        "RFC 3339 event time with a zone, e.g. 2026-11-02T08:00:00Z; from 1970-01-01 to 2200-01-01 and at "
        "most a day ahead of the worker's clock"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"burnwatch/{topic}.schema.json",
        "title": f"burnwatch {topic} message value",
        "description": f"{event.pop('description', '')} A message holds one event or an array of events.",
        "oneOf": [{"$ref": "#/$defs/event"}, {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/event"}}],
        "$defs": {"event": event},
    }


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for topic in TOPICS:
        path = directory / f"{topic}.schema.json"
        path.write_text(json.dumps(topic_schema(topic), indent=2) + "\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_schemas(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
        print(written)
