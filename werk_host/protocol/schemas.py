"""Bounds on every JSON schema that may become a grammar (docs/compat.md, "Schema bounds").

A backend converts a schema it constrains generation by (``response_format`` ``json_schema``,
a tool's ``parameters`` — llama-server builds a grammar from the tools under a forced choice and
for its tool-call parser) on its own request thread before it generates anything. A large schema
costs it seconds to minutes and gigabytes; one of 20,000 properties killed llama-server and the
other keys' streams with it (issue 48, item 2). So every schema in a chat request is checked
here, at the one point every API family's request passes (:class:`werk_host.protocol.ChatRequest`:
OpenAI ``response_format`` and ``tools``, Ollama ``format``, Anthropic and Responses tools all
arrive translated), and one past a bound is a 400 naming the bound and where it was exceeded.

The figures (:data:`SCHEMA_BOUNDS`) come from ``bench/grammar_bounds.py``: what llama-server
converts in at most a second (a 1-token chat with the schema, SmolLM2-135M, 2 cores; a trivial
schema's chat takes 0.02 s). Properties cost quadratically (512: 0.44 s, 640: 0.78 s, 768:
1.0 s, 896: 1.4 s; 1,024 fails to parse); nesting, enum and pattern sizes stay under 0.06 s
to the sweep's end, so their bounds are set well inside it. The bench prints each sweep and the
time at these bounds.
"""

from __future__ import annotations

import json
from typing import Any, Final

#: The bounds, by dimension: properties across the request's schemas, values in one ``enum``,
#: characters in one ``pattern``, and the serialized schemas' bytes. Nesting needs no bound of
#: its own: 256 levels convert in 0.05 s, and a request body nests at most 64 levels deep
#: (werk_host/http/jsonbody.py).
SCHEMA_BOUNDS: Final[dict[str, int]] = {
    "properties": 640,  # 0.78 s; 768: 1.0 s, 1,024: llama-server fails to parse the grammar
    "enum": 4096,  # 0.03 s (16,384: 0.04 s)
    "pattern": 4096,  # 0.02 s for an alternation (16,384: 0.02 s)
    "size": 65536,  # the properties bound's schema is 17 KB compact; room for descriptions
}


class SchemaTooLarge(ValueError):
    """A schema past one of :data:`SCHEMA_BOUNDS`; the message names the bound."""


def _walk(node: Any, where: str, counts: dict[str, int]) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, where, counts)
        return
    if not isinstance(node, dict):
        return
    members = node.get("properties")
    if isinstance(members, dict):
        counts["properties"] += len(members)
        if counts["properties"] > SCHEMA_BOUNDS["properties"]:
            raise SchemaTooLarge(f"{where}: the schema has more than {SCHEMA_BOUNDS['properties']} properties")
    values = node.get("enum")
    if isinstance(values, list) and len(values) > SCHEMA_BOUNDS["enum"]:
        raise SchemaTooLarge(f"{where}: an enum has more than {SCHEMA_BOUNDS['enum']} values")
    expression = node.get("pattern")
    if isinstance(expression, str) and len(expression) > SCHEMA_BOUNDS["pattern"]:
        raise SchemaTooLarge(f"{where}: a pattern is longer than {SCHEMA_BOUNDS['pattern']} characters")
    for value in node.values():
        if isinstance(value, dict | list):
            _walk(value, where, counts)


def check_schemas(schemas: list[tuple[str, Any]]) -> None:
    """Raise :class:`SchemaTooLarge` when the schemas of one request, each given with where it
    is (``"tools[0].function.parameters"``), exceed a bound; the property count and the size
    are totals over the request, since the backend converts them together."""
    counts = {"properties": 0}
    size = 0
    for where, schema in schemas:
        size += len(json.dumps(schema, separators=(",", ":")))
        if size > SCHEMA_BOUNDS["size"]:
            raise SchemaTooLarge(f"{where}: the request's schemas exceed {SCHEMA_BOUNDS['size']} bytes")
        _walk(schema, where, counts)


__all__ = ["SCHEMA_BOUNDS", "SchemaTooLarge", "check_schemas"]
