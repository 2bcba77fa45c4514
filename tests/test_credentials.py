"""A credential is known by its variable's name (no separator needed) or its shape (detect-secrets' detectors and
the issuers they lack), and refused in every recipe text that reaches the image, its history or its context."""

from __future__ import annotations

import pytest

from imgbuild.credentials import credential_kind, secret_name
from imgbuild.errors import RecipeError
from imgbuild.recipe import load_recipe
from tests.support import RECIPE_HEAD

#: One value of each shape: issuers' prefixes, a basic-auth URL, an assignment, a PEM key, a JWT, cloud keys.
SECRETS = {
    "NGC personal key": "nvapi-" + "Ab3" * 20,
    "Docker Hub PAT": "dckr_pat_" + "Zx9" * 9,
    "Google API key": "AIza" + "Sy" * 18,
    "Replicate token": "r8_" + "Q7" * 19,
    "Hugging Face token": "hf_" + "Kq" * 17,
    "GitHub token": "ghp_" + "Ab1" * 12,
    "GitLab token": "glpat-" + "xY3" * 7,
    "a token in a git URL": "https://oauth2:" + "t0k3n" * 4 + "@gitlab.example/team/repo.git",
    "an assignment in a command": "PGPASSWORD=correct-horse-battery",
    "Azure storage SAS": "https://acct.blob.core.windows.net/c?sv=2022-11-02&sig=" + "abcDEF123" * 4,
    "Stripe key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "AWS access key": "AKIA" + "IOSFODNN7EXAMPL1",
    "Slack webhook": "https://hooks.slack.com/services/T000/B000/XXXX",
    "a private key": "-----BEGIN OPENSSH PRIVATE KEY-----",
}
SECRET_NAMES = ["PGPASSWORD", "SSHPASS", "NGROK_AUTHTOKEN", "AZURE_STORAGE_SAS", "AZURE_STORAGE_CONNECTION_STRING",
                "NGC_API_KEY", "HF_TOKEN", "MY_SECRET", "DB_PWD", "GPG_PASSPHRASE", "OAUTH_CLIENT", "NGCKEY"]  # fmt: skip
PLAIN_NAMES = ["PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "MONKEYPATCH", "GIT_AUTHOR_NAME", "OMP_NUM_THREADS",
               "CUDA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "HOME", "NCCL_P2P_DISABLE", "BYPASS_CACHE"]  # fmt: skip
PLAIN_TEXT = [
    "pip install torch==2.3",
    "sha256:" + "a" * 64,
    "echo $HOME",
    "https://pypi.org/simple",
    "TOKEN_FILE=/run/s",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_name_needs_no_separator(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_names_are_not_secrets(name):
    assert not secret_name(name)


@pytest.mark.parametrize("kind", SECRETS)
def test_every_credential_shape_is_known(kind):
    assert credential_kind(f"see {SECRETS[kind]} here")


@pytest.mark.parametrize("text", PLAIN_TEXT)
def test_plain_text_holds_no_credential(text):
    assert credential_kind(text) == ""


#: (field, recipe text with {s} for the secret)
DOORS = [
    ("env.NOTE", "env: {{NOTE: '{s}'}}\n"),
    ("args.NOTE", "args: {{NOTE: '{s}'}}\n"),
    ("labels.note", "labels: {{note: '{s}'}}\n"),
    ("run[0]", "run: ['echo {s}']\n"),
    ("description", "description: 'uses {s}'\n"),
    ("smoke.run[0]", "smoke: {{run: ['echo {s}']}}\n"),
    ("cmd", "cmd: 'serve {s}'\n"),
    ("pip.packages[0]", "pip: ['p5 @ https://files.example/{s}/p5-1.0-py3-none-any.whl']\n"),
    ("pip.index_url", "pip: {{index_url: 'https://pkgs.example/{s}/simple'}}\n"),
]


@pytest.mark.parametrize("field, text", DOORS)
@pytest.mark.parametrize("kind", ["NGC personal key", "Docker Hub PAT", "a token in a git URL", "Replicate token"])
def test_a_credential_is_refused_at_every_text_field_and_never_shown(tmp_path, field, text, kind):
    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + text.format(s=SECRETS[kind]))
    with pytest.raises(RecipeError) as caught:
        load_recipe(tmp_path / "r.yaml", environ={})
    said = str(caught.value)
    assert field in said and "credential" in said and SECRETS[kind] not in said, said


@pytest.mark.parametrize("field", ["env", "args", "labels"])
def test_a_literal_under_a_secret_name_is_refused(tmp_path, field):
    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + f"{field}: {{PGPASSWORD: hunter2hunter2}}\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(tmp_path / "r.yaml", environ={})
    assert f"{field}.PGPASSWORD" in str(caught.value) and "hunter2" not in str(caught.value)


@pytest.mark.parametrize("name", ["PGPASSWORD", "SSHPASS", "NGROK_AUTHTOKEN", "AZURE_STORAGE_CONNECTION_STRING"])
def test_a_secret_variable_is_never_interpolated(tmp_path, name):
    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + f"pip: ['p5 @ https://files.example/${{{name}}}/p5-1.0.whl']\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(tmp_path / "r.yaml", environ={name: "the-users-own-value"})
    assert "the-users-own-value" not in str(caught.value)


def test_a_requirements_line_holding_a_credential_is_refused_at_its_line(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text(
        "einops\np5 @ https://files.example/" + SECRETS["NGC personal key"] + "\n"
    )
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + "pip: {requirements: requirements.txt}\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(tmp_path / "r.yaml", environ={})
    said = str(caught.value)
    assert "requirements.txt:2:" in said and "credential" in said and SECRETS["NGC personal key"] not in said


def test_the_shipped_shapes_are_the_installed_detectors_own():
    """credential_shapes.json is detect-secrets' regex detectors as installed (python -m tests.credential_shapes)."""
    from tests.credential_shapes import SHAPES, text

    assert SHAPES.read_text() == text()


def test_checking_a_recipe_loads_neither_the_detector_package_nor_http():
    import subprocess
    import sys

    code = (
        "import sys; from imgbuild.credentials import credential_kind; credential_kind('https://u:p4ssw0rd@x.example');"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'detect_secrets', 'requests'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


#: Credentials in forms no issuer prefix names: a token as a URL's user, a password in a URL, a client's
#: user:password option, a password option.
UNPREFIXED = {
    "a 40-hex token as a git URL's user": "git clone https://" + "0a1b2c3d4e" * 4 + "@github.com/lab/repo /opt/r",
    "a DSN's key as the URL's user": "https://" + "f00dbeef" * 4 + "@o1.ingest.sentry.example/42",
    "a password in a URL, whatever it looks like": "https://ci:p@ss-w0rd!@files.lab.example/x.whl",
    "curl's user:password": "curl -u admin:hunter22 -o /x https://files.lab.example/x",
    "a password option": "mytool --password hunter22",
    "a token option": "huggingface-cli login --token Zq8v1Zq8v1Zq8v1",
}
#: What those rules leave alone: a short user name, references, flags, paths.
UNPREFIXED_PLAIN = [
    "git clone ssh://git@github.com/lab/repo",
    "git clone https://x-access-token@github.com/lab/repo",
    "curl -u $USER:$PASSWORD https://files.lab.example/x",
    "https://ci:${CI_PASSWORD}@files.lab.example/x",
    "huggingface-cli login --token $HF_TOKEN",
    "mytool --token-file /run/secrets/t --password-stdin",
    "python train.py --auth-mode local --passes 3",
    "mkdir -p build && ls -p /tmp",
]


@pytest.mark.parametrize("kind", UNPREFIXED)
def test_a_credential_without_an_issuers_prefix_is_known_by_where_it_stands(kind):
    assert credential_kind(UNPREFIXED[kind])


@pytest.mark.parametrize("text", UNPREFIXED_PLAIN)
def test_short_user_names_references_and_flags_are_no_credential(text):
    assert credential_kind(text) == ""


def _string_places(schema: dict, defs: dict, at: str = "") -> list[tuple[str, object]]:
    """(field, a function putting a value there) for every place of the recipe's JSON schema that holds text: a
    string, a list's item, a map's value and a map's key."""
    if "$ref" in schema:
        return _string_places(defs[schema["$ref"].rsplit("/", 1)[1]], defs, at)
    for option in schema.get("anyOf", ()):
        if places := _string_places(option, defs, at):
            return places
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return [(at, lambda v: v)]
    if kind == "array":
        return [(f"{at}[0]", lambda v, put=put: [put(v)]) for _, put in _string_places(schema["items"], defs)][:1]
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        inner = _string_places(schema["additionalProperties"], defs)
        return [(f"{at}.K", lambda v, put=put: {"K": put(v)}) for _, put in inner][:1] + [(at, lambda v: {v: "x"})]
    places = []
    for name, part in schema.get("properties", {}).items():
        for field, put in _string_places(part, defs, f"{at}.{name}" if at else name):
            places.append((field, lambda v, put=put, name=name: {name: put(v)}))
    return places


def _schema_places() -> list[tuple[str, object]]:
    import json
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parent.parent / "docs" / "recipe.schema.json").read_text())
    return [(f, put) for f, put in _string_places(schema, schema["$defs"]) if f not in ("name", "base.framework")]


@pytest.mark.parametrize(("field", "put"), _schema_places(), ids=[f for f, _ in _schema_places()])
def test_a_credential_in_any_field_or_key_of_the_schema_is_refused_there_and_never_shown(tmp_path, field, put):
    import yaml

    secret = SECRETS["NGC personal key"]
    data = yaml.safe_load(RECIPE_HEAD)
    for name, value in put(secret).items():
        data[name] = {**data[name], **value} if isinstance(data.get(name), dict) else value
    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError) as caught:
        load_recipe(tmp_path / "r.yaml", environ={})
    said = str(caught.value)
    shown = field.removesuffix(".K").replace(".K[", "[")
    assert any(p.field.startswith(shown.split("[")[0]) for p in caught.value.problems), said
    assert secret[:12] not in said and caught.value.exit_code == 2, said


def test_a_field_named_by_a_key_holding_a_credential_never_shows_it(tmp_path):
    """Every message names its field through one function: a key shaped like a credential is named, not shown
    (here YAML's own duplicate-key refusal, which no credential rule wrote)."""
    key = SECRETS["NGC personal key"]
    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + f"env:\n  {key}: a\n  {key}: b\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(tmp_path / "r.yaml", environ={})
    said = str(caught.value)
    assert "duplicate key" in said and "env[(a key holding a credential)]" in said and key[:12] not in said, said
