"""Text someone else wrote, made safe for where imgbuild writes it: one function per target, each the only one.

- a terminal: no character a terminal acts on (C0/C1 controls, ESC sequences), no format or bidi character that
  makes the screen show other text than was written, no lone surrogate;
- rich: that, and no `[...]` taken for markup (Docker 20.10's `executor failed running [/bin/sh -c ...]` raised
  MarkupError and lost the table);
- a CI log read by GitHub Actions: no line that starts a workflow command (`::error::`, `::stop-commands::`, the
  older `##[command]` anywhere in a line);
- XML 1.0: only the characters XML 1.0 allows (no lone surrogate, no U+FFFE/U+FFFF, no control but TAB, LF, CR),
  then `&`, `<`, `>` and quotes escaped.

A character that may not be written is replaced by U+FFFD, never dropped: a reader sees that something was there.
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape as _xml_escape
from xml.sax.saxutils import quoteattr as _xml_quoteattr

REPLACEMENT = "\ufffd"

#: What XML 1.0 forbids (its `Char` production, inverted).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
#: GitHub's runner reads a line as a workflow command where it starts with `::` (after white space); a line a
#: terminal or a table wraps may start anywhere in the text, so no `::` is left anywhere.
_DOUBLE_COLON = re.compile(r":(?=:)")


def terminal(text: str) -> str:
    """`text` with every character a terminal could act on, or that shows as other text, replaced (a TAB is a
    space; a newline stays a newline)."""
    return "".join(" " if ch == "\t" else ch if ch == "\n" or ch.isprintable() else REPLACEMENT for ch in str(text))


def rich(text: str) -> str:
    """`text` for rich's markup (a table's cell, a status line): terminal-safe, and no `[...]` read as a style."""
    from rich.markup import escape as markup_escape

    return markup_escape(terminal(text))


def ci_log(text: str) -> str:
    """`text` for a log GitHub Actions reads: no line of it, however wrapped, starts a workflow command (each `::`
    is written `: :`), and no `##[` (the runner's older command form, read anywhere in a line) stays whole."""
    return _DOUBLE_COLON.sub(": ", text).replace("##[", "# #[")


def xml_text(text: str) -> str:
    """`text` as the content of an XML 1.0 element."""
    return _xml_escape(_NOT_XML.sub(REPLACEMENT, str(text)))


def xml_attr(text: str) -> str:
    """`text` as a quoted XML 1.0 attribute value, quotes included."""
    return _xml_quoteattr(_NOT_XML.sub(REPLACEMENT, str(text)))
