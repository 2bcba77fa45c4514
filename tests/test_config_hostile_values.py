"""The site and user config files refuse what a recipe refuses, and a CI token or any JWT-shaped value is a secret."""

from __future__ import annotations

import pytest
import yaml

from imgbuild.errors import RecipeError
from tests.conftest import use_site_config
from tests.support import RECIPE_HEAD, refusal_lines


@pytest.mark.parametrize(
    "name", ["CI_JOB_JWT", "CI_JOB_JWT_V2", "CI_JOB_JWT_V1", "ACTIONS_ID_TOKEN_REQUEST_URL", "VAULT_ID_TOKEN"]
)
def test_ci_identity_tokens_are_secrets(name, tmp_path, monkeypatch):
    """probe-3 #16: GitLab's OIDC job token was interpolated into a label."""
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
