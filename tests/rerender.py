"""Write the committed example contexts in images/ anew against the bases their locks record (no registry), as
`test_committed_example_contexts_are_current` renders them: after a change to a template or an in-image script,
`.venv/bin/python -m tests.rerender`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from imgbuild.ci.rebuild import FRESH, check_contexts
from imgbuild.config.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    settings = dataclasses.replace(load_settings(environ={}), images_dir=str(ROOT / "images"), uid=1000, gid=1000)
    items = check_contexts([str(ROOT / "recipes")], settings, rewrite=True)
    for item in items:
        print(f"{item.name}: {item.status} {'; '.join(item.reasons) or item.error}")
    return 0 if all(item.status == FRESH for item in items) else 1


if __name__ == "__main__":
    raise SystemExit(main())
