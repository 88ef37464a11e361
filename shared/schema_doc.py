"""Generate the event catalogue: every topic (key, partitions, retention) and the JSON
schema of the envelope and of each event it carries. `make schemas` writes it to
docs/events.schema.json; a test keeps the file in step with the code."""

from __future__ import annotations

import json
from typing import Any

from shared.events import EVENT_TYPES, Envelope
from shared.topics import ALL_TOPICS


def build() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Kairos events",
        "description": "Every message is an envelope whose `data` is the event named by `type`.",
        "envelope": Envelope.model_json_schema(),
        "topics": {
            t.name: {
                "key": t.key,
                "partitions": t.partitions,
                "retention_ms": t.retention_ms,
                "description": t.description,
                "events": [e.TYPE for e in t.events],
            }
            for t in ALL_TOPICS
        },
        "events": {
            name: {"schema_version": model.VERSION, "schema": model.model_json_schema()}
            for name, model in sorted(EVENT_TYPES.items())
        },
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
