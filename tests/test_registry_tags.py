"""The registry client and `imgbuild tags`: against a fake nvcr.io and against the test bed's real registry."""

from __future__ import annotations

import json

import pytest

from imgbuild.errors import RegistryError, RegistryUnavailable, UsageError
from imgbuild.ngc import newest_matching, parse_tag
from imgbuild.registry.auth import Credentials, parse_challenge
from imgbuild.registry.client import RegistryClient
from imgbuild.registry.tags import TagInfo, compatibility, host_gpus, select
from tests import ngc_facts
from tests.conftest import run_cli
from tests.fake_nvcr import GOOD_KEY, FakeNvcr, ngc_tag_names, push_many_tags

# --- grammar ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tag,release,fw,variant",
    [
        ("24.05-py3", "24.05", None, None),
        ("24.05-tf2-py3", "24.05", "tf2", None),
        ("20.12-tf1-py3", "20.12", "tf1", None),
        ("23.11-py3-igpu", "23.11", None, "igpu"),
        ("18.04-py2", "18.04", None, None),
        ("17.12", "17.12", None, None),
    ],
)
def test_ngc_tag_grammar(tag, release, fw, variant):
    parsed = parse_tag(tag)
    assert parsed and (parsed.release, parsed.fw, parsed.variant) == (release, fw, variant)


@pytest.mark.parametrize("bad", ["latest", "24.5-py3", "v24.05", "24.05-py3 ", "2405"])
def test_tags_that_do_not_parse(bad):
    assert parse_tag(bad) is None


def test_sorting_and_filters_newest_first_and_yy_rollover():
    names = ["9.99-py3", "99.12-py3", "24.05-py3", "24.10-py3", "24.10-py3-igpu", "18.04-py2", "junk", "00.01-py3"]
    assert [t.tag for t in select(names, since=None, variant="none", limit=None)] == [
        "99.12-py3",
        "24.10-py3",
        "24.05-py3",
        "00.01-py3",
    ]
    assert [t.tag for t in select(names, since="24.06", variant="all", limit=None)] == [
        "99.12-py3",
        "24.10-py3",
        "24.10-py3-igpu",
    ]
    assert [t.tag for t in select(names, since=None, variant="igpu", limit=1)] == ["24.10-py3-igpu"]


def test_patterns_resolve_to_the_newest_plain_tag():
    names = ["24.01-py3", "24.05-py3", "24.05-py3-igpu", "25.01-py3", "24.05-tf2-py3"]
    assert newest_matching("pytorch", "latest", names) == "25.01-py3"
    assert newest_matching("pytorch", "24.*", names) == "24.05-py3"
    assert newest_matching("tensorflow", "24.*", names) == "24.05-tf2-py3"
    assert newest_matching("pytorch", "23.*", names) is None


def test_challenge_parsing_is_loose():
    assert parse_challenge('Bearer realm="https://nvcr.io/proxy_auth",scope="repository:nvidia/pytorch:pull"') == (
        "bearer",
        {"realm": "https://nvcr.io/proxy_auth", "scope": "repository:nvidia/pytorch:pull"},
    )
    scheme, params = parse_challenge('bearer  realm=https://x/token , service="registry",error="invalid_token"')
    assert scheme == "bearer" and params["realm"] == "https://x/token" and params["error"] == "invalid_token"


def test_compatibility_uses_driver_and_arch_list():
    info = TagInfo("25.10-py3", "25.10", None, cuda="13.0.2.006", arch_list="8.0 8.6 9.0 10.0 12.0+PTX")
    ok, why = compatibility(info, host_gpus("580.95.05", "9.0"))
    assert ok, why
    ok, why = compatibility(info, host_gpus("580.95.05", "7.0"))
    assert not ok and "sm_70: no kernels for this GPU" in why  # a V100 cannot run CUDA 13 images
    ok, why = compatibility(info, host_gpus("535.104.05", "9.0"))  # forward compatibility (NVIDIA's R535)
    assert ok and "forward compatibility" in why, why
    ok, why = compatibility(info, host_gpus("560.35.03", "9.0"))
    assert not ok and "driver 560.35.03 is older than 580.65.06 needed by CUDA 13.0" in why
    ok, why = compatibility(info, host_gpus("580.95.05", "l40s,b300"))
    assert ok and "sm_89: native kernels (sm_86" in why and "sm_103: native kernels (sm_100" in why
    old = TagInfo("24.05-py3", "24.05", None, cuda="12.4.1.003", arch_list="5.2 6.0 7.0 8.0 9.0+PTX")
    ok, why = compatibility(old, host_gpus("535.104.05", "7.0"))
    assert ok and "minor-version compatibility" in why


# --- the fake nvcr.io ---------------------------------------------------------------------------------


def test_anonymous_token_flow_and_pagination():
    names = ngc_tag_names(250)
    with FakeNvcr({"nvidia/pytorch": names}) as fake:
        client = RegistryClient(fake.host, insecure=True)
        tags = client.tags("nvidia/pytorch", page_size=100)
        assert sorted(tags) == sorted(names)
        pages = [entry for entry in fake.log if entry.startswith("/v2/nvidia/pytorch/tags/list")]
        assert len(pages) == 1 + 3  # the challenged first try, then three pages
        token_calls = [e for e in fake.log if e.startswith("/proxy_auth")]
        assert len(token_calls) == 1 and "service=" in token_calls[0]  # default service added


def test_expired_token_goes_back_to_proxy_auth_not_the_new_realm():
    with FakeNvcr({"nvidia/pytorch": ngc_tag_names(40)}, token_uses=2) as fake:
        client = RegistryClient(fake.host, insecure=True)
        for _ in range(5):
            assert len(client.tags("nvidia/pytorch", page_size=1000)) == 40
        assert not any(e.startswith("/authn/token") for e in fake.log), fake.log
        assert sum(e.startswith("/proxy_auth") for e in fake.log) >= 2


def test_api_key_is_sent_as_oauthtoken_and_a_wrong_key_is_refused():
    with FakeNvcr({"nvaie/pytorch": ["24.05-py3"]}, private={"nvaie/pytorch"}) as fake:
        good = RegistryClient(fake.host, insecure=True, credentials=Credentials("$oauthtoken", GOOD_KEY))
        assert good.tags("nvaie/pytorch") == ["24.05-py3"]
        anonymous = RegistryClient(fake.host, insecure=True)
        with pytest.raises(RegistryError, match="anonymous access was refused"):
            anonymous.tags("nvaie/pytorch")
        wrong = RegistryClient(fake.host, insecure=True, credentials=Credentials("$oauthtoken", "nvapi-wrong"))
        with pytest.raises(RegistryError, match="the NGC API key was refused"):
            wrong.tags("nvaie/pytorch")


def test_retries_on_429_and_manifest_list_picks_this_platform():
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}, throttle_first=2) as fake:
        client = RegistryClient(fake.host, insecure=True, backoff=0.01)
        manifest, config = client.image_config("nvidia/pytorch", "24.05-py3")
        assert manifest.media_type.endswith("manifest.list.v2+json")
        import platform

        want = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        assert config["architecture"] == want
        assert manifest.size > 9e9


def test_cli_tags_details_json_against_fake_nvcr(monkeypatch):
    with FakeNvcr({"nvidia/pytorch": ngc_tag_names(80)}) as fake:
        monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", fake.host)
        res = run_cli("tags", "pytorch", "--details", "--since", "25.01", "--json")
        assert res.code == 0, res.err
        data = json.loads(res.out)
        assert [t["tag"] for t in data["tags"]] == ["26.03-py3", "26.02-py3", "26.01-py3"] + [
            f"25.{m:02d}-py3" for m in range(12, 0, -1)
        ]
        first = data["tags"][0]
        assert (first["cuda"], first["cudnn"], first["framework_version"], first["python"]) == (
            "12.4.1.003",
            "9.1.0.70",
            "2.4.0a0+07cecf4168",
            "3.10",
        )
        assert first["digest"].startswith("sha256:") and first["size"] > 9e9
        table = run_cli("tags", "--details", "--limit", "2")
        assert table.code == 0 and "26.03-py3" in table.out and "12.4.1.003" in table.out
        compat = run_cli("tags", "--compatible", "--driver", "470.42.01", "--arch", "7.0", "--json")
        assert compat.code == 0 and json.loads(compat.out)["tags"] == []  # CUDA 12.4 needs 525, or R470.57+
        # NGC's forward compatibility: R470.57+ runs CUDA 12 images on data-center GPUs, not on a GeForce.
        v100 = run_cli("tags", "--compatible", "--driver", "470.57.02", "--arch", "v100", "--json", "--limit", "1")
        assert v100.code == 0 and "forward compatibility" in json.loads(v100.out)["tags"][0]["why"]
        geforce = run_cli("tags", "--compatible", "--driver", "470.57.02", "--arch", "rtx4090", "--json")
        assert geforce.code == 0 and json.loads(geforce.out)["tags"] == []


def test_cli_errors_one_line_each(monkeypatch):
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"], "nvaie/secret": ["1.0"]}, private={"nvaie/secret"}) as fake:
        monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", fake.host)
        unknown = run_cli("tags", "nvidia/nope")
        assert unknown.code == 2 and "unknown repository nvidia/nope" in unknown.err
        monkeypatch.setenv("NGC_API_KEY", "nvapi-wrong-key")
        bad_key = run_cli("tags", "nvaie/secret")
        assert bad_key.code == 2 and "the NGC API key was refused (401)" in bad_key.err
        assert "nvapi-wrong-key" not in bad_key.err
        monkeypatch.delenv("NGC_API_KEY")
        bad_since = run_cli("tags", "--since", "May")
        assert bad_since.code == 2 and "--since" in bad_since.err
        # warm the cache, then lose the registry: the cached answer comes back with its age
        assert run_cli("tags").code == 0
    offline = run_cli("tags", "--refresh")
    assert offline.code == 0, offline.err
    assert "24.05-py3" in offline.out and "registry unreachable: cached answer" in offline.err
    monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", "127.0.0.1:9")
    unreachable = run_cli("tags", "--refresh")
    assert unreachable.code == 3 and "unreachable" in unreachable.err
    for res in (unknown, bad_key, bad_since, unreachable):
        assert len(res.err.strip().splitlines()) == 1 and "Traceback" not in res.err


def test_unreachable_registry_raises_environment_error():
    with pytest.raises(RegistryUnavailable):
        RegistryClient("127.0.0.1:9", insecure=True, retries=0).tags("nvidia/pytorch")


# --- the test bed's real registry ---------------------------------------------------------------------


@pytest.mark.engine
def test_real_registry_pagination_and_details(testbed):
    registry = testbed["IMGBUILD_TESTBED_REGISTRY"]
    names = ngc_tag_names(260)
    push_many_tags(registry, "imgbuildtest/many", "nvidia/pytorch", "24.05-py3", names)
    client = RegistryClient(registry, insecure=True)
    # distribution 2.8 (Debian's registry) ignores `n` on tag lists and sends no Link header (pagination
    # came in distribution 3); the client must still return every tag. Link-following is proven against
    # the fake nvcr above, which paginates.
    assert sorted(client.tags("imgbuildtest/many", page_size=100)) == sorted(names)
    res = run_cli("tags", "imgbuildtest/many", "--limit", "3", "--details", "--json", "--refresh")
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert [t["tag"] for t in data["tags"]] == ["26.03-py3", "26.02-py3", "26.01-py3"]
    assert {t["framework_version"] for t in data["tags"]} == {ngc_facts.BED_TORCH_ENV}
    assert data["total"] == 260


@pytest.mark.engine
def test_recipe_base_latest_resolves_and_is_pinned_by_digest(testbed, write):
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.record import Record
    from imgbuild.pipeline.resolve import plan_recipe
    from imgbuild.recipe import load_recipe

    settings = load_settings()
    for pattern in ("latest", "24.*"):
        path = write(f"r-{pattern[:2]}.yaml", f'name: demo\nbase: {{framework: pytorch, tag: "{pattern}"}}\n')
        plan = plan_recipe(load_recipe(path), settings)
        # the newest release the registry has: 26.01 for `latest`, 24.05 for `24.*`
        newest = "26.01-py3" if pattern == "latest" else "24.05-py3"
        assert plan.base.ref == f"{testbed['IMGBUILD_NGC_REGISTRY']}/nvidia/pytorch:{newest}"
        assert plan.base.digest and plan.base.digest.startswith("sha256:")
        assert Record.of(plan, "buildkit").base.requested.endswith(f":{pattern}")


def test_credentials_from_docker_config_auths_and_helpers(tmp_path, monkeypatch):
    import base64

    from imgbuild.registry.auth import docker_config_credentials

    config = tmp_path / "config.json"
    auth = base64.b64encode(b"$oauthtoken:nvapi-from-config").decode()
    config.write_text(
        json.dumps({"auths": {"https://nvcr.io": {"auth": auth}}, "credHelpers": {"registry.corp": "corp"}})
    )
    creds = docker_config_credentials("nvcr.io", config)
    assert (creds.username, creds.password) == ("$oauthtoken", "nvapi-from-config")
    helper = tmp_path / "docker-credential-corp"
    helper.write_text('#!/bin/sh\nread host\necho "{\\"Username\\": \\"ci\\", \\"Secret\\": \\"s3cret-for-$host\\"}"\n')
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    creds = docker_config_credentials("registry.corp", config)
    assert (creds.username, creds.password) == ("ci", "s3cret-for-registry.corp")
    assert docker_config_credentials("elsewhere.io", config) is None


@pytest.mark.parametrize(
    "name, expected",
    [
        ("pytorch", ("nvcr.io", "nvidia/pytorch")),
        ("nvidia/tritonserver", ("nvcr.io", "nvidia/tritonserver")),
        ("registry.lab:5000/nvidia/pytorch", ("registry.lab:5000", "nvidia/pytorch")),
        ("localhost:5000/mirror/pytorch", ("localhost:5000", "mirror/pytorch")),
        ("torch", None),  # neither a framework nor ORG/REPO
        ("nvidia/pytorch:25.10-py3", None),  # a tag: `tags` lists them, it does not take one
        ("nvidia/pytorch@sha256:" + "a" * 64, None),
        ("../etc/passwd", None),
        ("nvidia//pytorch", None),
        ("", None),
    ],
)
def test_a_tags_repository_is_read_as_an_image_reference(name, expected):
    """The repository of `imgbuild tags` went through imageref, not a hand split (which took
    `nvidia/pytorch:25.10-py3` as a repository)."""
    from imgbuild.registry.tags import repository_for

    if expected is None:
        with pytest.raises(UsageError, match="is not pytorch, tensorflow or ORG/REPO"):
            repository_for(name, "nvcr.io")
    else:
        assert repository_for(name, "nvcr.io") == expected


@pytest.mark.parametrize(
    "args, words",
    [
        (["--compatible", "--driver", "banana"], "--driver: 'banana' is not an NVIDIA driver version"),
        (["--compatible", "--driver", "999"], "--driver: '999' is not an NVIDIA driver version"),
        (["--compatible", "--arch", "h900"], "--arch: 'h900' is not a GPU imgbuild knows"),
        (["--compatible", "--arch", "h100", "--driver", "535"], "is not an NVIDIA driver version"),
        (["--driver", "535.104.05"], "--driver and --arch go with --compatible"),
    ],
)
def test_a_bad_driver_or_gpu_for_tags_is_one_line_and_exit_2_before_any_registry_is_asked(
    args, words, capsys, monkeypatch, tmp_path
):
    from imgbuild.cli import main

    monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", "127.0.0.1:9")  # nothing listens: a request would be exit 3
    monkeypatch.setenv("IMGBUILD_CACHE_DIR", str(tmp_path))  # no cached tag list either
    with pytest.raises(SystemExit) as done:
        main(["tags", *args])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and words in err, err
