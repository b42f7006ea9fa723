"""Writes a benchmark's markdown section into a docs file: the text between its begin and end
markers is replaced, or the section is appended when the file has no such markers yet."""
from __future__ import annotations

import os


def write_section(path: str, begin: str, end: str, section: str) -> None:
    """`section` starts with `begin` and ends with `end` (a benchmark's whole report)."""
    old = open(path).read() if os.path.exists(path) else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        new = (old.rstrip("\n") + "\n\n" if old.strip() else "") + section
    with open(path, "w") as f:
        f.write(new)
