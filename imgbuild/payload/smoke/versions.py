"""Version strings as NGC writes them: the public part, the same release, a prefix that agrees."""

from __future__ import annotations

import re


def _public(version: str) -> list:
    text = str(version).strip().lstrip("vV")
    return text.split("+", 1)


def same_version(have: str, want: str) -> bool:
    """A framework's version against the one its base declares, public versions only: NGC's env says
    `2.9.0a0+145a3a7` where torch says `2.9.0a0+145a3a7bda.nv25.10`, PyPI's `2.13.0+cu130` where the metadata
    says `2.13.0`, so the local part proves nothing. `v1.10.2` (a leading v is not part of it) and `2.12.*`
    (a prefix) are read as written."""
    have_public, want_public = _public(have)[0], _public(want)[0]
    if want_public.endswith("*"):
        return have_public.startswith(want_public[:-1])
    return have_public == want_public


def normal_version(version: str) -> str:
    """A version as pip writes it (PEP 440's normal form, as far as these strings need): lower case, no
    leading v, the local part's separators as dots and its numbers without leading zeros, so the metadata's
    `2.6.0a0+ecf3bae40a.nv25.01` and pip's `2.6.0a0+ecf3bae40a.nv25.1` are one version."""
    public, _, local = str(version).strip().lower().lstrip("v").partition("+")
    if not local:
        return public
    parts = [str(int(p)) if p.isdigit() and p.isascii() else p for p in re.split(r"[._-]", local)]
    return public + "+" + ".".join(parts)


def version_prefix_agrees(have: str, want: str, parts: int) -> bool:
    """`13.0` against CUDA_VERSION `13.0.96`: the first `parts` numbers agree."""
    return str(have).split(".")[:parts] == str(want).split(".")[:parts]
