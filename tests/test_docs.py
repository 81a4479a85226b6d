"""Docs that restate a fact of the code stay in step with it."""

from __future__ import annotations

import re
from pathlib import Path

from werk_host.protocol import CAPABILITY_OPERATIONS, CapabilityId

ROOT = Path(__file__).resolve().parents[1]


def test_protocol_doc_lists_every_capability_id_with_its_operations() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([A-Z_]+)` \| (.*) \|$", text, flags=re.M)
    documented = {cap: (member, tuple(re.findall(r"`(\w+)`", ops))) for cap, member, ops in rows}
    expected = {c.value: (c.name, CAPABILITY_OPERATIONS[c]) for c in CapabilityId}
    assert documented == expected


def test_docs_links_resolve() -> None:
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+\.md)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
