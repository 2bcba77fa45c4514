"""The site and user config files refuse what a recipe refuses, and a CI token or any JWT-shaped value is a secret."""

from __future__ import annotations

import pytest
import yaml

from imgbuild.errors import RecipeError
from tests.conftest import run_cli, use_site_config
from tests.support import RECIPE_HEAD, refusal_lines


@pytest.mark.parametrize(
    "name", ["CI_JOB_JWT", "CI_JOB_JWT_V2", "CI_JOB_JWT_V1", "ACTIONS_ID_TOKEN_REQUEST_URL", "VAULT_ID_TOKEN"]
)
def test_ci_identity_tokens_are_secrets(name, tmp_path, monkeypatch):
    """GitLab's OIDC job token was interpolated into a label."""
    monkeypatch.setenv(name, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwMyJ9.c2ln")
    lines = refusal_lines(tmp_path, RECIPE_HEAD + f'labels: {{built-by: "${{{name}:-none}}"}}\n')
    assert any(" labels.built-by: " in ln for ln in lines) and not any("eyJ" in ln for ln in lines), lines


def test_a_value_shaped_like_a_jwt_is_a_secret_whatever_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("INNOCENT", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwMyJ9.c2lnbmF0dXJl")
    lines = refusal_lines(tmp_path, RECIPE_HEAD + 'labels: {by: "${INNOCENT}"}\n')
    assert any(" labels.by: " in ln for ln in lines) and not any("eyJ" in ln for ln in lines), lines


def test_the_config_file_refuses_the_same_characters(tmp_path, monkeypatch):
    """The site config is text someone else wrote too: a bidi control in a mount, a TAB in an env value."""
    from imgbuild.config.settings import load_settings

    site = tmp_path / "site.yaml"
    use_site_config(monkeypatch, str(site))
    for section in (
        {"run": {"mounts": ["/data:/data\u202e"]}},
        {"run": {"env": {"A": "x\u2028y"}}},
        {"run": {"max_time": "١d"}},
        {"reap": {"exempt": ["gitlab-runner\u2067*"]}},
        # a size's one optional space is an ASCII space: no NBSP, ideographic space or line break
        {"run": {"shm_size": "16\u00a0g"}},
        {"run": {"log_max_size": "50\u3000m"}},
        {"slurm": {"mem_per_gpu": "64\u2028G"}},
    ):
        site.write_text(yaml.safe_dump(section, allow_unicode=True))
        with pytest.raises(RecipeError):
            load_settings({})


#: A config value of the wrong type is named, never echoed: a key or a password may be in it
CONFIG_VALUES = [
    ("ngc_api_key", "[sk-FAKE-P4cfg-0123456789abcdefghij]", "sk-FAKE"),
    ("ngc_api_key", "{a: nvapi-secret}", "nvapi-secret"),
    ("pip_extra_index_urls", '{a: "https://bob:p4pw@idx.example/simple"}', "p4pw"),
    ("pip_index_url", '["https://bob:p4pw@idx.example/simple"]', "p4pw"),
    ("run_timeout", '"https://bob:p4pw@x"', "p4pw"),
    ("smoke_import_timeout", '"ghp_' + "z" * 36 + '"', "ghp_"),
]


@pytest.mark.parametrize("field, value, secret", CONFIG_VALUES)
def test_a_config_error_never_echoes_a_credential(tmp_path, field, value, secret):
    config = tmp_path / "config.yaml"
    config.write_text(f"{field}: {value}\n")
    done = run_cli("doctor", "--json", env={"IMGBUILD_CONFIG": str(config)}, timeout=120)
    assert secret not in done.out + done.err, done.err
    assert done.code in (2, 3) and field in done.err and "Traceback" not in done.err, (done.code, done.err)
