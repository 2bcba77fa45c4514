"""One home for each identity fact: image references (Docker's grammar, whole-string) and the caller."""

from __future__ import annotations

import pytest

from imgbuild.engine.types import ContainerInfo
from imgbuild.hostio.host import Caller, caller
from imgbuild.imageref import BadReference, parse
from imgbuild.recipe import secret_variable
from imgbuild.registry_identity import registry_identity, same_registry
from imgbuild.servers.containers import check_owner, find_container

# (text, registry, repository, reference, normal form)
GOOD_REFERENCES = [
    ("ubuntu", "docker.io", "library/ubuntu", "latest", "ubuntu:latest"),
    ("ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", "ubuntu:22.04"),
    ("docker.io/library/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", "ubuntu:22.04"),
    ("alice/research:v1", "docker.io", "alice/research", "v1", "alice/research:v1"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io", "nvidia/pytorch", "24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3"),
    (
        "127.0.0.1:5000/nvidia/pytorch:24.05-py3",
        "127.0.0.1:5000",
        "nvidia/pytorch",
        "24.05-py3",
        "localhost:5000/nvidia/pytorch:24.05-py3",
    ),
    ("localhost/x", "localhost", "x", "latest", "localhost/x:latest"),
    ("a__b/c-d.e_f:T_1.x-y", "docker.io", "a__b/c-d.e_f", "T_1.x-y", "a__b/c-d.e_f:T_1.x-y"),
    (f"lab/x@sha256:{'a' * 64}", "docker.io", "lab/x", f"sha256:{'a' * 64}", f"lab/x:latest@sha256:{'a' * 64}"),
]
BAD_REFERENCES = [
    "",
    "../etc",
    "-x",
    "a/../b",
    "a//b",
    "UPPER/x",
    "x:tag\n",
    "x y",
    "x:",
    "x@sha256:abc",
    "a..b",
    "x:-tag",
    "x:" + "t" * 129,
    "a/" * 130 + "b",
    "host:99999999/x",
    "host:65536/x",
    "host:0/x",
]


@pytest.mark.parametrize("text,registry,repository,reference,normal", GOOD_REFERENCES)
def test_references_parse_like_docker(text, registry, repository, reference, normal):
    ref = parse(text)
    assert (ref.registry, ref.repository, ref.reference, ref.normal()) == (registry, repository, reference, normal)
    assert str(ref) == text


@pytest.mark.parametrize("text", BAD_REFERENCES)
def test_bad_references_are_refused_whole(text):
    with pytest.raises(BadReference):
        parse(text)


#: Spellings of one registry: case, a zero-padded or default port, Docker Hub's names, this machine's names.
SAME_REGISTRY = [
    ("REGISTRY.LAB.EXAMPLE:5000", "registry.lab.example:5000"),
    ("registry.lab.example:05000", "registry.lab.example:5000"),
    ("nvcr.io:443", "NVCR.IO"),
    ("lab.example:80", "lab.example"),
    ("index.docker.io", "docker.io"),
    ("registry-1.docker.io:443", "docker.io"),
    ("registry.hub.docker.com", "DOCKER.IO"),
    ("localhost:5000", "127.0.0.1:5000"),
    ("[::1]:5000", "localhost:05000"),
    ("LOCALHOST:5000", "127.0.0.1:5000"),
]
OTHER_REGISTRY = [
    ("registry.lab.example:5000", "registry.lab.example:5001"),
    ("registry.lab.example", "registry.lab.example:5000"),
    ("lab.example", "lab.example.org"),
    ("localhost:5000", "10.0.0.1:5000"),
    ("docker.io", "docker.io.evil.example"),
    ("host:99999", "host:99999"),  # names no registry: matches nothing, itself included
]


@pytest.mark.parametrize("a,b", SAME_REGISTRY)
def test_one_registry_by_any_spelling_is_one_identity(a, b):
    assert same_registry(a, b) and same_registry(b, a)
    if "[" not in a:  # a reference's host has no IPv6 literal (Docker's grammar)
        assert parse(f"{a}/lab/x:v1").normal() == parse(f"{b}/lab/x:v1").normal()


@pytest.mark.parametrize("a,b", OTHER_REGISTRY)
def test_other_registries_stay_apart(a, b):
    assert not same_registry(a, b)


@pytest.mark.parametrize("port", ["65536", "0", "\u0665000", "-1"])
def test_a_port_is_ascii_digits_within_range(port):
    with pytest.raises(ValueError):
        registry_identity(f"lab.example:{port}")


from hypothesis import HealthCheck, Phase, given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: A fixed seed and a small budget: the property runs in CI on two cores.
FIXED = hsettings(derandomize=True, database=None, deadline=None, max_examples=60,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
_LABEL = st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z")


def _cased(draw, text: str) -> str:
    return "".join(c.upper() if draw(st.booleans()) else c for c in text)


@st.composite
def one_registry(draw) -> tuple[list[str], bool]:
    """Two or more spellings the engine sends to one registry (host, port), and whether a reference may carry them
    (Docker's grammar has no brackets and no other script)."""
    kind = draw(st.sampled_from(["name", "loopback", "hub", "ipv6", "idna"]))
    port = draw(st.one_of(st.none(), st.integers(1, 65535)))
    if kind == "loopback":
        hosts = ["localhost", "LOCALHOST", "127.0.0.1", f"127.{draw(st.integers(0, 255))}.0.1", "127.1",
                 "0x7f.0.0.1", "0.0.0.0", "[::1]", "[0:0:0:0:0:0:0:1]", "[::]", "[::ffff:127.0.0.1]", "localhost."]  # fmt: skip
    elif kind == "hub":
        hosts, port = ["docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"], None
    elif kind == "ipv6":
        address = draw(st.ip_addresses(v=6).filter(lambda a: a.ipv4_mapped is None and not a.is_loopback
                                                   and not a.is_unspecified))  # fmt: skip
        hosts = [f"[{address.compressed}]", f"[{address.exploded.upper()}]"]
    elif kind == "idna":
        hosts = ["xn--bcher-kva.example", "bücher.example", "BÜCHER.EXAMPLE."]
    else:
        name = ".".join(draw(st.lists(_LABEL, min_size=2, max_size=3)))
        hosts = [name, f"{name}.", _cased(draw, name)]
    spellings = []
    for host in hosts:
        if port is None:
            spellings.append(host + draw(st.sampled_from(["", ":443"])))
        else:
            spellings.append(f"{host}:{'0' * draw(st.integers(0, 2))}{port}")
    legal = kind in ("name", "hub", "loopback")
    return [_cased(draw, s) if kind != "idna" else s for s in spellings], legal


@FIXED
@given(drawn=one_registry(), data=st.data())
def test_spellings_the_engine_sends_to_one_registry_are_one_identity_to_every_checker(drawn, data):
    from imgbuild.pipeline.targets import target_refusal
    from imgbuild.registry.auth import credentials_for, plain_http
    from imgbuild.servers.admission import under_prefix
    from tests.support import settings

    spellings, legal = drawn
    a, b = data.draw(st.sampled_from(spellings)), data.draw(st.sampled_from(spellings))
    assert registry_identity(a) == registry_identity(b) and same_registry(a, b) and same_registry(b, a)
    site = settings(ngc_registry=b, insecure_registries=[b], ngc_api_key="nvapi-test")
    assert plain_http(a, site) and plain_http(b, site)  # the same answer for both spellings
    assert credentials_for(a, site).username == "$oauthtoken"
    # Docker's grammar: a host is a first part with a "." or a ":", or `localhost` as written; no brackets, no
    # trailing dot
    refs = [
        f"{s}/lab/x:v1"
        for s in (a, b)
        if "[" not in s and ("." in s or ":" in s or s == "localhost") and not s.split(":")[0].endswith(".")
    ]
    if legal and len(refs) == 2:
        assert parse(refs[0]).normal() == parse(refs[1]).normal()
        assert under_prefix(parse(refs[0]), f"{b}/lab") == under_prefix(parse(refs[1]), f"{b}/lab")
        assert target_refusal(f"{a.split('/')[0]}/nvidia/pytorch:24.05-py3", "ubuntu:22.04", b) is not None


def _host_comparisons(path):
    """Lines of `path` that compare a registry or host by its spelling (==, !=, in, not in)."""
    import ast
    import re

    hostish = re.compile(r"(?:^|_)(?:host|hosts|hostname|netloc|registry|registries)$", re.IGNORECASE)

    def named(node):
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Call | ast.Subscript):
            return named(node.func if isinstance(node, ast.Call) else node.value)
        return ""

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops)
            and any(hostish.search(named(side)) for side in (node.left, *node.comparators))
        ):
            yield f"{path}:{node.lineno}: {ast.unparse(node)[:100]}"


def test_registries_are_compared_by_their_identity_only():
    """Any comparison of a host or registry by its spelling outside the identity module is a second rule that a
    second spelling (capitals, :05000, :443, 127.0.0.1 for localhost) passes."""
    from pathlib import Path

    import imgbuild

    root = Path(imgbuild.__file__).parent
    exempt = {
        root / "registry_identity.py",  # the rule itself
        # exact spellings that fail closed: a redirect off the host asked drops the credentials (the key and plain
        # HTTP go by identity, for_host)
        root / "registry" / "client.py",
    }
    found = [
        line
        for path in sorted(root.rglob("*.py"))
        if path not in exempt and root / "payload" not in path.parents  # payload runs inside images, without imgbuild
        for line in _host_comparisons(path)
    ]
    assert not found, "\n".join(found)


def test_the_source_scan_finds_a_comparison_by_spelling(tmp_path):
    code = tmp_path / "m.py"
    code.write_text("def f(ref, settings):\n    return ref.registry == settings.ngc_registry\n")
    assert [line.split(": ", 1)[1] for line in _host_comparisons(code)] == ["ref.registry == settings.ngc_registry"]


# (environment as root, expected caller)
CALLERS = [
    ({"SUDO_UID": "4321", "SUDO_GID": "99", "SUDO_USER": "alice"}, ("alice", 4321, 99, True)),
    ({"SUDO_UID": "4321", "SUDO_USER": "Alice Smith"}, ("uid4321", 4321, 4321, True)),  # not a usable name
    ({"SUDO_UID": "not-a-number", "SUDO_USER": "mallory"}, ("root", 0, 0, False)),
    ({}, ("root", 0, 0, False)),
]


@pytest.mark.parametrize("environ,expected", CALLERS)
def test_the_caller_is_the_sudo_user_never_a_flag(environ, expected, monkeypatch):
    import os

    monkeypatch.setattr(os, "getuid", lambda: 0)  # the cases describe root, whoever runs the tests
    monkeypatch.setattr(os, "getgid", lambda: 0)
    who = caller(environ)
    assert (who.name, who.uid, who.gid, who.via_sudo) == expected


ROWS = [
    ContainerInfo("alice_train_1", user="alice"),
    ContainerInfo("alice_train_2", user="alice"),
    ContainerInfo("bob_eval_1", user="bob"),
    ContainerInfo("stray", user="stray"),
]


def test_find_container_by_short_name():
    assert find_container(ROWS, "eval", "bob").name == "bob_eval_1"
    assert find_container(ROWS, "alice_train_2", "bob").name == "alice_train_2"  # found, not yet allowed
    with pytest.raises(Exception, match="matches alice_train_1, alice_train_2"):
        find_container(ROWS, "train", "alice")


# (row, caller, force, allowed)
OWNERSHIP = [
    (ROWS[2], Caller("bob", 1001, 1001), False, True),
    (ROWS[2], Caller("alice", 1000, 1000), False, False),
    (ROWS[2], Caller("alice", 1000, 1000), True, None),  # --force is root's: allowed only when euid is 0
    (ROWS[3], Caller("bob", 1001, 1001), False, False),
]


@pytest.mark.parametrize("row,who,force,allowed", OWNERSHIP)
def test_one_ownership_rule_for_every_verb(row, who, force, allowed):
    import os

    if allowed is None:
        allowed = os.geteuid() == 0
    for verb in ("attach", "logs", "exec", "stop"):
        if allowed:
            check_owner(row, who, verb, force)
        else:
            with pytest.raises(Exception, match="belongs to"):
                check_owner(row, who, verb, force)


# (name, value, configured secrets, is a secret)
SECRET_VARIABLES = [
    ("NGC_API_KEY", "x", (), True),
    ("IMGBUILD_PIP_INDEX_URL", "https://pypi.org/simple", (), True),
    ("HF_TOKEN", "hf_x", (), True),
    ("WANDB_API_KEY", "x", (), True),
    ("DB_PASSWORD", "x", (), True),
    ("AWS_SECRET_ACCESS_KEY", "x", (), True),
    ("MIRROR", "https://u:p@mirror.example/simple", (), True),
    ("COPY_OF_KEY", "prefix-nvapi-123456-suffix", ("nvapi-123456",), True),
    # secret-looking names and values beyond the ones imgbuild knew
    ("DEPLOY_KEY", "x", (), True),
    ("SSH_KEY", "x", (), True),
    ("GITHUB_PAT", "x", (), True),
    ("SLACK_WEBHOOK_URL", "https://example.org", (), True),
    ("SENTRY_DSN", "https://example.org/1", (), True),
    ("SESSION_COOKIE", "x", (), True),
    ("GPG_PASSPHRASE", "x", (), True),
    ("NOTE", "ghp_" + "a" * 36, (), True),
    ("NOTE", "github_pat_" + "a" * 40, (), True),
    ("NOTE", "glpat-" + "a" * 20, (), True),
    ("NOTE", "glcbt-" + "a" * 20, (), True),
    ("NOTE", "hf_" + "a" * 34, (), True),
    ("NOTE", "xoxb-1234-5678-abcdefghij", (), True),
    ("NOTE", "sk-" + "a" * 40, (), True),
    ("NOTE", "AKIA" + "A" * 16, (), True),
    ("NOTE", "npm_" + "a" * 36, (), True),
    ("NOTE", "pypi-" + "a" * 60, (), True),
    ("NOTE", "-----BEGIN OPENSSH PRIVATE KEY-----", (), True),
    ("NOTE", "https://hooks.slack.com/services/T0/B0/x", (), True),
    ("NOTE", "https://discord.com/api/webhooks/1/x", (), True),
    ("CUDA_ARCH", "8.0", (), False),
    ("SORT_ORDER", "task-scheduler-with-a-long-name", (), False),
    ("NOTE", "ghp_short", (), False),
    ("KEYBOARD_LAYOUT", "us", (), False),
    ("TOKENIZERS_PARALLELISM", "false", (), False),
    ("PASSAGE_LEN", "512", (), False),
    ("MIRROR", "https://mirror.example/simple", (), False),
]


@pytest.mark.parametrize("name,value,secrets,expected", SECRET_VARIABLES)
def test_which_variables_hold_secrets(name, value, secrets, expected):
    assert secret_variable(name, value, secrets) is expected


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "--json"],
        ["render", "--offline", "--stdout", "recipes/pytorch-research.yaml"],
        ["run", "--dry-run", "--gpus", "none", "ubuntu:22.04", "true"],
        ["queue", "ls", "--json"],
    ],
    ids=["config", "render", "run", "queue"],
)
def test_a_command_line_reads_the_caller_once_and_hands_it_down(argv, capsys):
    """Who runs imgbuild is read once, at the entry point, and flows (settings.caller, the group's object): no
    module below asks the password database or the sudo variables again."""
    import sys

    from imgbuild.cli import main
    from imgbuild.hostio import host

    reads: list[str] = []
    target = host.caller.__code__

    def count(frame, event, arg):
        if event == "call" and frame.f_code is target:
            reads.append(frame.f_back.f_code.co_qualname if frame.f_back else "?")

    sys.setprofile(count)
    try:
        with pytest.raises(SystemExit) as ended:
            main(list(argv))
    finally:
        sys.setprofile(None)
    assert ended.value.code == 0, capsys.readouterr().err
    assert reads == ["guarded"], reads  # the frame every imgbuild process runs in
