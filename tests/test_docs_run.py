"""The docs run: every fenced example in README.md and docs/ (and every command in docs/ci/) is executed here.

- a YAML block of settings loads as a site config and every value shows in `imgbuild config`;
- a YAML block that is a recipe validates; one marked `<!-- docs: recipe-fragment -->` validates inside a
  minimal recipe; one marked `<!-- docs: reference -->` (a field list with placeholders) names only real fields;
- every `imgbuild ...` line of a shell block, a systemd unit or a CI file parses with imgbuild's own CLI;
- `text` blocks are shown output or diagrams, and a block marked `<!-- docs: partial -->` is left alone:
  the mark is the author saying so, and the test counts the marks so none slips in unseen.
An example that does not run fails here, and so CI.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from imgbuild import fields
from imgbuild.config.model import NOT_SETTINGS
from imgbuild.config.settings import Settings, load_settings
from imgbuild.config.site import SECTIONS, Fleet
from tests.conftest import use_site_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CI_FILES = sorted((ROOT / "docs" / "ci").glob("*.yml"))
FENCE = re.compile(r"(?ms)^(?:<!-- docs: (?P<mark>[a-z-]+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```")
MARKS = {
    "recipe-fragment",
    "reference",
    "partial",
    "main-command",
    "test-command",
    "ci-rest-command",
    "install",
    "admission-policy",
}
SETTING_KEYS = {f.name for f in dataclasses.fields(Settings)} - set(NOT_SETTINGS) | {"fleet"}
MINIMAL_RECIPE = 'name: docs-example\nbase: {framework: pytorch, tag: "24.05"}\n'


@dataclasses.dataclass(frozen=True)
class Block:
    file: Path
    line: int
    lang: str
    mark: str
    body: str

    def __str__(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            mark = m["mark"] or _comment_before(text, m.start())
            found.append(Block(path, text[: m.start("lang")].count("\n") + 1, m["lang"], mark, m["body"]))
    return found


def _comment_before(text: str, at: int) -> str:
    """README's `<!-- main-command -->` marks stand on the line before the fence too."""
    before = text[:at].rstrip("\n").rsplit("\n", 1)[-1]
    found = re.fullmatch(r"<!-- ([a-z-]+) -->", before)
    return found.group(1) if found else ""


BLOCKS = blocks()
YAML_BLOCKS = [b for b in BLOCKS if b.lang == "yaml"]


def test_every_block_is_of_a_kind_the_docs_test_runs():
    """A block in a language this test does not run, or with an unknown mark, fails: nothing slips by."""
    for block in BLOCKS:
        assert block.lang in ("yaml", "sh", "ini", "text"), f"{block}: ```{block.lang}``` is not run by any test"
        assert not block.mark or block.mark in MARKS, f"{block}: unknown mark {block.mark!r}"
    assert len(YAML_BLOCKS) >= 6 and sum(b.lang == "sh" for b in BLOCKS) >= 5


def _is_settings(data: object) -> bool:
    return isinstance(data, dict) and bool(data) and set(data) <= SETTING_KEYS


@pytest.mark.parametrize("block", [b for b in YAML_BLOCKS if not b.mark], ids=str)
def test_each_yaml_example_loads_as_what_it_is(block, tmp_path, monkeypatch):
    data = yaml.safe_load(block.body)
    if _is_settings(data):
        site = tmp_path / "config.yaml"
        site.write_text(block.body)
        use_site_config(monkeypatch, str(site))
        view = load_settings({}).public_view()
        for section, values in data.items():
            shown = {k: v for k, v in view.items() if k == section or k.startswith(section + ".")}
            if section == "fleet":
                shown = {k: v for k, v in view.items() if k.startswith("fleet_")}
            assert shown, f"{block}: {section} does not show in imgbuild config"
            for key in values if isinstance(values, dict) else ():
                dotted = f"{section}.{key}" if section in SECTIONS else f"fleet_{key}"
                assert view[dotted]["source"].startswith("site config"), (str(block), dotted, view[dotted])
        return
    assert isinstance(data, dict) and "name" in data, f"{block}: neither settings nor a complete recipe (mark it)"
    _validates(block.body, tmp_path, block)


def _validates(text: str, tmp_path: Path, block: Block) -> None:
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir(exist_ok=True)
    recipe = tmp_path / "recipes" / "example.yaml"
    recipe.parent.mkdir(exist_ok=True)
    recipe.write_text(text)
    load_recipe(recipe)  # raises a RecipeError naming file, line and field


@pytest.mark.parametrize("block", [b for b in YAML_BLOCKS if b.mark == "recipe-fragment"], ids=str)
def test_recipe_fragments_validate_inside_a_minimal_recipe(block, tmp_path):
    fragment = yaml.safe_load(block.body)
    assert isinstance(fragment, dict) and not set(fragment) & {"name", "base"}, block
    _validates(MINIMAL_RECIPE + block.body, tmp_path, block)


def _known_paths(model: type, data: object, at: str = "") -> list[str]:
    """Keys of `data` that `model` has no field for (recursing into nested models)."""
    if not isinstance(data, dict):
        return []
    fields_by_name = {f.name: f for f in dataclasses.fields(model) if "check" in f.metadata}
    unknown = []
    for key, value in data.items():
        if key not in fields_by_name:
            unknown.append(f"{at}{key}")
            continue
        check = fields_by_name[key].metadata["check"]
        for inner in (check, getattr(check, "inner", None)):
            if isinstance(inner, fields.Model):
                unknown += _known_paths(inner.cls, value, f"{at}{key}.")
    return unknown


@pytest.mark.parametrize("block", [b for b in YAML_BLOCKS if b.mark == "reference"], ids=str)
def test_reference_listings_name_only_real_fields(block):
    from imgbuild.recipe import Recipe

    data = yaml.safe_load(block.body.replace("[...]", "[]"))
    assert not _known_paths(Recipe, data), f"{block}: not recipe fields: {_known_paths(Recipe, data)}"
    assert len(data) >= 15, block  # the listing is the whole recipe


def test_the_config_sections_the_docs_name_are_the_typed_ones():
    named = {key for b in YAML_BLOCKS if not b.mark for key in (yaml.safe_load(b.body) or {}) if key in SETTING_KEYS}
    assert {"run", "slurm", "fleet"} <= named
    assert not _known_paths(Fleet, {"gpus": [], "driver": None})


# --- command lines ---------------------------------------------------------------------------------------


def _imgbuild_lines(text: str) -> list[list[str]]:
    """Every `imgbuild ...` invocation in shell text: `&&`, `|` and `;` chains split, sudo and paths dropped; a
    here-document's body (a script for another program) is not shell."""
    found = []
    ending = ""
    for line in text.replace("\\\n", " ").splitlines():
        if ending:
            ending = "" if line.strip() == ending else ending
            continue
        if heredoc := re.search(r"<<-?'?(\w+)'?", line):
            ending = heredoc.group(1)
        line = line.split(" #", 1)[0]
        if line.lstrip().startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            words = shlex.split(part.replace("$(", "( ").replace("${{", "{{"), comments=True)
            words = [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]
            while words and words[0] in ("sudo", "exec", "-", "run:", "script:"):
                words = words[1:]
            if words and Path(words[0]).name == "imgbuild":
                found.append(words[1:])
    return found


def _parse(args: list[str], where: str) -> None:
    import click

    from imgbuild.cli import cli

    try:
        ctx = cli.make_context("imgbuild", list(args), resilient_parsing=False)
        with warnings.catch_warnings():  # click 8.2 moves the subcommand from protected_args to args
            warnings.simplefilter("ignore", DeprecationWarning)
            words = [*ctx.protected_args, *ctx.args]
        name, command, rest = cli.resolve_command(ctx, words)
        assert command is not None, f"{where}: imgbuild {name}: no such command"
        command.make_context(name, rest, parent=ctx)
    except click.exceptions.Exit:
        pass
    except click.ClickException as exc:
        pytest.fail(f"{where}: `imgbuild {shlex.join(args)}` does not parse: {exc.format_message()}")


COMMAND_SOURCES = [b for b in BLOCKS if b.lang in ("sh", "ini") and b.mark != "partial"]


@pytest.mark.parametrize("block", COMMAND_SOURCES, ids=str)
def test_each_imgbuild_command_in_the_docs_parses(block):
    body = block.body
    if block.lang == "ini":  # a systemd unit: the command is what ExecStart says
        body = "\n".join(ln.split("=", 1)[1] for ln in body.splitlines() if ln.startswith("ExecStart="))
    for args in _imgbuild_lines(body):
        _parse(args, str(block))


@pytest.mark.parametrize("path", CI_FILES, ids=lambda p: p.name)
def test_the_ci_examples_load_and_their_imgbuild_commands_parse(path):
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    commands = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("run", "script", "before_script") and isinstance(value, (str, list)):
                    commands.extend(value if isinstance(value, list) else [value])
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    lines = [args for text in commands for args in _imgbuild_lines(str(text))]
    # the GitLab fan-out's parent only plans (its child pipeline, generated, runs the rest: tests/test_fanout.py),
    # and the file it includes holds the runners' set-up
    assert len(lines) >= {"gitlab-fanout.yml": 1, "gitlab-imgbuild-runner.yml": 0}.get(path.name, 3), path
    for args in lines:
        _parse(args, path.name)


@pytest.mark.root("names a site config for imgbuild processes it starts (root's alone)")
def test_the_readme_reap_example_works_in_the_site_config(tmp_path):
    """README's `run:` + `reap:` block in /etc/imgbuild/config.yaml broke every command."""
    from tests.conftest import run_cli

    block = next(b for b in YAML_BLOCKS if b.file.name == "servers.md" and "reap" in (yaml.safe_load(b.body) or {}))
    site = tmp_path / "config.yaml"
    site.write_text(block.body)
    env = {"IMGBUILD_SITE_CONFIG": str(site)}
    shown = run_cli("config", "--json", env=env)
    assert shown.code == 0, shown.err
    assert '"reap.idle_timeout"' in shown.out and "site config" in shown.out
    valid = run_cli("validate", str(ROOT / "recipes" / "pytorch-research.yaml"), env=env)
    assert valid.code == 0, valid.err


@pytest.mark.root("names a site config for imgbuild processes it starts (root's alone)")
def test_a_misspelt_key_in_any_section_is_one_located_line(tmp_path):
    from tests.conftest import run_cli

    site = tmp_path / "config.yaml"
    for text, where in (
        ("reap:\n  idle_timout: 4h\n", "config.yaml:2:3: reap.idle_timout: unknown key (did you mean 'idle_timeout'?)"),
        ("run:\n  max_gpu_per_user: 2\n", "config.yaml:2:3: run.max_gpu_per_user: unknown key (did you mean"),
        ("slurm:\n  partitoin: gpu\n", "config.yaml:2:3: slurm.partitoin: unknown key (did you mean 'partition'?)"),
        ("fleet:\n  gpu: [v100]\n", "config.yaml:2:3: fleet.gpu: unknown key (did you mean 'gpus'?)"),
        ("ngc_registy: x\n", "config.yaml:1:1: ngc_registy: unknown setting (did you mean 'ngc_registry'?)"),
    ):
        site.write_text(text)
        res = run_cli(
            "validate", str(ROOT / "recipes" / "pytorch-research.yaml"), env={"IMGBUILD_SITE_CONFIG": str(site)}
        )
        assert res.code == 2 and where in res.err and len(res.err.strip().splitlines()) == 1, (text, res.err)
        assert "Traceback" not in res.err


def test_a_wrong_example_would_fail_this_test(tmp_path, monkeypatch):
    """The checks above can fail: an unknown flag, an unknown command, a misspelt setting, a bad recipe."""
    assert _imgbuild_lines("sudo imgbuild reap --dry-run && X=1 .venv/bin/imgbuild gpus --json | jq .") == [
        ["reap", "--dry-run"],
        ["gpus", "--json"],
    ]
    for args in (["build", "--no-such-flag", "r.yaml"], ["no-such-command"], ["smoke"]):
        with pytest.raises(pytest.fail.Exception, match="does not parse"):
            _parse(args, "example")
    bad = Block(ROOT / "README.md", 1, "yaml", "", "run:\n  max_gpu_per_user: 2\n")
    with pytest.raises(Exception, match="unknown key"):
        test_each_yaml_example_loads_as_what_it_is(bad, tmp_path, monkeypatch)
    with pytest.raises(Exception, match="smoke.targets"):
        _validates(MINIMAL_RECIPE + "smoke: {targets: [quantum9000]}\n", tmp_path, bad)


def test_the_committed_config_schema_is_generated_from_the_declarations():
    import json

    from imgbuild.config.model import json_schema

    committed = json.loads((ROOT / "docs" / "config.schema.json").read_text())
    assert committed == json_schema(), (
        "docs/config.schema.json is stale: imgbuild schema --config > docs/config.schema.json"
    )
    run = committed["$defs"]["RunRules"]["properties"]
    assert run["max_time"]["x-site-only"] == "lower" and run["state_dir"]["x-site-only"] == "never"
    assert set(committed["properties"]) >= {"run", "reap", "slurm", "fleet", "ngc_registry"}


def test_the_readme_settings_table_is_the_one_made_from_the_declarations():
    """Every flat setting is in README's table, with the default and meaning declared beside it in Settings: a
    setting added, renamed or re-defaulted without the table fails here (the table is pasted, never hand-edited)."""
    from imgbuild.config.model import settings_table

    text = (ROOT / "README.md").read_text()
    made = settings_table()
    start = text.index("<!-- settings-table")
    shown = text[text.index("\n", start) + 1 : text.index("<!-- /settings-table -->")]
    assert shown == made, "README.md: paste `imgbuild schema --config --table` between the settings-table marks"
    flat = [
        f.name for f in dataclasses.fields(Settings) if f.name not in (*NOT_SETTINGS, "run", "reap", "slurm", "k8s")
    ]
    assert all(f"| `{name}` |" in made for name in flat), "every flat setting needs doc= in its setting() declaration"
    secret = {f.name for f in dataclasses.fields(Settings) if not f.repr and f.name not in NOT_SETTINGS}
    assert secret == {"ngc_api_key", "pip_index_url", "pip_extra_index_urls"}


def test_schema_table_prints_the_settings_table_and_wants_config():
    from imgbuild.config.model import settings_table
    from tests.conftest import run_cli

    assert run_cli("schema", "--config", "--table").out == settings_table()
    refused = run_cli("schema", "--table")
    assert refused.code == 2 and "--table goes with --config" in refused.err


def test_the_readme_table_of_stand_in_differences_is_the_recorded_one():
    from tests import ngc_facts

    page = ROOT / "docs" / "development.md"
    assert ngc_facts.readme_table() in page.read_text(), "docs/development.md: paste tests/ngc_facts.readme_table()"
    for fact, real, _, why in ngc_facts.DIFFERENCES:
        assert fact and why and real


@pytest.mark.parametrize("path", CI_FILES, ids=lambda p: p.name)
def test_the_ci_examples_settings_are_real_settings_with_valid_values(path):
    """An `IMGBUILD_*` variable a CI example sets is a setting imgbuild reads, with a value it accepts (a literal;
    the CI system's own expansions are not imgbuild's to check)."""
    from imgbuild.config.settings import load_settings

    data = yaml.safe_load(path.read_text())
    found: dict[str, str] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("env", "variables") and isinstance(value, dict):
                    found.update({k: str(v) for k, v in value.items() if str(k).startswith("IMGBUILD_")})
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data)
    assert "IMGBUILD_REGISTRY_CACHE" in found, path  # the CI examples use the registry cache
    literal = {k: v for k, v in found.items() if "$" not in v}
    settings = load_settings(environ={**literal, "IMGBUILD_CONFIG": "/nonexistent"})
    for key in literal:
        name = key.removeprefix("IMGBUILD_").lower()
        assert settings.sources.get(name) == f"env {key}", (path, key)


def test_the_reaper_unit_sees_the_state_folder_users_write():
    """A unit with PrivateTmp gets a /var/tmp of its own: the reaper would read an empty ledger and queue at every
    run while the default state folder is under /var/tmp."""
    from imgbuild.config.site import DEFAULT_STATE_DIR

    units = [b for b in BLOCKS if b.lang == "ini" and "imgbuild reap" in b.body and "ExecStart=" in b.body]
    assert units
    for unit in units:
        if DEFAULT_STATE_DIR.startswith(("/tmp/", "/var/tmp/")):
            assert "PrivateTmp=true" not in unit.body, str(unit)


def test_the_docs_name_the_default_state_folder_the_code_uses():
    """The ledger's default folder has one home (config.site.DEFAULT_STATE_DIR): a page naming another default
    sends an admin to make, back up or exempt from PrivateTmp a folder nothing reads."""
    from imgbuild.config.site import DEFAULT_STATE_DIR

    named = {
        (path.name, m.group(0))
        for path in DOCS
        for m in re.finditer(r"/var/(?:lib|tmp)/imgbuild(?![\w.-])", path.read_text(encoding="utf-8"))
    }
    assert named and {folder for _, folder in named} == {DEFAULT_STATE_DIR}, sorted(named)


# --- links -----------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped (hyphens and underscores kept),
    each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    """Every anchor a Markdown file has: its headings' (repeats numbered -1, -2, as GitHub does)."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    seen: dict[str, int] = {}
    anchors = set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            inline = tokens[i + 1]
            words = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
            slug = _slug(words)
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link and image of a Markdown file, as the Markdown parser reads them."""
    from markdown_it import MarkdownIt

    found = []
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(((token.map or [0])[0] + 1, str(child.attrs.get("href", ""))))
            elif child.type == "image":
                found.append(((token.map or [0])[0] + 1, str(child.attrs.get("src", ""))))
    return found


def broken_links(files: list[Path]) -> list[str]:
    """Each relative link (to a file, a folder or an anchor) of `files` that leads nowhere, as FILE:LINE: target."""
    broken = []
    for path in files:
        text = path.read_text()
        for line, target in _links(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or not target:  # https:, mailto: ...: not ours to check
                continue
            name, _, anchor = target.partition("#")
            goal = (path.parent / name).resolve() if name else path
            if not goal.exists():
                broken.append(f"{path.relative_to(ROOT)}:{line}: {target} (no such file)")
            elif anchor and goal.suffix == ".md" and anchor not in _anchors(goal.read_text()):
                broken.append(f"{path.relative_to(ROOT)}:{line}: {target} (no such heading)")
    return broken


def test_every_relative_link_and_anchor_in_the_docs_leads_somewhere():
    assert broken_links(DOCS) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Getting started\n\n## Getting started\n\nsee [b](b.md), [c](c.md#nowhere)\n")
    (tmp_path / "c.md").write_text("# Elsewhere\n\n[back](a.md#getting-started-1) [up](a.md#getting-started)\n")
    assert broken_links([tmp_path / "a.md", tmp_path / "c.md"]) == [
        "a.md:5: b.md (no such file)",
        "a.md:5: c.md#nowhere (no such heading)",
    ]


def test_the_commands_ci_runs_select_the_suites_tiers_as_the_collection_guard_states_them():
    """README's test command (the unit tier and the front door, in one run) and tests/rest-tier select by the
    marker expressions the collection guard checks every test against (each test in exactly one tier), so CI runs
    every test once."""
    from tests.conftest import TIERS

    readme = (ROOT / "README.md").read_text()
    rest = (ROOT / "tests" / "rest-tier").read_text()
    assert f'-m "({TIERS["unit"]}) or ({TIERS["front door"]})"' in readme
    for tier, expression in TIERS.items():
        if tier not in ("unit", "front door"):
            assert f'"{expression}"' in rest, tier
    assert "```sh\ntests/rest-tier\n```" in readme
