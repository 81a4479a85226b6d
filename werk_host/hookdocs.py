"""Render the hook reference of docs/plugin-hooks.md from :mod:`werk_host.hookspecs`.

The hookspec docstrings are the one source of the hook contract; this module writes them,
with each hook's signature, between the ``BEGIN``/``END`` markers of the guide. Run
``python -m werk_host.hookdocs docs/plugin-hooks.md`` after changing a hookspec; a test
fails while the file is stale.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from werk_host import hookspecs
from werk_host.pluginhost import OPERATION_HOOKS, hook_names

_ROLE = re.compile(r":\w+:`(~?)([\w.]+)`")

BEGIN = "<!-- BEGIN GENERATED: python -m werk_host.hookdocs docs/plugin-hooks.md -->"
END = "<!-- END GENERATED -->"


def _signature(name: str) -> str:
    sig = inspect.signature(getattr(hookspecs, name))
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{name}({params}) -> {sig.return_annotation}"


def hook_reference() -> str:
    """The generated section: one heading, signature and docstring per hook."""
    parts = [f"Hook API version `{hookspecs.HOOK_API_VERSION}`.", ""]
    for name in [n for n in vars(hookspecs) if n in hook_names()]:  # definition order
        operation = name in OPERATION_HOOKS
        kind = "operation hook: an adapter method, firstresult" if operation else "collected from every plugin"
        doc = inspect.cleandoc(getattr(hookspecs, name).__doc__ or "")
        doc = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", doc)
        doc = doc.replace("``", "`")
        parts += [f"### `{name}`", "", "```python", _signature(name), "```", "", f"*{kind}.*", "", doc, ""]
    return "\n".join(parts).rstrip() + "\n"


def replace_section(guide: str, begin: str, section: str) -> str:
    """``guide`` with the text between ``begin`` and :data:`END` replaced by ``section``."""
    head, sep, rest = guide.partition(begin)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError("the guide has no generated-section markers")
    return f"{head}{begin}\n{section}{END}{tail}"


def render(guide: str) -> str:
    """``guide`` with its generated section replaced by the current reference."""
    return replace_section(guide, BEGIN, hook_reference())


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/plugin-hooks.md")
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
