"""`imgbuild bump`: move recipes that follow a framework (`base.follow: 24.*` or `latest`) to the newest
NGC tag matching their pattern, editing the YAML in place (comments and layout kept) for a human to review,
and re-rendering their contexts, the way dependency bots open pull requests."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.errors import UsageError
from imgbuild.ngc import FRAMEWORKS, expand_tag, parse_tag
from imgbuild.yamlpos import load_located

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.ngc import NgcTag


@dataclass
class Bump:
    recipe: str
    framework: str
    pattern: str
    current: str
    newest: str  # the tag the recipe moves to (the newest one its fleet can run)
    changed: bool
    held_back: list[str] = field(default_factory=list)  # newer tags its fleet cannot run, and why

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _rewrite_scalar(text: str, line: int, col: int, old: str, new: str) -> str:
    """`text` with the scalar `old` at line:col replaced by `new`; its quotes, an anchor before it (`&t`), the
    line endings (CRLF stays CRLF) and a byte-order mark kept."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    lines = text[len(bom) :].splitlines(keepends=True)
    row = lines[line - 1]
    head, rest = row[: col - 1], row[col - 1 :]
    if rest.startswith("*"):
        raise UsageError(
            f"line {line}: base.tag is a YAML alias ({rest.split()[0][:40]}); write the tag in place to bump it"
        )
    anchor = re.match(r"&[^\s]+\s+", rest)
    if anchor:
        head, rest = head + anchor.group(0), rest[anchor.end() :]
    quote = rest[0] if rest[:1] in "\"'" else ""
    if not rest[len(quote) :].startswith(old):
        raise UsageError(f"line {line}: expected {old!r} at column {col}; the file changed while bumping, run again")
    rest = quote + new + rest[len(quote) + len(old) :]
    lines[line - 1] = head + rest
    return bom + "".join(lines)


def _newer(tag: NgcTag | None, have: NgcTag | None) -> bool:
    return tag is not None and (have is None or tag > have)


#: `fits(framework, tag, recipe_targets) -> (ok, why)`: can the recipe's fleet run that tag?
Fits = Callable[[str, str, list[str]], tuple[bool, str]]


def bump(
    paths: list[Path],
    *,
    tags_for: Callable[[str], list[str]],
    dry_run: bool = False,
    fits: Fits | None = None,
) -> list[Bump]:
    """`tags_for(framework) -> list[str]`: the registry's tags (injected in tests). A newer tag the fleet
    cannot run (`fits`) is passed over, never moved to: the next newer one that fits is taken instead."""
    from imgbuild.ngc import matching

    results: list[Bump] = []
    for path in paths:
        if path.is_symlink():
            raise UsageError(f"{path}: a symbolic link; bump edits recipes in place, never through a link")
        located = load_located(path, str(path))
        data = located.data if isinstance(located.data, dict) else {}
        base = data.get("base")
        if not isinstance(base, dict) or not base.get("follow"):
            continue
        framework, pattern, current = base.get("framework"), str(base["follow"]), str(base.get("tag", ""))
        if framework not in FRAMEWORKS:
            raise UsageError(f"{path}: base.follow needs base.framework")
        smoke = data.get("smoke")
        listed = smoke.get("targets") if isinstance(smoke, dict) else None
        targets = [str(t) for t in listed] if isinstance(listed, list) else []
        have = parse_tag(expand_tag(framework, current))
        newer = [t for t in matching(framework, pattern, tags_for(framework)) if _newer(parse_tag(t), have)]
        held: list[str] = []
        newest = ""
        for tag in newer:
            ok, why = fits(framework, tag, targets) if fits else (True, "")
            if ok:
                newest = tag
                break
            held.append(f"{tag}: {why}")
        changed = bool(newest)
        newest = newest or (have.text if have else "")
        if changed and not dry_run:
            want = parse_tag(newest)
            short = current == (have.release if have else None)  # keep the recipe's style: 24.05 vs 24.05-py3
            new_text = want.release if (short and want) else newest
            pos = located.values[("base", "tag")]
            key = located.keys.get(("base", "tag"))
            if key is not None and (key.line, key.col) > (pos.line, pos.col):  # an alias: the value stands earlier
                raise UsageError(f"{path}:{key.line}: base.tag is a YAML alias; write the tag in place to bump it")
            with open(path, encoding="utf-8", newline="") as handle:  # newline="": CRLF read and written as it is
                text = handle.read()
            from imgbuild.hostio.regular import write_atomic

            write_atomic(path, _rewrite_scalar(text, pos.line, pos.col, current, new_text))  # a kill leaves one whole
        results.append(Bump(str(path), framework, pattern, current, newest, changed, held))
    return results


def bump_and_render(paths: list[Path], settings: Settings, *, dry_run: bool = False) -> list[Any]:
    """`imgbuild bump`: move each following recipe to the newest matching tag in the registry, and render
    again the contexts of the recipes that moved (where one was rendered before)."""
    from imgbuild.gpu.fleet import judge_tag, ok_and_why
    from imgbuild.gpu.read import gpu_devices_present
    from imgbuild.pipeline.context import context_dir, render_into
    from imgbuild.pipeline.resolve import plan_recipe
    from imgbuild.pipeline.smoke import declared_fleet
    from imgbuild.recipe import load_recipe
    from imgbuild.registry import tags as tagmod
    from imgbuild.registry.client import RegistryClient

    cache = tagmod.TagCache(Path(settings.cache_dir) / "registry", settings.tag_cache_ttl)

    def tags_for(framework: str) -> list[str]:
        host, repo = tagmod.repository_for(framework, settings.ngc_registry)
        return tagmod.list_tags(RegistryClient.for_host(host, settings), repo, cache, refresh=True)[0]

    def fits(framework: str, tag: str, recipe_targets: list[str]) -> tuple[bool, str]:
        targets, driver = declared_fleet(settings, recipe_targets, gpu_devices_present())
        if not targets and not driver:
            return True, ""
        host, repo = tagmod.repository_for(framework, settings.ngc_registry)
        info = tagmod.TagInfo(tag, tag, None)
        tagmod.add_details(RegistryClient.for_host(host, settings), repo, [info], cache)
        return ok_and_why(judge_tag(tag, info.cuda, info.arch_list, targets, driver, info.platforms, info.variants))

    results = bump(paths, dry_run=dry_run, tags_for=tags_for, fits=fits)
    for moved in [] if dry_run else [r for r in results if r.changed]:
        plan = plan_recipe(load_recipe(moved.recipe, secrets=settings.secrets()), settings)
        if context_dir(plan, settings).exists():
            render_into(plan, context_dir(plan, settings), "buildkit", settings)
    return results
