"""PostgreSQL's array text form (``array_out``), read into a list of element texts.

Owns the grammar pgoutput sends arrays in: ``{a,"b c",NULL,""}`` with double-quoted
elements (backslash escapes) and unquoted ``NULL``. Only one-dimensional arrays with the
default lower bound are read: a nested array (``{{1,2},{3,4}}``) or one with explicit
bounds (``[0:1]={1,2}``) raises ValueError, so its row becomes a dead letter - Debezium
writes such a column as a list of nulls, losing the values (docs/table-cdc.md, types).

Pure; must not do I/O.
"""

from __future__ import annotations

__all__ = ["parse_array", "quoted"]


def quoted(text: str, pos: int) -> tuple[str, int]:
    """The double-quoted string at ``text[pos]`` (backslash escapes), and the position after
    it (IndexError when it is not closed) - array elements' and hstore's quoting."""
    chars: list[str] = []
    pos += 1
    while text[pos] != '"':
        if text[pos] == "\\":
            pos += 1
        chars.append(text[pos])
        pos += 1
    return "".join(chars), pos + 1


def parse_array(text: str) -> list[str | None]:
    """The elements of a one-dimensional array's text, None for NULL; ValueError else."""
    if not text.startswith("{") or not text.endswith("}"):
        raise ValueError(f"array with explicit bounds or not an array: {text[:40]!r}")
    body = text[1:-1]
    if not body:
        return []
    elements: list[str | None] = []
    pos, end = 0, len(body)
    while True:
        if body[pos] == "{":
            raise ValueError("a multi-dimensional array (Debezium writes it as nulls)")
        if body[pos] == '"':
            element, pos = quoted(body, pos)
            elements.append(element)
        else:
            comma = body.find(",", pos)
            stop = end if comma < 0 else comma
            word = body[pos:stop]
            elements.append(None if word.upper() == "NULL" else word)
            pos = stop
        if pos >= end:
            return elements
        if body[pos] != ",":
            raise ValueError(f"malformed array text near {body[pos:pos + 20]!r}")
        pos += 1
