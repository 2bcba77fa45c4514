"""Generated hostile recipes (Hypothesis, a fixed seed): recipes drawn from docs/recipe.schema.json, and valid
recipes with one field made hostile (invisible characters, other scripts' digits, credentials, imgbuild's own
names, other spellings of a protected registry). For each: `validate` and `render` give one verdict on what is
decidable with no registry, every refusal is one located line per problem, nothing is written outside the
context, and no credential reaches the context."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given  # noqa: E402
from hypothesis import settings as hsettings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from imgbuild.errors import ImgbuildError, RecipeError  # noqa: E402
from imgbuild.pipeline.context import write_context  # noqa: E402
from imgbuild.pipeline.plan import check_offline, make_plan  # noqa: E402
from imgbuild.pipeline.render import render, template_cache  # noqa: E402
from imgbuild.pipeline.resolve import check_known  # noqa: E402
from imgbuild.recipe import load_recipe  # noqa: E402
from imgbuild.text import unsafe_character  # noqa: E402
from tests.support import fake_inspect, settings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "docs" / "recipe.schema.json").read_text())
#: A fixed seed and a small budget: the suite runs in CI on two cores.
FIXED = hsettings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=25,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is shown as drawn, within the budget
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
#: One refusal line: FILE:LINE:COL: FIELD: what (hint).
LINE_RE = re.compile(r"[^\n]+:\d+:\d+: [^\n]+: [^\n]+")
#: CPU seconds one recipe's validate and render may take (a hostile shape must not make either slow).
CPU_BOUND = 5.0
#: Fields whose verdict needs the base's own facts (its framework's version, its pins), read by render only.
NEEDS_THE_BASE = ("pip.", "lock")
BASE = {"framework": "pytorch", "tag": "24.05"}


@functools.cache
def _compiled_templates():
    """Compiled templates kept across examples (a render compiles them anew otherwise: most of its time)."""
    import tempfile

    return template_cache(tempfile.mkdtemp(prefix="imgbuild-generated-"))


def _verdicts(folder: Path, data: dict) -> tuple[RecipeError | None, ImgbuildError | None, Path]:
    """(validate's refusal, render's refusal, the context folder) for the recipe `data`, both offline; any other
    exception is a traceback and fails. Both together stay within CPU_BOUND, and nothing is written beside the
    recipe but the context (and the settings' cache)."""
    import time

    for old in folder.glob("*"):
        if old.is_file():
            old.unlink()
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    before = _written(folder)
    started = time.process_time()
    conf = settings(cache_dir=str(folder / "cache"))
    said: RecipeError | None = None
    try:
        loaded = load_recipe(path, environ={})
        check_offline(loaded)
        check_known(loaded, conf)
    except RecipeError as exc:
        said = exc
    out = folder / "ctx"
    done: ImgbuildError | None = None
    try:
        plan = make_plan(load_recipe(path, environ={}), conf, fake_inspect, lambda repo, fw, tag: "24.05-py3")
        write_context(render(plan, "buildkit", cache=_compiled_templates()), out)
    except ImgbuildError as exc:
        done = exc
    assert time.process_time() - started < CPU_BOUND, f"validate and render took over {CPU_BOUND} s of CPU"
    assert _written(folder) == before, "something was written outside the context"
    return said, done, out


def _written(folder: Path) -> set[Path]:
    """Everything in the recipe's folder but its context and the settings' cache, and everything beside it. Only
    the folder is walked: its parent is the session's temporary root, which holds every other test's files (walking
    it for each drawn example made the suite quadratic in its own leftovers)."""
    kept = (folder / "ctx", folder / "cache")
    inside = {p for p in folder.rglob("*") if not any(p == k or k in p.parents for k in kept)}
    return inside | set(folder.parent.iterdir())


def _fields(exc: ImgbuildError) -> list[str]:
    return [problem.field for problem in exc.problems] if isinstance(exc, RecipeError) else ["(usage)"]


def _assert_one_located_line_each(exc: ImgbuildError) -> None:
    assert exc.exit_code == 2, exc
    if isinstance(exc, RecipeError):
        for problem, line in zip(exc.problems, exc.lines(), strict=True):
            assert LINE_RE.fullmatch(line) and f" {problem.field}: " in line, line
            assert unsafe_character(line) is None, line  # nothing that breaks the line or hides from a reader


def _assert_inside(out: Path) -> None:
    if not out.exists():
        return
    root = out.resolve()
    for path in out.rglob("*"):
        assert not path.is_symlink(), path
        assert root in path.resolve().parents, path


def _agree(said: RecipeError | None, done: ImgbuildError | None) -> None:
    """validate refuses what render refuses, but for what needs the base's facts."""
    if said is not None:
        assert done is not None, f"validate refused, render did not: {said}"
        _assert_one_located_line_each(said)
    if done is not None:
        _assert_one_located_line_each(done)
        if said is None:
            assert all(field.startswith(NEEDS_THE_BASE) for field in _fields(done)), f"only render refused: {done}"


def _schema_recipes():
    """A recipe drawn from the whole schema, or one on a real base whose other fields are each drawn from their own
    part of the schema (most of these get past the first field, so the rules further in are reached)."""
    from hypothesis_jsonschema import from_schema

    fields = {
        name: from_schema({"$defs": SCHEMA.get("$defs", {}), **part})
        for name, part in SCHEMA["properties"].items()
        if name not in ("name", "base", "extends", "files", "platforms")  # files name the repository's own files
    }
    on_a_base = st.fixed_dictionaries({"name": st.just("demo"), "base": st.just(BASE)}, optional=fields)
    return st.one_of(from_schema(SCHEMA), on_a_base)


@hsettings(FIXED, max_examples=50)
@given(data=st.deferred(_schema_recipes))
def test_recipes_drawn_from_the_schema_get_one_verdict(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("drawn", numbered=True)
    (folder / ".git").mkdir()
    said, done, out = _verdicts(folder, data)
    _agree(said, done)
    _assert_inside(out)


#: Characters no reader sees or no terminal shows as themselves, by Unicode category.
HIDDEN = st.characters(categories=["Cc", "Cf", "Co", "Zl", "Zp"], exclude_characters="\t")
#: Free-text fields: where a value goes in the recipe.
TEXT_FIELDS = {
    "description": lambda v: {"description": v},
    "run[0]": lambda v: {"run": [v]},
    "env.NOTE": lambda v: {"env": {"NOTE": v}},
    "labels.note": lambda v: {"labels": {"note": v}},
    "args.NOTE": lambda v: {"args": {"NOTE": v}},
    "smoke.run[0]": lambda v: {"smoke": {"run": [v]}},
    "cmd": lambda v: {"cmd": v},
    "entrypoint[0]": lambda v: {"entrypoint": [v, "x"]},
    "tag": lambda v: {"tag": v},
    "smoke.skip_imports[0]": lambda v: {"smoke": {"skip_imports": [v]}},
}


@FIXED
@given(
    field=st.sampled_from(sorted(TEXT_FIELDS)),
    before=st.text(alphabet=st.characters(categories=["L", "N", "Zs"]), max_size=8),
    hidden=HIDDEN,
)
def test_a_hidden_character_in_any_text_field_is_refused_at_that_field(tmp_path_factory, field, before, hidden):
    folder = tmp_path_factory.mktemp("hidden", numbered=True)
    (folder / ".git").mkdir()
    data = {"name": "demo", "base": BASE, **TEXT_FIELDS[field](f"echo {before}{hidden}x")}
    said, done, out = _verdicts(folder, data)
    assert said is not None and field in _fields(said), (field, hex(ord(hidden)), said)
    _agree(said, done)


#: detect-secrets' own documented example shapes and the issuers' published formats, each a fresh draw.
SECRET_SHAPES = [
    ("nvapi-", "[A-Za-z0-9_-]{40,64}"),
    ("dckr_pat_", "[A-Za-z0-9_-]{27}"),
    ("AIza", "[A-Za-z0-9_-]{35}"),
    ("r8_", "[A-Za-z0-9]{37}"),
    ("hf_", "[A-Za-z0-9]{34}"),
    ("ghp_", "[A-Za-z0-9]{36}"),
    ("glpat-", "[A-Za-z0-9_-]{20}"),
    ("AKIA", "[A-Z0-9]{16}"),
    ("sk_live_", "[A-Za-z0-9]{24}"),
    ("xoxb-", "[0-9]{12}-[A-Za-z0-9]{24}"),
    ("https://user:", "[a-z0-9]{12}@git.example/repo.git"),
    ("PGPASSWORD=", "[a-z0-9]{12}"),
    ("SG.", "[A-Za-z0-9_-]{22}\\.[A-Za-z0-9_-]{43}"),
    ("https://", "[0-9a-f]{40}@github.com/lab/repo.git"),
    ("curl -u admin:", "[a-z0-9]{10}"),
]


@st.composite
def secrets(draw):
    prefix, tail = draw(st.sampled_from(SECRET_SHAPES))
    return prefix + draw(st.from_regex(f"\\A{tail}\\Z"))


@FIXED
@given(field=st.sampled_from(sorted(TEXT_FIELDS)), secret=secrets(), words=st.sampled_from(["", "git clone ", "key "]))
def test_no_secret_shaped_value_reaches_the_context(tmp_path_factory, field, secret, words):
    folder = tmp_path_factory.mktemp("secret", numbered=True)
    (folder / ".git").mkdir()
    data = {"name": "demo", "base": BASE, **TEXT_FIELDS[field](f"{words}{secret}")}
    said, done, out = _verdicts(folder, data)
    assert said is not None and done is not None, (field, secret)
    assert secret not in str(said) + str(done)
    assert not out.exists() or not any(secret in p.read_text() for p in out.rglob("*") if p.is_file())


@st.composite
def mirror_spellings(draw):
    """`registry.test:5000`, the site's mirror, as the engine would also read it."""
    host = "".join(c.upper() if draw(st.booleans()) else c for c in "registry.test")
    return f"{host}:{draw(st.sampled_from(['5000', '05000']))}"


@FIXED
@given(spelling=mirror_spellings(), tag=st.sampled_from(["24.05-py3", "mine", "latest"]))
def test_the_mirrors_base_by_any_spelling_is_refused_as_a_target(tmp_path_factory, spelling, tag):
    folder = tmp_path_factory.mktemp("target", numbered=True)
    (folder / ".git").mkdir()
    data = {"name": "x", "image": f"{spelling}/nvidia/pytorch:{tag}", "base": BASE}
    said, done, _ = _verdicts(folder, data)
    assert said is not None and done is not None and _fields(said) == ["image"], said
    _agree(said, done)


@FIXED
@given(
    field=st.sampled_from(["tag", "workdir", "labels"]),
    arch=st.sampled_from(["-arm64", "-amd64", "-previous", "-candidate", "-arm64-previous"]),
)
def test_names_imgbuild_keeps_are_refused_by_validate_and_render(tmp_path_factory, field, arch):
    folder = tmp_path_factory.mktemp("reserved", numbered=True)
    (folder / ".git").mkdir()
    value = {
        "tag": {"tag": f"v1{arch}"},
        "workdir": {"workdir": "/opt/imgbuild" + ("/w" if "arm" in arch else "")},
        "labels": {"labels": {"org.opencontainers.image.base.digest": "sha256:" + "0" * 64}},
    }[field]
    said, done, _ = _verdicts(folder, {"name": "demo", "base": BASE, **value})
    assert said is not None and done is not None, (field, arch)
    _agree(said, done)
