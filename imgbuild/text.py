"""What untrusted text may hold, in one place: refused by Unicode category, not by a list of bad bytes.

Free text (a description, an env value, a `run:` command) is one line a reviewer reads as it runs: no control
character (Cc, C0 and C1, so no newline, NUL, ESC or NEL; a TAB only where a field allows it), no format
character (Cf: the bidirectional controls of "Trojan Source", which make a reviewer see other text than what
runs, and the invisible ones: zero-width spaces, word joiners, tag characters), no surrogate, private-use or
unassigned code point, no line or paragraph separator (Zl, Zp). Text that reaches a pip file or a URL is a token: ASCII,
no white space at all (pip splits option lines on it: a TAB in an index URL became `-r /etc/passwd`).
"""

from __future__ import annotations

import unicodedata

#: What free text may not hold, by Unicode category: controls (Cc), format characters (Cf: the bidi controls,
#: zero-width spaces and joiners, U+2060 WORD JOINER, U+FEFF, the tag characters that hide text from a reader),
#: surrogates (Cs, not text), private-use and unassigned code points (Co, Cn: no reader can know what they show),
#: line and paragraph separators (Zl, Zp).
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def unsafe_character(value: str, allow_tab: bool = False) -> str | None:
    """The first character free text may not hold, or None."""
    for char in value:
        if char == "\t" and allow_tab:
            continue
        if unicodedata.category(char) in REFUSED_CATEGORIES:
            return char
    return None


def printable(text: str, limit: int = 300) -> str:
    """`text` with every character a terminal could take for a command removed, cut at `limit`: for showing a line
    someone else wrote (a build's, a resolver's) in a progress line."""
    return "".join(ch for ch in text if ch.isprintable())[:limit]


def describe(char: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`: a character named for a message, never printed as itself."""
    return f"U+{ord(char):04X} {unicodedata.name(char, 'control character')}"


def token_fault(value: str) -> str:
    """Why `value` cannot be a token of a pip file or a URL (ASCII, printable, no white space), or ""."""
    for char in value:
        if not char.isascii():
            return f"a non-ASCII character ({describe(char)}); write the host in its ASCII (punycode) form"
        if char.isspace() or not char.isprintable():
            return f"white space or a control character ({describe(char)})"
    return ""
