"""A recipe's fields under hostile values, as tables: every white space, control, separator and bidi character, other
scripts' digits, file sources, option smuggling in requirement lines, bounds on copied files, a lock file's lines."""

from __future__ import annotations

import json
import re
import time

import pytest

from imgbuild.errors import RecipeError, UsageError
from imgbuild.recipe import load_recipe
from tests.support import RECIPE_HEAD, refusal_lines

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


FREE_TEXT = {
    "description": lambda v: f"description: {v}\n",
    "env.A": lambda v: f"env: {{A: {v}}}\n",
    "labels.team": lambda v: f"labels: {{team: {v}}}\n",
    "run[0]": lambda v: f"run: [{v}]\n",
    "smoke.run[0]": lambda v: f"smoke: {{run: [{v}]}}\n",
    "args.LAB": lambda v: f"args: {{LAB: {v}}}\n",
}


TROJAN = {k: v for k, v in WHITESPACE_AND_CONTROLS.items() if k not in ("tab", "nbsp", "ideographic-space")}


@pytest.mark.parametrize("char", WHITESPACE_AND_CONTROLS, ids=list(WHITESPACE_AND_CONTROLS))
@pytest.mark.parametrize("field", PIP_FIELDS, ids=list(PIP_FIELDS))
def test_no_white_space_or_control_character_reaches_a_pip_file(field, char, tmp_path):
    """A TAB in an index URL became `-r /etc/passwd` in the pip step."""
    value = PIP_VALUES[field].format(c=WHITESPACE_AND_CONTROLS[char])
    lines = refusal_lines(tmp_path, RECIPE_HEAD + PIP_FIELDS[field](_quoted(value)))
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
def test_a_requirements_file_line_cannot_smuggle_options(line, char, tmp_path):
    (tmp_path / "req.txt").write_text(line.format(c=WHITESPACE_AND_CONTROLS[char]) + "\n", encoding="utf-8")
    lines = refusal_lines(tmp_path, RECIPE_HEAD + "pip: {requirements: req.txt}\n")
    assert any(
        ln.startswith(f"{tmp_path.name}/req.txt:1:1: pip.requirements: ") or "req.txt:1:1:" in ln for ln in lines
    )
    assert not any("passwd" in ln or "evil" in ln for ln in lines), lines  # the line is never echoed


#: a value of each pip field that asks the installer to fill in a variable of the build's environment (`$$` is the
#: recipe's literal `$`): uv's pip step holds the site's index URL, credentials and all, in UV_INDEX_URL
EXPANDED = {
    "pip.packages[0]": "x @ https://files.example/$${UV_INDEX_URL}/x-1.0-py3-none-any.whl",
    "pip.constraints[0]": "x @ https://files.example/$${UV_INDEX_URL}/x-1.0-py3-none-any.whl",
    "pip.index_url": "https://pypi.example/$${UV_INDEX_URL}/simple",
    "pip.extra_index_urls[0]": "https://pypi.example/simple/$${UV_INDEX_URL}",
    "pip.trusted_hosts[0]": "$${UV_INSECURE_HOST}",
}
EXPANDED_LINES = [
    "--find-links https://data.example/${UV_INDEX_URL}/torch.html",
    "-fhttps://data.example/whl/${PIP_INDEX_URL}.html",
    "--index-url https://pypi.example/${UV_INDEX_URL}/simple",
    "--extra-index-url https://pypi.example/${UV_EXTRA_INDEX_URL}",
    "x @ https://files.example/${UV_INDEX_URL}/x-1.0-py3-none-any.whl",
    "x==1.0; python_version > '${PYTHON_VERSION}'",
]


@pytest.mark.parametrize("field", EXPANDED, ids=list(EXPANDED))
def test_no_pip_field_asks_the_installer_to_fill_in_the_builds_environment(field, tmp_path):
    """pip and uv replace `${NAME}` in any line of a requirements file with the variable of the environment they run
    in: a find-links page at another host would be sent the site's index credentials."""
    lines = refusal_lines(tmp_path, RECIPE_HEAD + PIP_FIELDS[field](_quoted(EXPANDED[field])))
    assert any(re.search(rf"recipe\.yaml:\d+:\d+: {re.escape(field)}: ", ln) for ln in lines), lines


@pytest.mark.parametrize("line", EXPANDED_LINES)
@pytest.mark.parametrize("where", ["requirements", "constraints"])
def test_no_requirements_file_line_asks_the_installer_to_fill_in_the_builds_environment(line, where, tmp_path):
    (tmp_path / "more.txt").write_text(f"{line}\n", encoding="utf-8")
    (tmp_path / "req.txt").write_text(f"einops\n{'-r' if where == 'requirements' else '-c'} more.txt\n")
    lines = refusal_lines(tmp_path, RECIPE_HEAD + "pip: {requirements: req.txt}\n")
    assert any("more.txt:1:1: pip.requirements: " in ln and "${NAME}" in ln for ln in lines), lines


@pytest.mark.parametrize("char", TROJAN, ids=list(TROJAN))
@pytest.mark.parametrize("field", FREE_TEXT, ids=list(FREE_TEXT))
def test_free_text_refuses_controls_separators_and_bidi_by_category(field, char, tmp_path):
    """U+202E, U+2066..2069, U+2028 and NEL passed every free-text check (Trojan Source)."""
    value = f"echo safe{TROJAN[char]}rm -rf /"
    lines = refusal_lines(tmp_path, RECIPE_HEAD + FREE_TEXT[field](_quoted(value)))
    assert any(f" {field}: " in ln and "U+" in ln for ln in lines), lines


@pytest.mark.parametrize("field", FREE_TEXT, ids=list(FREE_TEXT))
def test_plain_text_with_tabs_and_non_latin_letters_still_validates(field, tmp_path):
    (tmp_path / ".git").mkdir()
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_HEAD + FREE_TEXT[field](_quoted("echo 'größe\tnäher' — 日本語 ✓")), encoding="utf-8")
    load_recipe(path)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('name: demo\nbase: {framework: pytorch, tag: "٢٤.٠٥"}\n', "base.tag"),
        ('name: demo\nbase: {framework: pytorch, tag: "２４.０５"}\n', "base.tag"),
        ('name: demo\nbase: {framework: pytorch, tag: "24.05", follow: "٢٤.*"}\n', "base.follow"),
        (RECIPE_HEAD + "smoke: {targets: [sm_٨٩]}\n", "smoke.targets[0]"),
        (RECIPE_HEAD + 'smoke: {targets: ["٨.٩"]}\n', "smoke.targets[0]"),
        (RECIPE_HEAD + "user: {name: u, uid: ١٠٠٠}\n", "user.uid"),
    ],
    ids=["tag-arabic", "tag-fullwidth", "follow-arabic", "target-sm", "target-capability", "uid"],
)
def test_only_ascii_digits_make_a_number_or_a_tag(text, field, tmp_path):
    """`٢٤.٠٥` validated and became a FROM line; a hostile registry's `٩٩.٩٩-py3` was bumped to."""
    lines = refusal_lines(tmp_path, text)
    assert any(f" {field}: " in ln for ln in lines), lines


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
def test_unicode_digits_are_refused_wherever_a_number_is_parsed(parse, text):
    from imgbuild.gpu import allocate, fleet, read
    from imgbuild.hostio import host
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
def test_file_sources_are_refused_in_recipes_and_requirements_files(spec, tmp_path):
    """`NAME @ file:` named a path of the build container; the docs say local paths are refused."""
    lines = refusal_lines(tmp_path, RECIPE_HEAD + f"pip: [{_quoted(spec)}]\n")
    assert any(" pip.packages[0]: " in ln and "file:" in ln for ln in lines), lines
    (tmp_path / "req.txt").write_text(spec + "\n")
    lines = refusal_lines(tmp_path, RECIPE_HEAD + "pip: {requirements: req.txt}\n")
    assert any("req.txt:1:1: pip.requirements: a local path (file:)" in ln for ln in lines), lines


@pytest.mark.parametrize("value", ["-5", "0", "-0.1", "-.inf"])
def test_min_speedup_is_a_positive_number(value, tmp_path):
    """A negative floor passed every ratio, switching the tensor-core check off."""
    lines = refusal_lines(tmp_path, RECIPE_HEAD + f"smoke: {{min_speedup: {value}}}\n")
    assert any(" smoke.min_speedup: " in ln for ln in lines), lines


@pytest.mark.parametrize("host", ["руpi.org", "xn--pi-llc7a.org\t", "pypi.org\u200b"])
def test_an_index_host_is_ascii(host, tmp_path):
    """`https://руpi.org/simple` (Cyrillic р, у) validated; a reviewer reads pypi.org."""
    lines = refusal_lines(tmp_path, RECIPE_HEAD + f"pip: {{index_url: {_quoted(f'https://{host}/simple')}}}\n")
    assert any(" pip.index_url: " in ln for ln in lines), lines


@pytest.mark.parametrize(
    ("lock", "line", "words"),
    [
        ("einops==not..a..version\n", 1, "is not a version (PEP 440)"),
        ("einops==0.8.0\nEinops==0.7.0\n", 2, "einops is locked twice (first at line 1)".replace("einops", "Einops")),
        ("einops==0.8.0\r\n-r /etc/passwd\r\n", 2, "not a name==version line"),
        ("torch==2.0.0\n", 1, "torch is a framework the base carries"),
    ],
    ids=["bad-version", "duplicate", "option", "framework"],
)
def test_the_lock_file_is_checked_like_any_input(lock, line, words, tmp_path):
    """Torch pins, invalid versions and duplicates in the lock all passed."""
    from imgbuild.pipeline.plan import make_plan
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE_HEAD + "pip: [einops]\n")
    (tmp_path / "recipe.lock.txt").write_text(lock)
    with pytest.raises(RecipeError) as info:
        make_plan(load_recipe(recipe), settings(), fake_inspect)
    assert any(f"recipe.lock.txt:{line}:1: lock: " in ln and words in ln for ln in info.value.lines()), (
        info.value.lines()
    )


@pytest.mark.parametrize("pin", ["TORCH==2.0.0", "Torch==2.4.0", "tensorflow_CPU==2.15.0", "Tensorflow.GPU==2.15.0"])
def test_a_lock_pinning_any_framework_in_any_spelling_is_refused_without_the_base(pin, tmp_path):
    """Loading alone refuses it (validate and an offline render load the same way): one line at the lock's line."""
    (tmp_path / "recipe.lock.txt").write_text("einops==0.8.0\n" + pin + "\n")
    lines = refusal_lines(tmp_path, RECIPE_HEAD + "pip: [einops]\n")
    assert len(lines) == 1 and "recipe.lock.txt:2:1: lock: " in lines[0] and "is a framework" in lines[0], lines


@pytest.mark.parametrize("name", ["nvidia-ml-py==12.535.161", "nvidia-dali-cuda120==1.40.0", "nvidia-modelopt==0.15"])
def test_nvidia_packages_that_are_not_cuda_libraries_may_be_pinned(name, tmp_path):
    from imgbuild.pipeline.plan import make_plan
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE_HEAD + f"pip: [{name}]\n")
    (tmp_path / "recipe.lock.txt").write_text(name + "\n")
    assert make_plan(load_recipe(recipe), settings(), fake_inspect).loaded.lock_pins == (name,)


def test_one_copied_file_is_bounded_like_a_folder(tmp_path):
    """A 3 GiB sparse files[].src validated after reading it all and filled the context."""
    import os

    from imgbuild import limits

    (tmp_path / "big.bin").touch()
    os.truncate(tmp_path / "big.bin", limits.COPY_BYTES + 1)
    start = time.monotonic()
    lines = refusal_lines(tmp_path, RECIPE_HEAD + "files: [{src: big.bin, dest: /opt/big.bin}]\n")
    assert time.monotonic() - start < 2, "the size is known before a byte is read"
    assert any(" files[0].src: " in ln for ln in lines), lines


@pytest.mark.parametrize(
    "files",
    [
        "[{src: a.txt, dest: /opt/app}, {src: b.txt, dest: /opt/app/conf.txt}]",
        "[{src: b.txt, dest: /opt/app/conf.txt}, {src: a.txt, dest: /opt/app}]",
    ],
)
def test_one_destination_inside_another_is_an_input_error(files, tmp_path):
    """/opt/app and /opt/app/conf.txt validated, then render failed as an environment error (exit 3)."""
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    lines = refusal_lines(tmp_path, RECIPE_HEAD + f"files: {files}\n")
    assert any(" files[1].dest: " in ln and "lie one inside the other" in ln for ln in lines), lines


def test_two_recipes_building_one_image_tag_are_refused(tmp_path):
    """Two names, one `image: p3/clash` and tag: each rebuild built both, and -previous held the other's."""
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


@pytest.mark.parametrize("key", ["LD_PRELOAD", "LD_AUDIT"])
def test_a_recipe_cannot_set_the_loaders_preload(key, tmp_path):
    """NVIDIAScape (CVE-2025-23266): an image whose config sets LD_PRELOAD runs code on the host
    through NVIDIA Container Toolkit 1.17.7's hook, and in every process of the container anyway."""
    from tests.conftest import run_cli

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: x\nbase: {{framework: pytorch, tag: "24.05"}}\nenv: {{{key}: /tmp/libx.so}}\n')
    res = run_cli("validate", str(recipe))
    assert res.code == 2 and f"r.yaml:3:7: env.{key}: " in res.err and "CVE-2025-23266" in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1


@pytest.mark.parametrize("cuda", ["nvidia-cudnn-cu12==8.9.7.29", "nvidia-cuda-nvcc==13.0.88", "cupy-cuda12x==13.0.0"])
def test_a_cuda_library_an_older_lock_pinned_is_read_as_the_comment_lock_writes_now(cuda, tmp_path):
    """Older locks pinned the CUDA libraries a requirement pulls in (jax[cuda13] -> nvidia-cuda-nvcc); they were
    refused as "would replace a CUDA library of the base", which the base may not even have. The line is read as
    `imgbuild lock` writes it now: a comment, never a pin the build installs over the base's."""
    from imgbuild.pipeline.plan import make_plan
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE_HEAD + "pip: [einops]\n")
    (tmp_path / "recipe.lock.txt").write_text(f"einops==0.8.0\n{cuda}\n")
    loaded = load_recipe(recipe)
    assert loaded.lock_pins == ("einops==0.8.0",)
    make_plan(loaded, settings(), fake_inspect)


#: Characters a reader never sees, by Unicode category: format (Cf), private use (Co), unassigned (Cn).
INVISIBLE = {
    "zero-width-space": "\u200b",
    "word-joiner": "\u2060",
    "byte-order-mark": "\ufeff",
    "tag-letter": "\U000e0041",
    "soft-hyphen": "\u00ad",
    "private-use": "\ue000",
    "unassigned": "\u0378",
}


@pytest.mark.parametrize("char", INVISIBLE, ids=list(INVISIBLE))
@pytest.mark.parametrize("field", ["description", "run[0]", "labels.note"])
def test_free_text_refuses_what_a_reader_cannot_see(field, char, tmp_path):
    value = json.dumps(f"echo safe{INVISIBLE[char]}text", ensure_ascii=False)  # as the file holds it
    text = {
        "description": f"description: {value}\n",
        "run[0]": f"run: [{value}]\n",
        "labels.note": f"labels: {{note: {value}}}\n",
    }
    lines = refusal_lines(tmp_path, RECIPE_HEAD + text[field])
    assert any(f" {field}: " in ln and "U+" in ln for ln in lines), lines


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("user: {name: u, uid: 999}\n", "user.uid"),
        ("user: {name: u, uid: 1}\n", "user.uid"),
        ("user: {name: u, gid: 100}\n", "user.gid"),
    ],
)
def test_a_system_uid_or_gid_is_refused_by_validate_and_render(text, field, tmp_path):
    from tests.conftest import run_cli

    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + text)
    for args in (["validate", "r.yaml"], ["render", "--offline", "r.yaml", "-o", "out"]):
        done = run_cli(*args, cwd=tmp_path, env={"IMGBUILD_NGC_REGISTRY": "127.0.0.1:9"})
        assert done.code == 2 and f"{field}: " in done.err and "system ID" in done.err, (args, done.err)
    assert not (tmp_path / "out").exists()


def test_a_site_may_lower_the_id_floor(tmp_path):
    from imgbuild.pipeline.plan import make_plan
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + "user: {name: u, uid: 500, gid: 500}\n")
    plan = make_plan(load_recipe(tmp_path / "r.yaml"), settings(min_image_id=500), fake_inspect)
    assert (plan.uid, plan.gid) == (500, 500)


@pytest.mark.parametrize("value", ["0.5", "0.999"])
def test_a_speedup_floor_below_one_is_refused(value, tmp_path):
    lines = refusal_lines(tmp_path, RECIPE_HEAD + f"smoke: {{min_speedup: {value}}}\n")
    assert any(" smoke.min_speedup: " in ln and "1 or more" in ln for ln in lines), lines


@pytest.mark.parametrize(
    ("text", "field"),
    [
        # ports the engine and pip read: 1-65535
        ('pip: {trusted_hosts: ["pypi.example:65536"]}\n', "pip.trusted_hosts[0]"),
        ('pip: {trusted_hosts: ["pypi.example:0"]}\n', "pip.trusted_hosts[0]"),
        ("image: lab.example:99999/x:v1\n", "image"),
        # names imgbuild keeps for itself: its tags, its folder, its labels
        ("tag: v1-arm64\n", "tag"),
        ("tag: v1-amd64\n", "tag"),
        ("tag: v1-arm64-previous\n", "tag"),
        ("image: lab/x:v1-arm64\n", "image"),
        ("workdir: /opt/imgbuild\n", "workdir"),
        ("user: {name: u, home: /opt/imgbuild/home}\n", "user.home"),
        ("labels: {org.opencontainers.image.base.digest: 'sha256:00'}\n", "labels"),
        ("labels: {org.opencontainers.image.base.name: 'nvcr.io/x'}\n", "labels"),
        ("labels: {org.imgbuild.input-hash: 'sha256:00'}\n", "labels"),
    ],
)
def test_out_of_range_ports_and_names_imgbuild_keeps_are_refused_at_their_field(text, field, tmp_path):
    lines = refusal_lines(tmp_path, RECIPE_HEAD + text)
    assert any(f" {field}" in ln for ln in lines), lines


def test_the_promoter_makes_only_names_the_model_reserves():
    from imgbuild.platforms import PLATFORMS
    from imgbuild.reserved import CANDIDATE_PREFIX, platform_tag, previous_ref, reserved_tag

    made = [previous_ref("v1"), f"{CANDIDATE_PREFIX}123.4.5"]
    made += [platform_tag("v1", p) for p in PLATFORMS] + [previous_ref(platform_tag("v1", p)) for p in PLATFORMS]
    assert all(reserved_tag(tag) for tag in made), made
    assert not reserved_tag("v1") and not reserved_tag("24.05-py3")


@pytest.mark.parametrize("key", ["A\\nB", "A\\u2028B", "A\\u001b[31mB", "env: x"])
def test_a_hostile_key_is_named_quoted_on_its_own_line(key, tmp_path):
    lines = refusal_lines(tmp_path, RECIPE_HEAD + f'env: {{"{key}": x}}\n')
    assert len(lines) == 1 and " env[" in lines[0] and "\x1b" not in lines[0] and "\u2028" not in lines[0], lines
