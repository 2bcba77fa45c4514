"""Terminal output: live progress on a terminal, one line per step elsewhere (CI logs), tables."""

from __future__ import annotations

import time
from typing import Any


class Progress:
    """Shows the current step and elapsed time; on a non-terminal prints each new step once."""

    def __init__(self, title: str, enabled: bool = True):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.title = title
        self.start = time.monotonic()
        self.enabled = enabled
        self._status: Any = None
        self._last = ""

    def __enter__(self) -> Progress:
        if self.enabled and self.console.is_terminal:
            self._status = self.console.status(self.title)
            self._status.__enter__()
        elif self.enabled:
            self.console.print(self.title, highlight=False, markup=False, soft_wrap=True)
        return self

    def __call__(self, step: str) -> None:
        if not self.enabled or step == self._last:
            return
        self._last = step
        elapsed = time.monotonic() - self.start
        step = " ".join(step.split())
        text = f"[{elapsed:6.1f}s] {step[:110] + ('...' if len(step) > 110 else '')}"
        if self._status is not None:
            self._status.update(f"{self.title} {text}")
        else:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def note(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def __exit__(self, *exc: Any) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


def print_table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    # Off a terminal (CI logs, pipes) nothing wraps: one row per line, greppable.
    wide = not console.is_terminal
    table = Table(title=title, box=None, header_style="bold", pad_edge=False, title_justify="left")
    for i, col in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(col, no_wrap=wide or not last, overflow="ignore" if wide else "fold")
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    if wide:
        console = Console(width=1000, highlight=False)
    console.print(table, crop=False, soft_wrap=wide)
