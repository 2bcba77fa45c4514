"""What a credential looks like, by its variable's name or its own shape: one home for every check that keeps
tokens, keys and webhook URLs out of images, histories, messages and contexts (recipe fields, interpolated
values, requirements lines, what `init` copies from a project, config errors).

Shapes come from a maintained detector set, Yelp's detect-secrets: the patterns of its regex plugins (AWS, Azure
storage keys, basic-auth URLs, GitHub, GitLab, npm, OpenAI, private keys, PyPI, Slack, Stripe, Twilio, ...) are
shipped as data (credential_shapes.json, written from the installed package by tests/credential_shapes.py and
kept current by a test), so checking a recipe imports neither it nor the HTTP library its plugins load. Beside
them: the issuers it does not know yet, and names by words that need no separator (`PGPASSWORD`, `SSHPASS`).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources

#: Words that say "credential" anywhere in a variable's name, with or without a separator (libpq's PGPASSWORD,
#: sshpass's SSHPASS, ngrok's NGROK_AUTHTOKEN, Azure's AZURE_STORAGE_CONNECTION_STRING); the short ones (KEY,
#: SAS, PAT, ...) only as a whole word or a name's end, so MONKEYPATCH and PATH stay plain.
SECRET_NAME_RE = re.compile(
    r"TOKEN(?!IZ)|SECRET|PASSW|(?<!BY)(?<!COM)(?<!SUR)PASS(?!THROUGH|AGE|ENGER)|AUTH(?!OR)|CREDENTIAL|PRIVATE|CONN(?:ECTION)?_?STR"
    r"|COOKIE|WEBHOOK|HOOK_?URL|SIGNING|JWT"
    r"|(?:^|_)(?:PAT|OTP|PWD|SSH|SID|SAS|DSN|SESSION|KEYS?)(?:_|$)|(?:KEY|KEYS|SAS)$",
    re.IGNORECASE,
)


def secret_name(name: str) -> bool:
    """Whether a variable called `name` would hold a credential."""
    return bool(SECRET_NAME_RE.search(name))


#: Issuers' published token prefixes that detect-secrets does not know (or knows in one length only): NVIDIA NGC
#: personal keys, Docker Hub PATs, Google API keys, Replicate, Hugging Face, GitHub fine-grained PATs, GitLab's
#: token kinds, Slack, OpenAI-style `sk-`, npm, PyPI, AWS, Databricks; Azure SAS signatures; incoming-webhook URLs
#: (Slack, Discord, Teams), whose path is the secret.
ISSUER_RE = re.compile(
    r"\bnvapi-[A-Za-z0-9_-]{16,}|\bdckr_(?:pat|oat)_[A-Za-z0-9_-]{16,}|\bAIza[0-9A-Za-z_-]{30,}"
    r"|\br8_[A-Za-z0-9]{20,}|\bhf_[A-Za-z0-9]{20,}|\bapi_org_[A-Za-z0-9]{20,}"
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bgl(?:pat|cbt|dt|rt|soat|ptt|ft|imt|agent)-[A-Za-z0-9_-]{16,}|\bxox[abpors]-[A-Za-z0-9-]{10,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b|\bnpm_[A-Za-z0-9]{30,}|\bpypi-[A-Za-z0-9_-]{40,}"
    r"|\bdapi[0-9a-f]{32}\b|[?&]sig=[A-Za-z0-9%+/=]{20,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|hooks\.slack\.com/(?:services|workflows)/|discord(?:app)?\.com/api/webhooks/|\.webhook\.office\.com/"
)
#: A JSON Web Token: base64url header (`{"` encodes as `eyJ`), payload and signature.
JWT_RE = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{2,}")
#: A secret-named variable given a literal in text (`PGPASSWORD=hunter2`, `export TOKEN: abc`): the value is in the
#: text, whatever it looks like. A reference (`$TOKEN`, `${TOKEN}`) or a path (`TOKEN_FILE=/run/secrets/t`) is not.
_ASSIGNMENT_RE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*[=:]\s*['\"]?([^\s'\"$/][^\s'\"]{3,})")
#: A URL's user information (`scheme://USER[:PASSWORD]@host`): a password there is a credential whatever it looks
#: like, and so is a user name as long as a token (GitHub's 40-hex OAuth tokens, Sentry's DSN keys and any PAT are
#: handed to git and HTTP clients as the URL's user); a short name (`git@`, `oauth2@`, `x-access-token@`) is not.
_URL_USERINFO_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/\s?#@'\"]+)@")
TOKEN_USER_CHARS = 16
#: A command-line option named for a credential and handed a literal (`--password hunter2`, `--api-token=abc`,
#: `-p`-less forms are the assignments above), and the user:password pair of curl's and wget's `-u`/`--user`.
_OPTION_RE = re.compile(r"(?<![\w-])--?([A-Za-z][A-Za-z0-9_-]*)(?:=|\s+)['\"]?([^\s'\"$/-][^\s'\"]{3,})")
_OPTION_NAME_RE = re.compile(
    r"(?:^|[_-])(?:pass(?:word|wd|phrase)?|token|secret|(?:api|access|secret)[_-]?key|pat)$", re.I
)
_USER_PAIR_RE = re.compile(r"(?<![\w-])(?:-u|-U|--user|--proxy-user)(?:=|\s*)['\"]?[^\s:'\"$]+:([^\s'\"@]{4,})")
#: detect-secrets plugins that judge randomness or addresses, not credentials: a sha256 pin or a digest is random,
#: a public IP no secret. Every other regex plugin it ships is used.
NOT_CREDENTIALS = frozenset(
    {"Base64 High Entropy String", "Hex High Entropy String", "Public IP (ipv4)", "Secret Keyword"}
)


@functools.cache
def detector_shapes() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(secret type, pattern) of detect-secrets' regex detectors, as shipped in credential_shapes.json."""
    data = json.loads(resources.files("imgbuild").joinpath("credential_shapes.json").read_text())
    return tuple((kind, re.compile(pattern, flags)) for kind, pattern, flags in data["shapes"])


def credential_kind(text: str) -> str:
    """What kind of credential `text` holds ("" when none): a detector's name, never the value."""
    if not text:
        return ""
    if ISSUER_RE.search(text):
        return "an access token or key by its issuer's prefix"
    if JWT_RE.search(text):
        return "a JSON Web Token"
    return _by_place(text) or next((kind for kind, pattern in detector_shapes() if pattern.search(text)), "")


def _by_place(text: str) -> str:
    """A credential known by where it stands, whatever it looks like: assigned to a secret's name, handed to a
    password option, a user:password pair, a URL's user information."""
    for name, value in _ASSIGNMENT_RE.findall(text):
        if secret_name(name) and _literal(value):
            return f"a value given to {name}"
    for name, value in _OPTION_RE.findall(text):
        if _OPTION_NAME_RE.search(name) and _literal(value):
            return f"a value given to the option {name}"
    if any(not value.startswith("$") for value in _USER_PAIR_RE.findall(text)):
        return "a user:password pair"
    for userinfo in _URL_USERINFO_RE.findall(text):
        user, colon, password = userinfo.partition(":")
        if (colon and password and not password.startswith("$")) or len(user) >= TOKEN_USER_CHARS:
            return "a URL's user information (a password, or a token as its user)"
    return ""


def _literal(value: str) -> bool:
    """A value that is itself the secret: not a number, a flag's word or a reference."""
    return not value.isdigit() and value.lower() not in ("true", "false", "yes", "no") and not value.startswith("$")


def named_secret(name: str, value: str) -> bool:
    """A literal under a secret-named key (env, args, labels): a secret unless it is a flag, a number, a path or
    a reference."""
    plain = value.strip()
    return (
        secret_name(name)
        and len(plain) >= 6
        and not plain.startswith(("/", "$", "~", "."))
        and not plain.replace(".", "").isdigit()
    )


CREDENTIAL_REFUSAL = (
    "would be in the image and its history; pass it at run time (imgbuild run -e NAME) or as a build secret"
)
