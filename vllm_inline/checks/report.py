"""The table of ``python -m vllm_inline check``: rows with a status, rendered as text."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

__all__ = ["Report", "Row", "shorten"]


@dataclass
class Row:
    """One line of the table."""

    name: str
    """What was checked."""
    status: str
    """``"ok"``, ``"warn"``, ``"fail"`` or ``"info"``."""
    value: str
    """What was found."""
    detail: str = ""
    """More lines: why it matters, what to do."""


@dataclass
class Report:
    """The check's result: rows, plus text blocks (the rendered prompt) shown under the table."""

    model: str
    """The model checked."""
    rows: list[Row] = field(default_factory=list)
    """The table, in order."""
    blocks: dict[str, str] = field(default_factory=dict)
    """Titled text shown after the table."""

    def add(self, name: str, status: str, value: str, detail: str = "") -> Row:
        """Append a row and return it."""
        row = Row(name, status, value, detail)
        self.rows.append(row)
        return row

    @property
    def passed(self) -> bool:
        """True when no row failed."""
        return not any(r.status == "fail" for r in self.rows)

    def render(self, width: int = 110) -> str:
        """The table as text, then the blocks, then the verdict."""
        name_w = max([len(r.name) for r in self.rows] + [4])
        lines = [f"vllm-inline check: {self.model}", ""]
        indent = " " * (6 + name_w + 2)
        for r in self.rows:
            head = f"{r.status.upper():<4}  {r.name:<{name_w}}  "
            body = textwrap.wrap(r.value, width - len(head)) or [""]
            lines.append(head + body[0])
            lines.extend(indent + b for b in body[1:])
            for para in r.detail.splitlines():
                lines.extend(
                    textwrap.wrap(para, width, initial_indent=indent, subsequent_indent=indent)
                )
        for title, text in self.blocks.items():
            lines += ["", f"-- {title} --", text]
        fails = sum(r.status == "fail" for r in self.rows)
        lines += ["", "PASSED" if self.passed else f"FAILED ({fails} row(s) failed)"]
        return "\n".join(lines)


def shorten(text: str, n: int = 80) -> str:
    """``repr(text)``, cut to ``n`` characters."""
    shown = repr(text)
    return shown if len(shown) <= n else shown[: n - 3] + "..."
