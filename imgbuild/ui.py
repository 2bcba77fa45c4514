"""Terminal output: live progress on a terminal, one line per step elsewhere (CI logs), tables."""

from __future__ import annotations

import time
from typing import Any

from imgbuild import escape

#: A live line (a terminal) is cut here; a log line (CI) is kept whole, up to LOG_CHARS.
LIVE_CHARS = 110
LOG_CHARS = 4000


def ci_kind(environ: dict[str, str] | None = None) -> str:
    """The CI system this runs under, as its own variables say: "github", "gitlab" or ""."""
    import os

    env = os.environ if environ is None else environ
    if env.get("GITHUB_ACTIONS") == "true":
        return "github"
    if env.get("GITLAB_CI") == "true":
        return "gitlab"
    return ""


def for_log(text: str, environ: dict[str, str] | None = None) -> str:
    """`text` (anything someone else wrote may be in it) as a line of output: safe for a terminal, and under GitHub
    Actions no line of it a workflow command."""
    safe = escape.terminal(text)
    return escape.ci_log(safe) if ci_kind(environ) == "github" else safe


def say(text: str, err: bool = True) -> None:
    """Print `text` (lines that may hold what others wrote) as `for_log` makes it."""
    import click

    click.echo(for_log(text), err=err)


class Progress:
    """Shows the current step and a clock that keeps running on a terminal; on a non-terminal prints each new step
    once, whole, inside a folded group where the CI system has them (GitHub Actions, GitLab CI)."""

    def __init__(self, title: str, enabled: bool = True, live_only: bool = False):
        """`live_only`: a spinner with a running clock on a terminal, and nothing at all in a log (a command whose
        own output says the rest: `lock`, `smoke`)."""
        from rich.console import Console

        self.console = Console(stderr=True)
        self.title = title
        self.start = time.monotonic()
        self.enabled = enabled and (self.console.is_terminal or not live_only)
        self._status: Any = None
        self._last = ""
        self._ticker: Any = None
        self._stop: Any = None
        self._ci = ci_kind()

    def __enter__(self) -> Progress:
        import threading

        if self.enabled and self.console.is_terminal:
            self._status = self.console.status(escape.rich(self.title))
            self._status.__enter__()
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        elif self.enabled:
            self._raw(self.title, command=self._fold_open())
        return self

    def _tick(self) -> None:
        """Keep the live line's clock running while a step takes long (a smoke test, a push, a pull)."""
        while not self._stop.wait(1.0):
            if self._last:
                self._status.update(escape.rich(f"{self.title} {self._line(self._last, LIVE_CHARS)}"))

    def _line(self, step: str, limit: int) -> str:
        elapsed = time.monotonic() - self.start
        return f"[{elapsed:6.1f}s] {step[:limit] + ('...' if len(step) > limit else '')}"

    def _raw(self, text: str, command: str = "") -> None:
        """`text` as a log line (after `command`, a CI system's fold marker of imgbuild's own)."""
        self.console.print(command + for_log(text), highlight=False, markup=False, soft_wrap=True)

    def _fold_open(self) -> str:
        if self._ci == "github":
            return "::group::"
        if self._ci == "gitlab":
            return f"\x1b[0Ksection_start:{int(time.time())}:imgbuild[collapsed=true]\r\x1b[0K"
        return ""

    def _fold_close(self) -> None:
        if self._ci == "github":
            self._raw("", command="::endgroup::")
        elif self._ci == "gitlab":
            self._raw("", command=f"\x1b[0Ksection_end:{int(time.time())}:imgbuild\r\x1b[0K")

    def __call__(self, step: str) -> None:
        if not self.enabled or step == self._last:
            return
        step = " ".join(step.split())
        self._last = step
        if self._status is not None:
            self._status.update(escape.rich(f"{self.title} {self._line(step, LIVE_CHARS)}"))
        else:
            self._raw(self._line(step, LOG_CHARS))

    def note(self, text: str) -> None:
        if self.enabled:
            self._raw(text)

    def __exit__(self, *exc: Any) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._status is not None:
            self._status.__exit__(*exc)
        elif self.enabled:
            self._fold_close()


def print_table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    # Off a terminal (CI logs, pipes) nothing wraps: one row per line, greppable.
    wide = not console.is_terminal

    def cell(text: str) -> str:  # what others wrote: no markup, no control, no workflow command at a line's start
        return escape.rich(for_log(text))

    table = Table(
        title=cell(title) if title else None, box=None, header_style="bold", pad_edge=False, title_justify="left"
    )
    for i, col in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(cell(col), no_wrap=wide or not last, overflow="ignore" if wide else "fold")
    for row in rows:
        table.add_row(*[cell("" if v is None else str(v)) for v in row])
    if wide:
        console = Console(width=1000, highlight=False)
    console.print(table, crop=False, soft_wrap=wide)
