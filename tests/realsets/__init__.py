"""The requirement sets of ten real projects and four known conflicts, as recipes on the stand-in bases
(issue 19), with what each must end in. `sets.yaml` is the table; each recipe's `.lock.txt` (written by
`imgbuild lock`) pins what was resolved, so a set builds the same packages next year.

Used by tests/test_realsets.py (small sets in CI, heavy ones with `-m heavy`) and benchmarks/realsets.py.
"""

from __future__ import annotations

import json
import shutil
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

    def stage(self, project: Path) -> Path:
        """Copy the recipe, its requirements files and its lock into a repository of their own."""
        (project / ".git").mkdir(parents=True, exist_ok=True)
        recipes = project / "recipes"
        recipes.mkdir(exist_ok=True)
        for path in HERE.glob(f"{self.name}.*"):
            shutil.copyfile(path, recipes / path.name)
        return recipes / f"{self.name}.yaml"

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
