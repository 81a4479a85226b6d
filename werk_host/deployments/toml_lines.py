"""Where things are in a TOML text: the line of each table header and ``key =`` statement, so a
profile error can name the line at fault (werk_host/deployments/profile.py)."""

from __future__ import annotations

import tomllib

#: A position in the parsed document: table keys and array indexes from the root.
DocPath = tuple[str | int, ...]


def statement_lines(text: str) -> dict[DocPath, int]:
    """The first line of each table header and ``key =`` statement of valid TOML ``text``, by
    document path (``("instance", 1, "keep_alive")``); each prefix of a path maps to the first
    line that mentions it. Multi-line strings and arrays are skipped, so text inside them never
    counts as a statement."""
    lines: dict[DocPath, int] = {}
    array_tables: dict[DocPath, int] = {}
    table: DocPath = ()
    i, n, line = 0, len(text), 1

    def record(path: DocPath, at: int) -> None:
        for k in range(1, len(path) + 1):
            lines.setdefault(path[:k], at)

    while i < n:
        char = text[i]
        if char in " \t\r":
            i += 1
        elif char == "\n":
            line += 1
            i += 1
        elif char == "#":
            i = _line_end(text, i)
        elif char == "[":
            end = _line_end(text, i)
            header = text[i:end]
            keys = _key_parts(header)
            if keys is not None:
                table = _table_path(keys, header.startswith("[["), array_tables)
                record(table, line)
            i = end
        else:
            equals = _key_end(text, i)
            if equals is None:  # not valid TOML; nothing more to find
                break
            keys = _key_parts(text[i:equals] + "= 0")
            if keys is not None:
                record((*table, *keys), line)
            i, line = _skip_value(text, equals + 1, line)
    return lines


def _table_path(keys: list[str], array: bool, array_tables: dict[DocPath, int]) -> DocPath:
    """The document path of a ``[a.b]`` / ``[[a.b]]`` header, with the current index of each
    array of tables it passes through."""
    path: list[str | int] = []
    for position, key in enumerate(keys):
        path.append(key)
        so_far = tuple(path)
        if array and position == len(keys) - 1:
            array_tables[so_far] = array_tables.get(so_far, -1) + 1
            path.append(array_tables[so_far])
        elif so_far in array_tables:
            path.append(array_tables[so_far])
    return tuple(path)


def _key_parts(snippet: str) -> list[str] | None:
    """The dotted key of a header or ``key = 0`` snippet, as TOML reads it."""
    try:
        node: object = tomllib.loads(snippet)
    except tomllib.TOMLDecodeError:
        return None
    keys: list[str] = []
    while True:
        if isinstance(node, dict) and len(node) == 1:
            key, node = next(iter(node.items()))
            keys.append(key)
        elif isinstance(node, list) and len(node) == 1:
            node = node[0]
        else:
            return keys or None


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _key_end(text: str, i: int) -> int | None:
    """The index of the ``=`` ending the key that starts at ``i``."""
    n = len(text)
    while i < n:
        char = text[i]
        if char in "\"'":
            i = _string_end(text, i)
        elif char == "=":
            return i
        elif char == "\n":
            return None
        else:
            i += 1
    return None


def _string_end(text: str, i: int) -> int:
    """The index just past the string literal that starts at ``i``."""
    quote = text[i]
    n = len(text)
    if text.startswith(quote * 3, i):
        j = i + 3
        while j < n:
            if quote == '"' and text[j] == "\\":
                j += 2
            elif text.startswith(quote * 3, j):
                j += 3
                extra = 0
                while j < n and text[j] == quote and extra < 2:  # up to two quotes end the content
                    j += 1
                    extra += 1
                return j
            else:
                j += 1
        return n
    j = i + 1
    while j < n and text[j] != quote and text[j] != "\n":
        j += 2 if quote == '"' and text[j] == "\\" else 1
    return j + 1


def _skip_value(text: str, i: int, line: int) -> tuple[int, int]:
    """Past the value starting at ``i``: to the newline that ends its statement. Returns that
    index and the line number there."""
    depth = 0
    n = len(text)
    while i < n:
        char = text[i]
        if char == "\n":
            if depth <= 0:
                return i, line
            line += 1
            i += 1
        elif char == "#":
            i = _line_end(text, i)
        elif char in "\"'":
            end = _string_end(text, i)
            line += text.count("\n", i, end)
            i = end
        else:
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
            i += 1
    return i, line
