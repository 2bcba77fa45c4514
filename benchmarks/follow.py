"""A scripted user: reads the last thing imgbuild said and does literally what it says, once. The cures it
knows are the ones imgbuild prints (each a whole phrase, as written in imgbuild's messages); anything else
leaves it stuck, and that is counted against imgbuild, not guessed around.

Used by `benchmarks/realsets.py --follow`; tests/test_follow.py holds each cure to imgbuild's own words.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
APT = re.compile(r"add apt: \[([^\]]+)\]")
NO_ISOLATION = re.compile(rf"add ({NAME}) to pip\.no_build_isolation")
UNPIN = re.compile(r"pip\.unpin: \[([^\]]+)\]")
OTHER_CUDA = re.compile(rf"({NAME}(?:\[[^\]]+\])?) is built for CUDA [0-9]+.*ask for the CUDA [0-9]+ build \(([^)]+)\)")
BY_VERSION = re.compile(rf"ask for it by its version \(({NAME})==([^)\s]+)\)")
RESTORE = re.compile(rf"pin ({NAME}) to the release {NAME} was made for \(({NAME}[<>=!~][^)\s]+)\)")
LOCK = re.compile(r"run imgbuild lock")
#: a plan-time refusal at its place: FILE:LINE:COL: pip.requirements: ... or pip.packages[I]: ...
LOCATED = re.compile(r"(\S+?):([0-9]+):[0-9]+: pip\.(?:requirements|packages\[([0-9]+)\]): (.*)")


def _pip(data: dict) -> dict:
    pip = data.get("pip") or {}
    if isinstance(pip, list):
        pip = {"packages": pip}
    data["pip"] = pip
    return pip


def add(data: dict, path: tuple[str, ...], names: list[str]) -> None:
    """`names` appended to the recipe's list at `path` (`("apt",)`, `("pip", "unpin")`), each once."""
    where = data if path[0] != "pip" else _pip(data)
    key = path[-1]
    where[key] = [*where.get(key, []), *[n for n in names if n not in where.get(key, [])]]


def _replace(recipe: Path, data: dict, old: str, new: str) -> bool:
    """The requirement `old` (its name, with extras) becomes `new`, in pip.packages or the requirements file."""
    pip = _pip(data)
    key = re.sub(r"\[.*", "", old).lower()

    def same(line: str) -> bool:
        found = re.match(NAME + r"(?:\[[^\]]*\])?", line.strip())
        return bool(found) and (found.group(0) == old or re.sub(r"\[.*", "", found.group(0)).lower() == key)

    packages = pip.get("packages", [])
    if any(same(p) for p in packages):
        pip["packages"] = [new if same(p) else p for p in packages]
        return True
    if pip.get("requirements"):
        file = recipe.parent / pip["requirements"]
        lines = file.read_text().splitlines()
        if any(same(ln) for ln in lines):
            file.write_text("".join(f"{new if same(ln) else ln}\n" for ln in lines))
            return True
    return False


def _drop(said: str, recipe: Path, data: dict) -> list[str]:
    """The requirement lines whose one cure is to drop them ("the base's framework is protected: drop it"),
    dropped, each at the place the line names; what was dropped."""
    lines: dict[Path, set[int]] = {}
    items: set[int] = set()
    for line in said.splitlines():
        found = LOCATED.match(line.removeprefix("imgbuild: ").strip())
        if not found or "drop" not in found.group(4) or "pip.unpin" in found.group(4):
            continue
        if found.group(3) is not None:
            items.add(int(found.group(3)))
        else:
            file = Path(found.group(1))
            lines.setdefault(file if file.is_absolute() else recipe.parent.parent / file, set()).add(
                int(found.group(2))
            )
    dropped = []
    pip = _pip(data)
    if items:
        dropped += [p for i, p in enumerate(pip.get("packages", [])) if i in items]
        pip["packages"] = [p for i, p in enumerate(pip.get("packages", [])) if i not in items]
    for file, numbers in lines.items():
        text = file.read_text().splitlines()
        dropped += [ln for n, ln in enumerate(text, 1) if n in numbers]
        file.write_text("".join(f"{ln}\n" for n, ln in enumerate(text, 1) if n not in numbers))
    return dropped


def _listed(pattern: re.Pattern[str], text: str, data: dict, path: tuple[str, ...]) -> str:
    """Every `[a, b]` list the words give in `pattern`'s phrase (every line's, as a user reading them all would:
    one round), added to the recipe's list at `path`; what was done, or "" where the words give none."""
    names = list(dict.fromkeys(n.strip() for found in pattern.findall(text) for n in found.split(",")))
    if names:
        add(data, path, names)
    return f"{'.'.join(path)}: [{', '.join(names)}]" if names else ""


def follow(said: str, recipe: Path, run: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> str | None:
    """Apply the first cure imgbuild's words name; what was done, or None (no cure it can follow)."""
    text = " ".join(said.split())
    data = yaml.safe_load(recipe.read_text())
    done: str | None = None
    if found := OTHER_CUDA.search(text):
        done = f"asked for {found.group(2)}" if _replace(recipe, data, found.group(1), found.group(2)) else None
    elif found := NO_ISOLATION.search(text):  # "... add apt: [g++, python3-dev] too": both, as the line says
        add(data, ("pip", "no_build_isolation"), [found.group(1)])
        also = _listed(APT, text, data, ("apt",))
        done = f"pip.no_build_isolation: [{found.group(1)}]" + (f", {also}" if also else "")
    elif listed := _listed(APT, text, data, ("apt",)) or _listed(UNPIN, text, data, ("pip", "unpin")):
        done = listed
    elif found := RESTORE.search(text):
        add(data, ("pip", "constraints"), [found.group(2)])
        done = f"pip.constraints: [{found.group(2)}]"
    elif found := BY_VERSION.search(text):
        pin = f"{found.group(1)}=={found.group(2)}"
        done = f"asked for {pin}" if _replace(recipe, data, found.group(1), pin) else None
    elif LOCK.search(text):
        proc = run(["lock", str(recipe)])
        return "imgbuild lock" if proc.returncode == 0 else None
    elif dropped := _drop(said, recipe, data):
        done = "dropped " + ", ".join(dropped)
    if done:
        recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    return done


def imgbuild(cwd: Path) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "imgbuild", *args], cwd=cwd, capture_output=True, text=True)

    return run
