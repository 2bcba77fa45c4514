"""Which registry a host names, whatever its spelling: the one place registries are compared.

Host names are case-insensitive and a name in another script is its IDNA (punycode) form; an address is the address
whatever its spelling (`127.1`, `0x7f.0.0.1`, `[::FFFF:127.0.0.1]`, `[2001:DB8:0::1]`); the engine reads a port as
a number (`:05000` is `:5000`) and reaches a registry written without one on 443 (or 80, plain HTTP); Docker Hub
answers to four names; `localhost`, every loopback address and the unspecified ones (`0.0.0.0`, `::`, which a
connection takes for this machine) are this machine. Every comparison of registries (build targets,
`run.signed_only`, the mirror's source and target, credentials and their helpers, signatures) goes through
`registry_identity`, so a second spelling of one registry is never "another registry" (a test scans the source for
any other comparison of hosts).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
#: Docker Hub's names: references, the API host and the docker CLI's login key all reach one registry.
DOCKER_HUB_ALIASES = frozenset({DOCKER_HUB, "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})
#: What `localhost` resolves to: one identity for this machine, by any of its names.
LOOPBACK = "localhost"
#: Ports a registry written without one is reached on (HTTPS, or plain HTTP for an insecure registry).
DEFAULT_PORTS = frozenset({443, 80})
MAX_PORT = 65535


@dataclass(frozen=True, order=True)
class Registry:
    """A registry's identity: its host, lower-cased with aliases folded, and its port (None: a default port)."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.port is not None else host

    @property
    def is_docker_hub(self) -> bool:
        return self.host == DOCKER_HUB and self.port is None

    @property
    def is_loopback(self) -> bool:
        return self.host == LOOPBACK


def port_number(text: str) -> int:
    """A port as the engine reads it: ASCII digits (leading zeros allowed), 1-65535; ValueError otherwise."""
    if not text or not text.isascii() or not text.isdigit():
        raise ValueError(f"not a port number: {text[:20]!r}")
    port = int(text)
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"port {port} is outside 1-{MAX_PORT}")
    return port


def split_host(text: str) -> tuple[str, str]:
    """`host[:port]` (an IPv6 literal in brackets) into host and the port as written ("" when none)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest.removeprefix(":")
    if text.count(":") > 1:  # a bare IPv6 address
        return text, ""
    host, _, port = text.partition(":")
    return host, port


def registry_identity(text: str) -> Registry:
    """The registry `text` (`host[:port]`, as a reference or a setting writes it) names. ValueError for a port
    that is not one."""
    name, port_text = split_host(text.strip().lower().rstrip("/"))
    port = port_number(port_text) if port_text else None
    if port in DEFAULT_PORTS:
        port = None
    return Registry(_host_name(name.rstrip(".")), port)


#: An IPv4 address as the C library's inet_aton reads it: one to four parts, each decimal, octal (0...) or hex (0x...).
_INET_ATON_RE = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `name` spells (an IPv4 address in any form inet_aton reads, an IPv6 one with the IPv4 it maps),
    or None for a name."""
    found: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        found = ipaddress.ip_address(name)
    except ValueError:
        found = _inet_aton(name) if _INET_ATON_RE.fullmatch(name) else None
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped
    return found


def _inet_aton(name: str) -> ipaddress.IPv4Address | None:
    parts = []
    for part in name.split("."):
        base = 16 if part.startswith("0x") else 8 if len(part) > 1 and part.startswith("0") else 10
        try:
            parts.append(int(part[2:] if base == 16 else part, base))
        except ValueError:
            return None
    *head, last = parts
    if any(p > 255 for p in head) or last >= 256 ** (4 - len(head)):
        return None
    value = sum(p << (8 * (3 - i)) for i, p in enumerate(head)) + last
    return ipaddress.IPv4Address(value)


def _host_name(name: str) -> str:
    """A host as one spelling: an address in its canonical form (this machine's as `localhost`), a name lower-cased
    in its ASCII (IDNA) form with Docker Hub's aliases folded. ValueError for a name with no IDNA form."""
    address = _address(name)
    if address is not None:
        return LOOPBACK if address.is_loopback or address.is_unspecified else address.compressed
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"not a host name: {name[:40]!r}") from None
    name = name.lower()
    return DOCKER_HUB if name in DOCKER_HUB_ALIASES else LOOPBACK if name == LOOPBACK else name


def same_registry(a: str, b: str) -> bool:
    """Whether `a` and `b` name one registry; a spelling that names none (a port past 65535) matches nothing."""
    try:
        return registry_identity(a) == registry_identity(b)
    except ValueError:
        return False


def is_loopback(text: str) -> bool:
    """Whether the registry `text` names is on this machine (plain HTTP to it is allowed)."""
    try:
        return registry_identity(text).is_loopback
    except ValueError:
        return False


def is_docker_hub(text: str) -> bool:
    try:
        return registry_identity(text).is_docker_hub
    except ValueError:
        return False
