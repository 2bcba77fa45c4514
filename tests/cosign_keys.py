"""Key pairs in cosign's format, written here because `cosign generate-key-pair` cannot run on this machine
(no cosign in Debian 12): an ECDSA P-256 key as PKCS#8 DER, sealed with nacl/secretbox under a key scrypt
derives from the password, in cosign's JSON, PEM-armoured; the public key as a PEM SubjectPublicKeyInfo.
A wrong format here would show at once: skopeo (containers/image, cosign's own code) verifies the signatures
made with these keys in tests/test_attest.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import nacl.secret
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def write_key_pair(folder: Path, password: bytes, name: str = "cosign") -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    salt, nonce = os.urandom(32), os.urandom(24)
    n, r, p = 32768, 8, 1
    secret = hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=32, maxmem=64 * 2**20)
    sealed = nacl.secret.SecretBox(secret).encrypt(der, nonce).ciphertext
    document = {
        "kdf": {"name": "scrypt", "params": {"N": n, "r": r, "p": p}, "salt": base64.b64encode(salt).decode()},
        "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
        "ciphertext": base64.b64encode(sealed).decode(),
    }
    body = base64.encodebytes(json.dumps(document).encode()).decode()
    private = folder / f"{name}.key"
    private.write_text(
        f"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\n{body}-----END ENCRYPTED COSIGN PRIVATE KEY-----\n"
    )
    private.chmod(0o600)
    public = folder / f"{name}.pub"
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
