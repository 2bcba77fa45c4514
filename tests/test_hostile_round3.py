"""Round three's hostile inputs, as tables: each class from ../shared/docs/probe-3.md (numbers in the test
names) crossed with every way it can be abused, and the cases found beyond it."""

from __future__ import annotations

import json
import re
import time
import types

import pytest
import yaml

from imgbuild.errors import RecipeError, UsageError
from imgbuild.recipe import load_recipe
from tests.conftest import IMGBUILD, use_site_config

HEAD = 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\n'

#: Every white space and control character a value can smuggle, by what it is.
WHITESPACE_AND_CONTROLS = {
    "tab": "\t",
    "vertical-tab": "\x0b",
    "form-feed": "\x0c",
    "carriage-return": "\r",
    "nel-c1": "\x85",
    "csi-c1": "\x9b",
    "escape": "\x1b",
    "delete": "\x7f",
    "nbsp": "\xa0",
    "ideographic-space": "\u3000",
    "line-separator": "\u2028",
    "paragraph-separator": "\u2029",
    "rtl-override": "\u202e",
    "rtl-isolate": "\u2067",
}
#: Every recipe field whose value reaches a pip file (requirements.txt, pip.conf, constraints), as YAML.
PIP_FIELDS = {
    "pip.packages[0]": lambda v: f"pip:\n  packages: [{v}]\n",
    "pip.constraints[0]": lambda v: f"pip:\n  constraints: [{v}]\n",
    "pip.index_url": lambda v: f"pip:\n  index_url: {v}\n",
    "pip.extra_index_urls[0]": lambda v: f"pip:\n  extra_index_urls: [{v}]\n",
    "pip.trusted_hosts[0]": lambda v: f"pip:\n  trusted_hosts: [{v}]\n",
}
PIP_VALUES = {
    "pip.packages[0]": "einops{c}--find-links{c}/tmp",
    "pip.constraints[0]": "numpy<2{c}-r{c}/etc/passwd",
    "pip.index_url": "https://pypi.example/simple{c}-r{c}/etc/passwd",
    "pip.extra_index_urls[0]": "https://pypi.example/simple{c}--trusted-host{c}evil",
    "pip.trusted_hosts[0]": "pypi.example{c}--index-url",
}


def _quoted(value: str) -> str:
    return json.dumps(value)  # a YAML double-quoted scalar: every character arrives as written


def _lines(tmp_path, text: str) -> list[str]:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.exit_code == 2
    return info.value.lines()


@pytest.mark.parametrize("char", WHITESPACE_AND_CONTROLS, ids=list(WHITESPACE_AND_CONTROLS))
@pytest.mark.parametrize("field", PIP_FIELDS, ids=list(PIP_FIELDS))
def test_5_no_white_space_or_control_character_reaches_a_pip_file(field, char, tmp_path):
    """probe-3 #5: a TAB in an index URL became `-r /etc/passwd` in the pip step."""
    value = PIP_VALUES[field].format(c=WHITESPACE_AND_CONTROLS[char])
    lines = _lines(tmp_path, HEAD + PIP_FIELDS[field](_quoted(value)))
    assert any(re.search(rf"recipe\.yaml:\d+:\d+: {re.escape(field)}: ", ln) for ln in lines), lines


@pytest.mark.parametrize("char", WHITESPACE_AND_CONTROLS, ids=list(WHITESPACE_AND_CONTROLS))
@pytest.mark.parametrize(
    "line",
    [
        "--index-url https://pypi.example/simple{c}-r{c}/etc/passwd",
        "--extra-index-url https://pypi.example/simple{c}-e{c}git+https://evil/x.git",
        "--trusted-host pypi.example{c}--find-links{c}/tmp",
        "einops{c}-r{c}/etc/passwd",
        "x @ https://files.example/x.whl{c}--no-index",
    ],
    ids=["index-url", "extra-index-url", "trusted-host", "requirement", "url-requirement"],
)
def test_5_a_requirements_file_line_cannot_smuggle_options(line, char, tmp_path):
    (tmp_path / "req.txt").write_text(line.format(c=WHITESPACE_AND_CONTROLS[char]) + "\n", encoding="utf-8")
    lines = _lines(tmp_path, HEAD + "pip: {requirements: req.txt}\n")
    assert any(
        ln.startswith(f"{tmp_path.name}/req.txt:1:1: pip.requirements: ") or "req.txt:1:1:" in ln for ln in lines
    )
    assert not any("passwd" in ln or "evil" in ln for ln in lines), lines  # the line is never echoed


FREE_TEXT = {
    "description": lambda v: f"description: {v}\n",
    "env.A": lambda v: f"env: {{A: {v}}}\n",
    "labels.team": lambda v: f"labels: {{team: {v}}}\n",
    "run[0]": lambda v: f"run: [{v}]\n",
    "smoke.run[0]": lambda v: f"smoke: {{run: [{v}]}}\n",
    "args.LAB": lambda v: f"args: {{LAB: {v}}}\n",
}
TROJAN = {k: v for k, v in WHITESPACE_AND_CONTROLS.items() if k not in ("tab", "nbsp", "ideographic-space")}


@pytest.mark.parametrize("char", TROJAN, ids=list(TROJAN))
@pytest.mark.parametrize("field", FREE_TEXT, ids=list(FREE_TEXT))
def test_14_free_text_refuses_controls_separators_and_bidi_by_category(field, char, tmp_path):
    """probe-3 #14: U+202E, U+2066..2069, U+2028 and NEL passed every free-text check (Trojan Source)."""
    value = f"echo safe{TROJAN[char]}rm -rf /"
    lines = _lines(tmp_path, HEAD + FREE_TEXT[field](_quoted(value)))
    assert any(f" {field}: " in ln and "U+" in ln for ln in lines), lines


@pytest.mark.parametrize("field", FREE_TEXT, ids=list(FREE_TEXT))
def test_14_plain_text_with_tabs_and_non_latin_letters_still_validates(field, tmp_path):
    (tmp_path / ".git").mkdir()
    path = tmp_path / "recipe.yaml"
    path.write_text(HEAD + FREE_TEXT[field](_quoted("echo 'größe\tnäher' — 日本語 ✓")), encoding="utf-8")
    load_recipe(path)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('name: demo\nbase: {framework: pytorch, tag: "٢٤.٠٥"}\n', "base.tag"),
        ('name: demo\nbase: {framework: pytorch, tag: "２４.０５"}\n', "base.tag"),
        ('name: demo\nbase: {framework: pytorch, tag: "24.05", follow: "٢٤.*"}\n', "base.follow"),
        (HEAD + "smoke: {targets: [sm_٨٩]}\n", "smoke.targets[0]"),
        (HEAD + 'smoke: {targets: ["٨.٩"]}\n', "smoke.targets[0]"),
        (HEAD + "user: {name: u, uid: ١٠٠٠}\n", "user.uid"),
    ],
    ids=["tag-arabic", "tag-fullwidth", "follow-arabic", "target-sm", "target-capability", "uid"],
)
def test_8_only_ascii_digits_make_a_number_or_a_tag(text, field, tmp_path):
    """probe-3 #8: `٢٤.٠٥` validated and became a FROM line; a hostile registry's `٩٩.٩٩-py3` was bumped to."""
    lines = _lines(tmp_path, text)
    assert any(f" {field}: " in ln for ln in lines), lines


def test_8_a_registry_tag_in_other_digits_is_never_a_release():
    from imgbuild.ngc import matching, parse_tag

    assert parse_tag("٩٩.٩٩-py3") is None and parse_tag("２６.０１-py3") is None
    assert matching("pytorch", "latest", ["٩٩.٩٩-py3", "２６.０１-py3", "24.05-py3"]) == ["24.05-py3"]


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        ("duration", "١h"),
        ("duration", "٣d"),
        ("gpus", "٢"),
        ("gpus", "1,٣"),
        ("gpus", "device=٠"),
        ("cpulist", "٠-٣"),
        ("driver", "٥٣٥.104.05"),
    ],
)
def test_21_unicode_digits_are_refused_wherever_a_number_is_parsed(parse, text):
    from imgbuild import host
    from imgbuild.gpu import allocate, fleet, read
    from imgbuild.servers import spec

    if parse == "duration":
        with pytest.raises(UsageError):
            spec.parse_duration(text, "--time")
    elif parse == "gpus":
        readings = [read.Gpu(i, f"GPU-{i}", "H100", 0, 81559, 0) for i in range(4)]
        with pytest.raises(UsageError):
            allocate.select_gpus(text, readings, "me")
    elif parse == "cpulist":
        with pytest.raises(ValueError):
            host.parse_cpulist(text)
    else:
        with pytest.raises(UsageError):
            fleet.check_driver(text)


@pytest.mark.parametrize(
    "spec",
    [
        "x @ file:///etc/passwd",
        "x @ file:///run/secrets/imgbuild-pip.conf",
        "x @ git+file:///root/.ssh",
        "x @ hg+file:///srv/repo",
    ],
)
def test_15_file_sources_are_refused_in_recipes_and_requirements_files(spec, tmp_path):
    """probe-3 #15: `NAME @ file:` named a path of the build container; the docs say local paths are refused."""
    lines = _lines(tmp_path, HEAD + f"pip: [{_quoted(spec)}]\n")
    assert any(" pip.packages[0]: " in ln and "file:" in ln for ln in lines), lines
    (tmp_path / "req.txt").write_text(spec + "\n")
    lines = _lines(tmp_path, HEAD + "pip: {requirements: req.txt}\n")
    assert any("req.txt:1:1: pip.requirements: a local path (file:)" in ln for ln in lines), lines


@pytest.mark.parametrize(
    "name", ["CI_JOB_JWT", "CI_JOB_JWT_V2", "CI_JOB_JWT_V1", "ACTIONS_ID_TOKEN_REQUEST_URL", "VAULT_ID_TOKEN"]
)
def test_16_ci_identity_tokens_are_secrets(name, tmp_path, monkeypatch):
    """probe-3 #16: GitLab's OIDC job token was interpolated into a label."""
    monkeypatch.setenv(name, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwMyJ9.c2ln")
    lines = _lines(tmp_path, HEAD + f'labels: {{built-by: "${{{name}:-none}}"}}\n')
    assert any(" labels.built-by: " in ln for ln in lines) and not any("eyJ" in ln for ln in lines), lines


def test_16_a_value_shaped_like_a_jwt_is_a_secret_whatever_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("INNOCENT", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwMyJ9.c2lnbmF0dXJl")
    lines = _lines(tmp_path, HEAD + 'labels: {by: "${INNOCENT}"}\n')
    assert any(" labels.by: " in ln for ln in lines) and not any("eyJ" in ln for ln in lines), lines


@pytest.mark.parametrize("value", ["-5", "0", "-0.1", "-.inf"])
def test_17_min_speedup_is_a_positive_number(value, tmp_path):
    """probe-3 #17: a negative floor passed every ratio, switching the tensor-core check off."""
    lines = _lines(tmp_path, HEAD + f"smoke: {{min_speedup: {value}}}\n")
    assert any(" smoke.min_speedup: " in ln for ln in lines), lines


@pytest.mark.parametrize("host", ["руpi.org", "xn--pi-llc7a.org\t", "pypi.org\u200b"])
def test_22_an_index_host_is_ascii(host, tmp_path):
    """probe-3 #22: `https://руpi.org/simple` (Cyrillic р, у) validated; a reviewer reads pypi.org."""
    lines = _lines(tmp_path, HEAD + f"pip: {{index_url: {_quoted(f'https://{host}/simple')}}}\n")
    assert any(" pip.index_url: " in ln for ln in lines), lines


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


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"cpus": float("nan")}, "--cpus nan: not a number of CPUs"),
        ({"cpus": float("inf")}, "--cpus inf: not a number of CPUs"),
        ({"cpus": -5.0}, "--cpus -5.0: not a number of CPUs"),
        ({"cpus": 1e308}, "not a number of CPUs"),
        ({"time": "0"}, "--time 0: a deadline must be later than now"),
        ({"time": "0d"}, "a deadline must be later than now"),
        ({"time": "١h"}, "is not a duration"),
    ],
)
def test_21_run_refuses_garbage_numbers_as_usage_errors(flags, words, tmp_path, monkeypatch):
    """probe-3 #21: `--cpus nan` was a traceback (exit 1), `--cpus 1e308` reached docker, `--time 0` meant now."""
    from imgbuild.config.settings import load_settings
    from imgbuild.servers.run import RunRequest, prepare

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": []}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    with pytest.raises(UsageError, match=re.escape(words)):
        prepare(RunRequest("img", ["true"], **flags), load_settings({}), gpus=[])


@pytest.mark.parametrize(
    ("lock", "line", "words"),
    [
        ("einops==0.8.0\nnvidia-cudnn-cu12==8.9.7.29\n", 2, "nvidia-cudnn-cu12 would replace a CUDA library"),
        ("cupy-cuda12x==13.0.0\n", 1, "would replace a CUDA library"),
        ("einops==not..a..version\n", 1, "is not a version (PEP 440)"),
        ("einops==0.8.0\nEinops==0.7.0\n", 2, "einops is locked twice (first at line 1)".replace("einops", "Einops")),
        ("einops==0.8.0\r\n-r /etc/passwd\r\n", 2, "not a name==version line"),
        ("torch==2.0.0\n", 1, "torch==2.0.0 conflicts with the base's torch 2.4.0a0+07cecf4"),
    ],
    ids=["cuda-wheel", "cupy", "bad-version", "duplicate", "option", "framework"],
)
def test_7_the_lock_file_is_checked_like_any_input(lock, line, words, tmp_path):
    """probe-3 #7: CUDA-library and torch pins, invalid versions and duplicates in the lock all passed."""
    from imgbuild.pipeline.plan import make_plan
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(HEAD + "pip: [einops]\n")
    (tmp_path / "recipe.lock.txt").write_text(lock)
    with pytest.raises(RecipeError) as info:
        make_plan(load_recipe(recipe), settings(), fake_inspect)
    assert any(f"recipe.lock.txt:{line}:1: lock: " in ln and words in ln for ln in info.value.lines()), (
        info.value.lines()
    )


@pytest.mark.parametrize("name", ["nvidia-ml-py==12.535.161", "nvidia-dali-cuda120==1.40.0", "nvidia-modelopt==0.15"])
def test_7_nvidia_packages_that_are_not_cuda_libraries_may_be_pinned(name, tmp_path):
    from imgbuild.pipeline.plan import make_plan
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(HEAD + f"pip: [{name}]\n")
    (tmp_path / "recipe.lock.txt").write_text(name + "\n")
    assert make_plan(load_recipe(recipe), settings(), fake_inspect).loaded.lock_pins == (name,)


def test_13_one_copied_file_is_bounded_like_a_folder(tmp_path):
    """probe-3 #13: a 3 GiB sparse files[].src validated after reading it all and filled the context."""
    import os
    import time

    from imgbuild import limits

    (tmp_path / "big.bin").touch()
    os.truncate(tmp_path / "big.bin", limits.COPY_BYTES + 1)
    start = time.monotonic()
    lines = _lines(tmp_path, HEAD + "files: [{src: big.bin, dest: /opt/big.bin}]\n")
    assert time.monotonic() - start < 2, "the size is known before a byte is read"
    assert any(" files[0].src: " in ln for ln in lines), lines


@pytest.mark.parametrize(
    "files",
    [
        "[{src: a.txt, dest: /opt/app}, {src: b.txt, dest: /opt/app/conf.txt}]",
        "[{src: b.txt, dest: /opt/app/conf.txt}, {src: a.txt, dest: /opt/app}]",
    ],
)
def test_22_one_destination_inside_another_is_an_input_error(files, tmp_path):
    """probe-3 #22: /opt/app and /opt/app/conf.txt validated, then render failed as an environment error (exit 3)."""
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    lines = _lines(tmp_path, HEAD + f"files: {files}\n")
    assert any(" files[1].dest: " in ln and "lie one inside the other" in ln for ln in lines), lines


def test_12_two_recipes_building_one_image_tag_are_refused(tmp_path):
    """probe-3 #12: two names, one `image: p3/clash` and tag: each rebuild built both, and -previous held the other's."""
    from imgbuild.ci.rebuild import INVALID, check_contexts, load_graph
    from imgbuild.config.settings import load_settings

    (tmp_path / ".git").mkdir()
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name in ("one", "two"):
        (recipes / f"{name}.yaml").write_text(
            f'name: {name}\nimage: p3/clash\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
        )
    (recipes / "three.yaml").write_text(
        'name: three\nimage: p3/clash\ntag: v2\nbase: {framework: pytorch, tag: "24.05"}\n'
    )
    settings = load_settings({})
    for items in (load_graph(sorted(recipes.glob("*.yaml")), settings), check_contexts([str(recipes)], settings)):
        by_name = {i.path.stem: i for i in items}
        assert by_name["one"].status == by_name["two"].status == INVALID
        assert "all build p3/clash:v1" in by_name["one"].error
        assert by_name["three"].status != INVALID


SHELL_PAYLOADS = ["$(touch PWNED)", "`touch PWNED`", "$((0))$(touch PWNED)", "${HOME:-$(touch PWNED)}", "x;touch PWNED"]


@pytest.mark.parametrize("payload", SHELL_PAYLOADS)
@pytest.mark.parametrize("runtime", ["apptainer", "docker", "pyxis"])
def test_10_the_jobs_command_and_binds_are_literal_when_the_job_starts(payload, runtime, tmp_path):
    """probe-3 #10: `$(...)` in the command ran when the job started (only $VAR/${VAR} may expand there)."""
    import os
    import subprocess

    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.clusters.slurm import sbatch_script
    from imgbuild.config.site import slurm_site

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for stub in ("srun", "apptainer", "docker", "nvidia-smi", "scontrol", "sbatch", "python3"):
        (bin_dir / stub).write_text('#!/bin/sh\nprintf "%s\\n" "$@" >> "$ARGS_LOG"\n')
        (bin_dir / stub).chmod(0o755)
    # srun runs its command as a node would (the docker runtime's `sh -c 'exec docker run ...'` included)
    (bin_dir / "srun").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@" >> "$ARGS_LOG"\n'
        'while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done\n[ $# -gt 0 ] && exec "$@"\n'
    )
    flags = JobFlags(
        ["python3", "train.py", "--tag", payload, "$HOME"],
        "/sif/x.sif" if runtime == "apptainer" else "lab/x:1",
        "x",
        gpus=1,
        runtime=runtime,
        binds=[f"/data/{payload}:/data"] if runtime != "pyxis" else [],
        usage=False,
    )
    script = tmp_path / "job.sh"
    script.write_text(sbatch_script(job_from_flags(flags, slurm_site({}))))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ARGS_LOG": str(tmp_path / "args.log"),
        "SLURM_JOB_ID": "7",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_NNODES": "1",
        "HOME": "/home/u",
    }
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert not (tmp_path / "PWNED").exists(), script.read_text()
    words = (tmp_path / "args.log").read_text().splitlines()
    assert payload in words or any(payload in w for w in words), words
    assert "/home/u" in words  # the job's own variables still expand


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("job_name", "x\ntouch PWNED"),
        ("job_name", "x y"),
        ("time", "1:00:00\ntouch PWNED"),
        ("time", "١:00:00"),
        ("mem", "64G\n#SBATCH --gres=gpu:8"),
        ("output", "out-%j.txt\ntouch PWNED"),
        ("partition", "gpu\nrm -rf ~"),
        ("account", "p;id"),
        ("gpu_type", "a100\n"),
    ],
)
def test_10_values_that_become_sbatch_lines_are_whole_string_checked(flag, value):
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    with pytest.raises(UsageError, match="is not valid here"):
        job_from_flags(JobFlags(["true"], "x.sif", "x", **{flag: value}), slurm_site({}))


def test_1_no_env_value_stands_in_the_docker_clis_argv(tmp_path, monkeypatch):
    """probe-3 #1: the Jupyter token was on the docker CLI's command line, readable by every user in /proc."""
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.runargs import run_argv
    from imgbuild.servers.run import RunRequest, prepare
    from imgbuild.servers.spec import jupyter_notes

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": []}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    use_site_config(monkeypatch, str(tmp_path / "site.yaml"))
    (tmp_path / "site.yaml").write_text(f"run: {{state_dir: {tmp_path / 'state'}, env: {{SITE_VAR: site-value}}}}\n")
    request = RunRequest("img", ["python3", "-e", "A=B"], jupyter=True, env=["HF_TOKEN=hf_CANARY"])
    spec = prepare(request, load_settings({}), gpus=[])
    argv, env = run_argv(spec.options())
    token = env["JUPYTER_TOKEN"]
    assert len(token) == 48 and not any(token in word for word in argv)
    assert env["HF_TOKEN"] == "hf_CANARY" and not any("CANARY" in word for word in argv)
    assert env["SITE_VAR"] == "site-value" and "JUPYTER_TOKEN" not in argv[:-3]  # by env file, not even by name
    assert argv[-3:] == ["python3", "-e", "A=B"], "the command's own words are the command's"
    assert any(token in line for line in jupyter_notes(spec, "host"))  # told to the user, on their terminal


# --- #2, #3: on a shared server every other user is untrusted ---------------------------------------------

NOBODY = 65534


def _user_file(state, uid: int, entries: list, extended: dict | None = None, owner: int | None = None):
    import os

    path = state / f"ledger-{uid}.json"
    path.write_text(json.dumps({"entries": entries, "extended": extended or {}}))
    os.chown(path, NOBODY if owner is None else owner, -1)
    return path


def _entry(**fields):
    import os

    from imgbuild.host import process_start

    base = {
        "name": "ghost_1",
        "user": "nobody",
        "pid": os.getpid(),
        "started": process_start(os.getpid()),
        "gpus": ["GPU-0", "GPU-1"],
        "cpus": [],
        "since": time.time(),
        "ports": [8888],
        "waiting": "",
        "uid": NOBODY,
    }
    return {**base, **fields}


@pytest.mark.root("writes ledger files as other users (chown)")
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("case", "entry", "owner"),
    [
        ("queue-block-pid-1", {"pid": 1, "waiting": "--gpus 1"}, None),
        ("hold-in-root-s-name", {"user": "root"}, None),
        ("someone-else-s-process", {}, None),  # this test's own process is root's, not nobody's
        ("uid-claims-another", {"uid": 0}, None),
        ("file-of-another-owner", {}, 0),
        ("stale-hold", {"since": 1.0}, None),
        ("stale-queue-place", {"waiting": "--gpus 1", "since": 1.0, "seen": 1.0}, None),
        ("wrong-type-cpus", {"cpus": [{}]}, None),
        ("wrong-type-gpus", {"gpus": [["GPU-x"]]}, None),
        ("wrong-type-name", {"name": ["x"]}, None),
        ("wrong-type-pid", {"pid": True}, None),
        ("wrong-type-since", {"since": "now"}, None),
        ("unknown-field", {"admin": True}, None),
    ],
)
def test_3_a_forged_ledger_entry_holds_nothing_and_crashes_nobody(case, entry, owner, tmp_path):
    """probe-3 #3: an entry naming PID 1 blocked every GPU run forever; one in another user's name held every
    GPU and port; wrongly typed fields crashed everyone's `run`."""
    from imgbuild.servers.ledger import Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    _user_file(state, NOBODY, [_entry(**entry)], owner=owner)
    book = Ledger(state).read()
    assert book.entries == [] and book.holds() == [] and book.queue() == []
    with Ledger(state).transaction() as book:  # a run's view: the same, and nothing of nobody's is rewritten
        assert book.entries == []


@pytest.mark.root("writes another user's ledger file (chown)")
@pytest.mark.timeout(60)
def test_3_another_users_live_entry_counts_and_cannot_be_framed(tmp_path):
    """The honest case: nobody's own live process, in nobody's own file, holds what it says; the same file
    naming root is dropped."""
    import os
    import subprocess

    from imgbuild.host import process_start
    from imgbuild.servers.ledger import Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while os.stat(f"/proc/{proc.pid}").st_uid != NOBODY and time.monotonic() < deadline:
            time.sleep(0.02)
        live = _entry(pid=proc.pid, started=process_start(proc.pid))
        _user_file(state, NOBODY, [live])
        engine_user = Ledger(state, holds_of=lambda uid: True)  # nobody as a member of the docker group
        assert [e.name for e in engine_user.read().holds()] == ["ghost_1"]
        # the same file, written by a user who cannot start containers themself (enforced mode): holds nothing
        assert Ledger(state, holds_of=lambda uid: False).read().holds() == []
        _user_file(state, NOBODY, [{**live, "user": "root"}])
        assert engine_user.read().entries == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.root("writes another user's ledger file (chown)")
def test_3_an_extension_moves_only_its_owners_container(tmp_path):
    from imgbuild.servers.containers import effective_deadline
    from imgbuild.servers.ledger import Extension, Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    _user_file(state, NOBODY, [], {"victim-id": {"deadline": 10**9, "user": "root"}, "own-id": 5000.0})
    book = Ledger(state).read()
    assert book.extended["victim-id"] == Extension(10**9, "nobody")  # nobody's file speaks for nobody only
    victim = {"id": "victim-id", "user": "alice", "deadline": 100.0, "created_ts": 0.0}
    assert effective_deadline(victim, book.extended, {"max_time": None}) == 100.0


@pytest.mark.root("root clearing what another user planted")
@pytest.mark.timeout(30)
@pytest.mark.parametrize("plant", ["fifo", "folder"])
def test_2_a_planted_lock_never_blocks_and_root_clears_it(plant, tmp_path):
    import os

    from imgbuild.servers.ledger import Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    (os.mkfifo if plant == "fifo" else os.mkdir)(state / "ledger.lock")
    with Ledger(state).transaction() as book:  # root removes what was planted and goes on
        book.add("x_1", "root", [], [])
    assert (state / "ledger.lock").is_file()


@pytest.mark.root("a state folder another user owns (chown)")
@pytest.mark.timeout(30)
def test_2_a_state_folder_another_user_owns_is_refused_by_run_and_reap(tmp_path):
    """probe-3 #2: the first user to run imgbuild owned the state folder and deleted root's state and log."""
    import os

    from imgbuild.errors import EnvironmentProblem
    from imgbuild.servers.ledger import Ledger, reaper_dir

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    os.chown(state, NOBODY, -1)
    with pytest.raises(EnvironmentProblem, match=r"belongs to nobody.*chown root"):
        Ledger(state).entries()
    with pytest.raises(EnvironmentProblem, match="belongs to nobody"):
        reaper_dir(state)
    os.chown(state, 0, -1)
    assert reaper_dir(state) == state / ".reap" and oct((state / ".reap").stat().st_mode & 0o777) == "0o700"
    os.chown(state / ".reap", NOBODY, -1)
    (state / ".reap" / "planted").write_text("hers")
    # root's name in the sticky state folder: what another user holds there is removed and made again, root's
    assert reaper_dir(state) == state / ".reap"
    info = (state / ".reap").stat()
    assert info.st_uid == 0 and oct(info.st_mode & 0o777) == "0o700" and not (state / ".reap" / "planted").exists()


@pytest.mark.root("a reap log another user owns (chown)")
@pytest.mark.timeout(30)
@pytest.mark.parametrize("plant", ["fifo", "folder", "symlink", "hardlink", "other-owner"])
def test_2_the_reap_log_is_only_ever_the_reapers_own_regular_file(plant, tmp_path):
    import os

    from imgbuild.errors import EnvironmentProblem
    from imgbuild.servers.reap import Action, append_log

    log = tmp_path / "reap.log"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    if plant == "fifo":
        os.mkfifo(log)
    elif plant == "folder":
        log.mkdir()
    elif plant == "symlink":
        log.symlink_to(victim)
    elif plant == "hardlink":
        os.link(victim, log)
    else:
        log.write_text("")
        os.chown(log, NOBODY, -1)
    with pytest.raises(EnvironmentProblem):
        append_log(log, 0.0, Action("warn", "x_1", "x", "idle", "idle"), "warned")
    assert victim.read_text() == "precious\n"


@pytest.mark.timeout(30)
def test_2_a_fifo_at_a_users_notices_file_never_blocks_root(tmp_path, monkeypatch):
    import os

    from imgbuild.servers.reap import write_notice
    from tests.support import users_home

    home = users_home(tmp_path, monkeypatch)
    os.mkfifo(home / "imgbuild-notices.txt")
    assert write_notice("someone", "you will be stopped") is False


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_4_lock_keeps_index_credentials_out_of_the_container_and_a_killed_lock_is_swept(
    testbed, tmp_path, docker_client
):
    """probe-3 #4: `imgbuild lock` wrote the index password into the container's files (pip.conf, and the script
    itself), and after a SIGKILL that container stayed with it forever."""
    import os
    import signal
    import subprocess

    from imgbuild.facts import Label
    from tests.conftest import ROOT, bridge_gateway
    from tests.fake_index import FakeIndex, Release

    gateway = bridge_gateway(docker_client)
    index = FakeIndex(gateway, {"slowpkg": [Release("1.0.0")]}, delay=60)  # pip waits here: time to look
    host = index.url.split("//", 1)[1].split("/", 1)[0]
    secret = "CANARY-p4ss-0123456789"
    try:
        (tmp_path / ".git").mkdir()
        recipe = tmp_path / "recipes" / "lock4.yaml"
        recipe.parent.mkdir()
        recipe.write_text(HEAD + f'pip: {{packages: [slowpkg], trusted_hosts: ["{gateway}"]}}\n')
        env = {
            **os.environ,
            **testbed,
            "IMGBUILD_PIP_INDEX_URL": f"http://bob:{secret}@{host}/simple",
            "PYTHONPATH": str(ROOT),
        }
        proc = subprocess.Popen([*IMGBUILD, "lock", str(recipe)], cwd=tmp_path, env=env)
        found = []
        deadline = time.monotonic() + 240
        while not found and time.monotonic() < deadline:
            time.sleep(0.5)
            found = [  # the lock's own container (the base's pins are read in one before it, briefly)
                c
                for c in docker_client.containers.list(all=True, filters={"label": Label.STARTED_BY})
                if str(proc.pid) == c.labels[Label.STARTED_BY].split(":")[0] and c.attrs["Config"].get("OpenStdin")
            ]
        assert found, "the lock's container did not start"
        container = found[0]
        time.sleep(5)  # pip is resolving (the index holds the wheel back)
        attrs = docker_client.api.inspect_container(container.id)
        assert secret not in json.dumps(attrs), "the secret is in the container's config"
        listing = container.exec_run(["sh", "-c", "cat /tmp/imgbuild-smoke.py /tmp/imgbuild-pip/* 2>/dev/null"])
        assert secret not in listing.output.decode(errors="replace"), "the secret is in the container's files"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert docker_client.containers.get(container.id)  # left behind by the kill
        from imgbuild.engine import Engine

        assert Engine.connect(testbed.get("IMGBUILD_DOCKER_CLI")).containers.sweep_orphans() >= 1
        import docker.errors

        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(container.id)
        index.delay = 0  # and the credentials did reach pip: slowpkg is on that index alone
        done = subprocess.run(
            [*IMGBUILD, "lock", str(recipe)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "slowpkg==1.0.0" in (tmp_path / "recipes" / "lock4.lock.txt").read_text()
        assert secret not in done.stdout + done.stderr
    finally:
        index.close()


# --- #9: mirroring from a hostile registry ---------------------------------------------------------------

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DIGEST = "sha256:" + "a" * 64


class _Source:
    host = "hostile.example"

    def __init__(self, answer):
        self.answer = answer

    def manifest_raw(self, repo, reference):
        content, media_type = self.answer(reference)
        return content, media_type, DIGEST

    def download_blob(self, repo, digest, size, path):
        raise AssertionError("a malformed blob must be refused before a byte is fetched")


class _Target:
    def manifest_digest(self, repo, reference):
        return None

    def has_blob(self, repo, digest):
        return False

    def put_manifest(self, *args):
        pass


def _nested(reference):
    return json.dumps({"mediaType": INDEX, "manifests": [{"digest": DIGEST}]}).encode(), INDEX


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "answer",
    [
        lambda r: (b'["manifests", 1]', MANIFEST),
        lambda r: (b"not json", MANIFEST),
        lambda r: (json.dumps({"config": "x", "layers": ["y"]}).encode(), MANIFEST),
        lambda r: (json.dumps({"config": {"digest": DIGEST, "size": 1}, "layers": "y"}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": "1TB"}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": 2**50}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": True}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": -1}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": "sha256:../../x", "size": 1}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"mediaType": INDEX, "manifests": "x"}).encode(), INDEX),
        lambda r: (json.dumps({"mediaType": INDEX, "manifests": [5]}).encode(), INDEX),
        _nested,  # an index of indexes, endlessly
        lambda r: (b"[" * 100_000 + b"]" * 100_000, MANIFEST),
    ],
    ids=[
        "list",
        "not-json",
        "strings",
        "layers-string",
        "size-text",
        "size-1PiB",
        "size-bool",
        "size-negative",
        "digest-path",
        "manifests-string",
        "manifests-number",
        "endless-index",
        "deep-json",
    ],
)
def test_9_a_hostile_source_registry_is_a_registry_error_never_a_crash(answer, tmp_path):
    """probe-3 #9: a list, strings, `size: "1TB"` crashed mirror; a 1 TB claimed layer streamed 2.7 GB to disk;
    an index nested 1,500 deep recursed for 55 s."""
    from imgbuild.errors import RegistryError
    from imgbuild.registry.mirror import TagCopy, _Copier

    copier = _Copier(_Source(answer), _Target(), "nvidia/pytorch", tmp_path, lambda s: None)
    start = time.monotonic()
    with pytest.raises(RegistryError):
        copier.manifest("24.05-py3", TagCopy("24.05-py3"), "24.05-py3")
    assert time.monotonic() - start < 5


def test_9_a_killed_mirrors_partial_blob_is_swept(tmp_path):
    import os
    import subprocess

    from imgbuild.host import process_start
    from imgbuild.registry.mirror import sweep_partial_blobs

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"blob-{dead.pid}.12345-abc").write_bytes(b"x" * 1024)
    mine = tmp_path / f"blob-{os.getpid()}.{process_start(os.getpid())}-def"
    mine.write_bytes(b"y")
    (tmp_path / "blob-garbage").write_bytes(b"z")
    assert sweep_partial_blobs(tmp_path) == 2
    assert [p.name for p in tmp_path.iterdir()] == [mine.name]


# --- #20: bump edits the file as written ------------------------------------------------------------------

FOLLOWING = 'name: b\nbase:\n  framework: pytorch\n  tag: {tag}\n  follow: "24.*"\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (FOLLOWING.format(tag='"24.01"').replace("\n", "\r\n"), FOLLOWING.format(tag='"24.05"').replace("\n", "\r\n")),
        (
            "\ufeff" + 'base: {framework: pytorch, tag: "24.01", follow: "24.*"}\nname: b\n',
            "\ufeff" + 'base: {framework: pytorch, tag: "24.05", follow: "24.*"}\nname: b\n',
        ),
        (
            FOLLOWING.format(tag='&t "24.01"') + "labels: {was: *t}\n",
            FOLLOWING.format(tag='&t "24.05"') + "labels: {was: *t}\n",
        ),
        (FOLLOWING.format(tag="'24.01'") + "# a comment\n", FOLLOWING.format(tag="'24.05'") + "# a comment\n"),
    ],
    ids=["crlf", "bom", "anchor", "single-quotes"],
)
def test_20_bump_keeps_line_endings_bom_anchors_and_quotes(text, expected, tmp_path):
    """probe-3 #20: a CRLF recipe came back LF (every line changed in review); a BOM or an anchor gave exit 2."""
    from imgbuild.ci.bump import bump

    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(text.encode())
    moved = bump([recipe], tags_for=lambda fw: ["24.01-py3", "24.05-py3"])
    assert moved[0].changed and recipe.read_bytes().decode() == expected


def test_20_bump_never_edits_through_a_link_or_an_alias(tmp_path):
    from imgbuild.ci.bump import bump

    outside = tmp_path / "outside.yaml"
    outside.write_text(FOLLOWING.format(tag='"24.01"'))
    (tmp_path / "recipes").mkdir()
    link = tmp_path / "recipes" / "link.yaml"
    link.symlink_to(outside)
    with pytest.raises(UsageError, match="never through a link"):
        bump([link], tags_for=lambda fw: ["24.05-py3"])
    assert outside.read_text() == FOLLOWING.format(tag='"24.01"')
    aliased = tmp_path / "aliased.yaml"
    aliased.write_text('x: &t "24.01"\nname: b\nbase:\n  framework: pytorch\n  tag: *t\n  follow: "24.*"\n')
    with pytest.raises(UsageError, match="a YAML alias"):
        bump([aliased], tags_for=lambda fw: ["24.05-py3"])


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_18_the_reapers_note_reaches_a_container_running_as_its_user(testbed, docker_client, unique):
    """probe-3 #18: the note was written as uid 0, which may not open the PID 1 output of a container started
    `--user UID:GID`: every warning read `no container log`."""
    from imgbuild.engine import Engine

    name = f"imgbuildtest_note_{unique}"
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    docker_client.containers.run(image, ["sleep", "120"], name=name, user="65534:65534", detach=True)
    try:
        containers = Engine.connect(testbed.get("IMGBUILD_DOCKER_CLI")).containers
        assert containers.note(name, "imgbuild reap: a test note")
        deadline = time.monotonic() + 10
        while "a test note" not in docker_client.containers.get(name).logs().decode() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "imgbuild reap: a test note" in docker_client.containers.get(name).logs().decode()
    finally:
        docker_client.containers.get(name).remove(force=True)


# --- #19: Apptainer --from native carries what validates, or says why not --------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/opt/tools/bin:$PATH", "/opt/tools/bin:/usr/bin:/bin"),
        ("${HOME}/cache", "/home/u/cache"),
        ("a$(touch PWNED)b", "a$(touch PWNED)b"),
        ("`touch PWNED`", "`touch PWNED`"),
        ('quote " and \\ back', 'quote " and \\ back'),
        ("$1 and $$", "$1 and $$"),
        ("it's", "it's"),
    ],
)
def test_19_apptainer_env_expands_variables_as_docker_env_does_and_nothing_else(value, expected, tmp_path):
    """probe-3 #19: `PATH: /opt/tools/bin:$PATH` (the docs' own example) stayed literal in the SIF."""
    import subprocess

    from imgbuild.pipeline.render import sh_env

    script = f'export X={sh_env(value)}\nprintf %s "$X"\n'
    out = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/u"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert out.stdout == expected and not (tmp_path / "PWNED").exists()


def _native(tmp_path, body: str) -> str:
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import apptainer_definition
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "a.txt").write_text("a")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(HEAD + body)
    return apptainer_definition(make_plan(load_recipe(recipe), settings(), fake_inspect), "native")


def test_19_a_run_command_starting_with_percent_cannot_end_post(tmp_path):
    """A `run:` command whose first word starts with % ended %post (Apptainer reads a section at a line's first
    word): each now runs as Docker's RUN does, through /bin/sh -c."""
    from spython.main.parse.parsers import SingularityParser

    path = tmp_path / "x.def"
    path.write_text(_native(tmp_path, "run: ['%setup', 'echo {a}']\n"))
    recipe = SingularityParser(str(path)).recipe["spython-base"]
    post = "\n".join(recipe.install)
    assert "/bin/sh -c %setup" in post and "/bin/sh -c 'echo {a}'" in post


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("files: [{src: a.txt, dest: '/opt/my data/a.txt'}]\n", "cannot hold white space"),
        ("run: ['echo {{ X }}']\n", "Apptainer reads as a build argument"),
        ("env: {A: '{{ secret }}'}\n", "Apptainer reads as a build argument"),
    ],
)
def test_19_what_a_definition_cannot_carry_is_refused_with_the_way_that_can(body, words, tmp_path):
    with pytest.raises(UsageError, match=words):
        _native(tmp_path, body)


@pytest.mark.parametrize("error", ["read-timeout", "protocol", "incomplete-read"])
def test_a_transport_error_while_reading_a_body_is_an_environment_error(error):
    """Found by CI: a registry stalling mid-body raised urllib3's ReadTimeoutError unwrapped (exit 1,
    "unexpected"); it is the registry being unreachable (exit 3), retried within the deadline."""
    import http.client

    import urllib3.exceptions

    from imgbuild.errors import RegistryUnavailable
    from imgbuild.registry.client import RegistryClient

    raised = {
        "read-timeout": urllib3.exceptions.ReadTimeoutError(None, "/v2/", "Read timed out."),
        "protocol": urllib3.exceptions.ProtocolError("Connection broken"),
        "incomplete-read": http.client.IncompleteRead(b"x", 10),
    }[error]

    class Session:
        def request(self, *args, **kwargs):
            raise raised

    client = RegistryClient("127.0.0.1:9", insecure=True, retries=0, session=Session(), command_seconds=5)
    with pytest.raises(RegistryUnavailable, match="is unreachable"):
        client.tags("x/y")


@pytest.mark.parametrize(
    ("pip", "words"),
    [
        ('["nvidia-cudnn-cu12 @ https://example.org/cudnn.whl"]', "nvidia-cudnn-cu12 would replace a CUDA library"),
        ('["nvidia-nccl-cu12==2.20.5"]', "would replace a CUDA library"),
        ('["torch @ https://example.org/torch.whl"]', "torch from a URL would replace the base's torch"),
        ('["tensorflow==2.15"]', "tensorflow is tensorflow, but the base is a pytorch image"),
    ],
)
def test_7_validate_makes_every_refusal_render_makes_without_a_registry(pip, words, tmp_path):
    """probe-3: `validate` missed the `nvidia-* @ URL` refusal that `render` makes."""
    from tests.conftest import run_cli

    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(HEAD + f"pip: {pip}\n")
    res = run_cli("validate", str(tmp_path / "r.yaml"), env={"IMGBUILD_NGC_REGISTRY": "127.0.0.1:9"})
    assert res.code == 2 and words in res.err and "r.yaml:3:" in res.err, res.err


def test_9_a_target_missing_a_blob_is_asked_again_then_named(monkeypatch):
    """probe-3 #9: two mirrors into one target: one exited 3 with `HTTP 400 for manifest`, which reads as
    "unreachable"; the target's own code now says what it refused, and the copy asks again before giving up."""
    from imgbuild.errors import RegistryError
    from imgbuild.registry.mirror import TagCopy, _Copier

    class Busy(_Target):
        host = "mirror.example"
        tries = 0

        def has_blob(self, repo, digest):
            return True

        def put_manifest(self, *args):
            Busy.tries += 1
            if Busy.tries < 3:
                raise RegistryError(
                    "registry mirror.example: refused manifest t in r (HTTP 400: MANIFEST_BLOB_UNKNOWN)"
                )

    monkeypatch.setattr("imgbuild.registry.mirror.time.sleep", lambda s: None)
    blobless = lambda r: (json.dumps({"config": {"digest": DIGEST, "size": 2}, "layers": []}).encode(), MANIFEST)  # noqa: E731
    _Copier(_Source(blobless), Busy(), "nvidia/pytorch", None, lambda s: None).manifest("t", TagCopy("t"), "t")
    assert Busy.tries == 3
    Busy.tries = -10
    with pytest.raises(RegistryError, match="is another mirror copying into mirror.example/nvidia/pytorch"):
        _Copier(_Source(blobless), Busy(), "nvidia/pytorch", None, lambda s: None).manifest("t", TagCopy("t"), "t")


def test_a_registry_that_refuses_says_its_code_and_is_not_called_unreachable():
    from imgbuild.errors import RegistryError, RegistryUnavailable
    from imgbuild.registry.client import RegistryClient
    from imgbuild.registry.transport import Reply

    client = RegistryClient("r.example", insecure=True)
    body = json.dumps({"errors": [{"code": "MANIFEST_BLOB_UNKNOWN", "message": "blob unknown"}]}).encode()
    with pytest.raises(RegistryError, match=r"refused manifest t in x \(HTTP 400: MANIFEST_BLOB_UNKNOWN\)") as info:
        client._check(Reply(400, {}, body, "http://r.example/v2/x/manifests/t"), "manifest t", "x")
    assert not isinstance(info.value, RegistryUnavailable)
    with pytest.raises(RegistryUnavailable):
        client._check(Reply(503, {}, b"", "http://r.example/v2/"), "manifest t", "x")


def test_a_dry_run_of_reap_makes_no_folder(tmp_path):
    """`reap --dry-run` reads: the reaper's own folder is made by a real run only."""
    from imgbuild.config.site import reap_policy, run_rules
    from imgbuild.servers.reap import reap

    class NoContainers:
        containers = types.SimpleNamespace(rows=lambda: [])

    state = tmp_path / "state"
    house = run_rules({"state_dir": str(state)})
    assert reap(NoContainers(), [], house, reap_policy({}), 0.0, dry_run=True).actions == []
    assert not state.exists()
    reap(NoContainers(), [], house, reap_policy({}), 0.0)
    assert (state / ".reap").is_dir()


def test_10_an_escaped_dollar_still_reaches_the_container_for_its_own_shell():
    r"""`sh -c "echo \$SLURM_PROCID \$(id -u)"` is the documented way to expand inside the container."""
    from imgbuild.shellwords import UserWord, shell_words

    assert shell_words([UserWord(r"echo \$SLURM_PROCID \$(id -u)")]) == r'"echo \$SLURM_PROCID \$(id -u)"'
    assert shell_words([UserWord("$(id -u)")]) == "'$(id -u)'"


# --- the image argument of run, slurm and k8s ---------------------------------------------------------------

HOSTILE_IMAGES = [
    "x;rm -rf /",
    "127.0.0.1:5000/a b:1",
    "nvcr.io/nvidia/pytorch:２４.05",
    "lab/x@sha256:zz",
    "lab/x\u202e:1",
    "lab/x:1\n",
    "",
    "a" * 300,
    "typo.yaml",
    "$(touch PWNED)",
]


@pytest.mark.parametrize("image", HOSTILE_IMAGES, ids=range(len(HOSTILE_IMAGES)))
@pytest.mark.parametrize(
    "command",
    [["run", "--dry-run"], ["slurm", "--runtime", "docker"], ["slurm", "--runtime", "pyxis"], ["k8s"]],
    ids=["run", "slurm-docker", "slurm-pyxis", "k8s"],
)
def test_the_image_argument_is_a_reference_a_recipe_or_nothing(command, image, tmp_path):
    """An image argument that is no reference (nor recipe, nor image file) is refused at once with one line:
    it was passed on to docker (`run`), to a job that failed hours later in the queue (`slurm`), or crashed
    (`k8s`: an unexpected BadReference, exit 1)."""
    from tests.conftest import run_cli

    res = run_cli(command[0], image, *command[1:], "--", "python3", "t.py", cwd=tmp_path)
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1 and "Traceback" not in res.err, res.err
    assert "give REGISTRY/REPO:TAG or a recipe file" in res.err or "no such recipe file" in res.err
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("key", ["LD_PRELOAD", "LD_AUDIT"])
def test_a_recipe_cannot_set_the_loaders_preload(key, tmp_path):
    """Issue 28 (NVIDIAScape, CVE-2025-23266): an image whose config sets LD_PRELOAD runs code on the host
    through NVIDIA Container Toolkit 1.17.7's hook, and in every process of the container anyway."""
    from tests.conftest import run_cli

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: x\nbase: {{framework: pytorch, tag: "24.05"}}\nenv: {{{key}: /tmp/libx.so}}\n')
    res = run_cli("validate", str(recipe))
    assert res.code == 2 and f"r.yaml:3:7: env.{key}: " in res.err and "CVE-2025-23266" in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1
