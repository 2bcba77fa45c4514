"""The credential shapes imgbuild ships (imgbuild/credential_shapes.json), made from the installed detect-secrets'
regex detectors: `python -m tests.credential_shapes` writes them again after an upgrade of detect-secrets;
tests/test_credentials.py keeps them current."""

from __future__ import annotations

import json
from pathlib import Path

from imgbuild.credentials import NOT_CREDENTIALS

SHAPES = Path(__file__).resolve().parent.parent / "imgbuild" / "credential_shapes.json"


def detect_secrets_shapes() -> dict:
    """{"version": detect-secrets' version, "shapes": [[secret type, pattern, re flags], ...]} of every regex
    detector it ships, but those that judge something other than a credential (NOT_CREDENTIALS)."""
    import detect_secrets.__version__ as about
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    shapes = [
        [kind, pattern.pattern, int(pattern.flags)]
        for kind, cls in sorted(get_mapping_from_secret_type_to_class().items())
        if kind not in NOT_CREDENTIALS and issubclass(cls, RegexBasedDetector)
        for pattern in cls.denylist
    ]
    return {"detector": "detect-secrets", "version": about.VERSION, "shapes": shapes}


def text() -> str:
    """The data file: one shape a line, so an upgrade's change reads as a diff of the shapes it changed."""
    data = detect_secrets_shapes()
    rows = ",\n".join(f"  {json.dumps(row)}" for row in data["shapes"])
    return f'{{"detector": "{data["detector"]}", "version": "{data["version"]}", "shapes": [\n{rows}\n]}}\n'


if __name__ == "__main__":
    SHAPES.write_text(text())
