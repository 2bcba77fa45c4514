"""The requirement sets of ten real projects and four known conflicts, as recipes on the stand-in bases
(issue 19), with what each must end in. `sets.yaml` is the table; each recipe's `.lock.txt` (written by
`imgbuild lock`) pins what was resolved, so a set builds the same packages next year.

Used by tests/test_realsets.py (small sets in CI, heavy ones with `-m heavy`) and benchmarks/realsets.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).parent


@dataclass(frozen=True)
class RealSet:
    name: str
    size: str  # "small" (CI) or "heavy"
    expect: str  # "built", or the words of the one line it must fail with
    exit: int  # 0 built, 1 failed in the pip step or the smoke test, 2 refused at plan time
    source: str
    init: str = ""  # `imgbuild init NAME` arguments that write the recipe (from NAME.pyproject.toml), else ""

    def stage(self, project: Path) -> Path:
        """Copy the recipe, its requirements files, its task and its lock into a repository of their own; a set
        made by `imgbuild init` gets its project file (NAME.pyproject.toml) at the root, as pyproject.toml."""
        (project / ".git").mkdir(parents=True, exist_ok=True)
        recipes = project / "recipes"
        recipes.mkdir(exist_ok=True)
        for path in HERE.glob(f"{self.name}.*"):
            if path.name == f"{self.name}.pyproject.toml":
                shutil.copyfile(path, project / "pyproject.toml")
            else:
                shutil.copyfile(path, recipes / path.name)
        return recipes / f"{self.name}.yaml"

    def prepare(self, project: Path, imgbuild: Callable[[list[str]], int]) -> Path:
        """The staged recipe, written by `imgbuild init` first where the set says so (`imgbuild` runs the CLI in
        `project` and returns its exit status), with the set's task (NAME.task.py) added to it as its user adds it."""
        recipe = self.stage(project)
        if not self.init:
            return recipe
        if imgbuild(["init", self.name, *self.init.split()]) != 0:
            raise RuntimeError(f"imgbuild init {self.name} {self.init} failed")
        task = recipe.parent / f"{self.name}.task.py"
        if task.exists():
            data = yaml.safe_load(recipe.read_text())
            data.setdefault("files", []).append({"src": task.name, "dest": f"/workspace/{self.name}_task.py"})
            data.setdefault("smoke", {}).setdefault("run", []).append(f"python3 /workspace/{self.name}_task.py")
            recipe.write_text(yaml.safe_dump(data, sort_keys=False))
        return recipe

    def problems(self, code: int, err: str, project: Path) -> list[str]:
        """What is wrong with how the build ended ([] when it ended as the table says)."""
        found = []
        if code != self.exit:
            found.append(f"exit {code}, expected {self.exit}")
        if self.expect != "built" and self.expect not in " ".join(err.split()):
            found.append(f"no {self.expect!r} in the error")
        if "Traceback" in err:
            found.append("a traceback")
        if code == 0:
            report = json.loads((project / "images" / self.name / "smoke.json").read_text())
            checks = {c["name"]: c for c in report["checks"]}
            if checks.get("imports", {}).get("status") != "pass":
                found.append(f"imports check: {checks.get('imports')}")
        return found


def load() -> dict[str, RealSet]:
    table = yaml.safe_load((HERE / "sets.yaml").read_text())
    return {name: RealSet(name=name, **row) for name, row in table.items()}
