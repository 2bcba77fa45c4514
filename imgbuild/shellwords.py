"""The words of a job script: the user's own (a UserWord: only its $VAR / ${VAR} may expand when the job starts)
and imgbuild's (which may hold a command substitution it wrote, such as `$(id -u)`), each quoted for the shell."""

from __future__ import annotations

import re
import shlex

#: A word whose only expansions are variables ($VAR, ${VAR}): double-quoted, so the job's own variables expand;
#: a backslash escape stays one (`\$(id -u)` reaches the container as `$(id -u)`, for the container's own
#: shell). Anything else the job's shell would run or expand ($(...), $((...)), `...`, ${VAR:-$(...)}) is
#: quoted literally.
VARIABLES_ONLY = re.compile(r'(?:[^$"`\\]|\\[\s\S]|\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\}))*')


class UserWord(str):
    """A word the user typed (the job's command): only its $VAR / ${VAR} may expand when the job starts."""


def shell_words(words: list[str]) -> str:
    """Shell words; $VARS stay expandable (they are the job's own variables) inside double quotes, so a value
    with a space ($PWD) stays one word; the rest is quoted. imgbuild's own words may hold a command
    substitution it wrote ($(id -u)); a UserWord never runs one."""
    out = []
    for word in words:
        if isinstance(word, UserWord):
            if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", word):
                out.append(str(word))
            elif "$" in word and VARIABLES_ONLY.fullmatch(word):
                out.append(f'"{word}"')
            else:
                out.append(shlex.quote(word))
        elif re.fullmatch(r"[\w@%+=:,./-][\w@%+=:,./#-]*", word):  # '#' starts a comment only at a word's start
            out.append(word)
        elif "$" in word and '"' not in word and "`" not in word:
            out.append(f'"{word}"')
        else:
            out.append(shlex.quote(word))
    return " ".join(out)
