"""What a credential looks like, by its variable's name or its own shape: one home for every check that keeps
tokens, keys and webhook URLs out of images, histories, messages and contexts (recipe interpolation, recipe
fields, config errors)."""

from __future__ import annotations

import re

#: Names that say "credential" in any CI system's dialect.
SECRET_NAME_RE = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|API_?KEY|APIKEY|CREDENTIALS?|"
    r"PRIVATE_KEY|AUTH|AUTH_CONFIG|JWT|ID_TOKEN|"
    r"KEY|KEYS|PAT|SSH|WEBHOOK|WEBHOOK_URL|HOOK_URL|DSN|COOKIE|SESSION|SIGNING|CERT_KEY|PASSPHRASE|OTP)(?:_|$)",
    re.IGNORECASE,
)
#: Values that are credentials whatever their variable is called: personal access tokens and API keys by their
#: issuers' published prefixes (GitHub, GitLab, Hugging Face, Slack, OpenAI-style, AWS access keys, npm, PyPI),
#: private keys in PEM, and incoming-webhook URLs (Slack, Discord, Teams), whose path is the secret.
SECRET_VALUE_RE = re.compile(
    r"(?:\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bglpat-[A-Za-z0-9_-]{16,}"
    r"|\bgl(?:cbt|dt|rt|soat|ptt)-[A-Za-z0-9_-]{16,}|\bhf_[A-Za-z0-9]{20,}|\bxox[abpors]-[A-Za-z0-9-]{10,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b|\bnpm_[A-Za-z0-9]{30,}|\bpypi-[A-Za-z0-9_-]{40,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|hooks\.slack\.com/(?:services|workflows)/|discord(?:app)?\.com/api/webhooks/|\.webhook\.office\.com/)"
)


#: A JSON Web Token: base64url header (`{"` encodes as `eyJ`), payload and signature.
JWT_RE = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{2,}")


def refuse_credential(value: str) -> str:
    """A recipe field's rule: a token, private key or webhook URL by its shape ends in the image or its history;
    refused, never shown."""
    if SECRET_VALUE_RE.search(value) or JWT_RE.search(value):
        raise ValueError(
            "holds what looks like a credential (an access token, a private key or a webhook URL): it would be "
            "in the image and its history; pass it at run time (imgbuild run -e NAME) or as a build secret"
        )
    return value
