"""Runs inside a stand-in while it is built: gives its framework NGC's version shapes (stdlib only).

    python3 ngc_shape.py FACTS_JSON

FACTS_JSON is one `tests/ngc_facts.py standin` answer. PyTorch: `torch.__version__` becomes the NGC string
(`2.13.0a0+07cecf4168.nv24.05`) and the distribution's metadata its pip form (`...nv24.5`); TensorFlow:
the `tensorflow-cpu` distribution becomes `tensorflow` with an `+nvYY.M` version, `tf.__version__` stays
bare, as in NGC. Then `/etc/pip/constraint.txt` is written where NGC has one (pip-normalised freeze, without
the `nvidia-*` CUDA wheels, which NGC installs as system libraries) and removed where it has none.
"""

import importlib.metadata as md
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

WHEEL_NAMES = {"pytorch": ("torch",), "tensorflow": ("tensorflow-cpu", "tensorflow_cpu", "tensorflow")}


def dist_info(names):
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        return dist, str(dist._path)  # noqa: SLF001 - the folder is what gets renamed
    raise SystemExit(f"ngc_shape: none of {names} is installed")


def rename_distribution(dist, folder, name, version):
    """The dist-info folder, METADATA's Name and Version, and RECORD's paths, as pip would have written them."""
    meta = pathlib.Path(folder, "METADATA")
    text = re.sub(r"(?m)^Name: .*$", f"Name: {name}", meta.read_text(encoding="utf-8"), count=1)
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", text, count=1), encoding="utf-8")
    old = os.path.basename(folder)
    new = f"{name.replace('-', '_')}-{version}.dist-info"
    record = pathlib.Path(folder, "RECORD")
    if record.exists():
        record.write_text(record.read_text(encoding="utf-8").replace(old + "/", new + "/"), encoding="utf-8")
    # A copy, not a rename: overlayfs refuses to rename a folder of a lower layer (EXDEV).
    shutil.copytree(folder, os.path.join(os.path.dirname(folder), new))
    shutil.rmtree(folder)


def shape_torch(facts):
    dist, folder = dist_info(WHEEL_NAMES["pytorch"])
    version_py = pathlib.Path(folder).parent / "torch" / "version.py"
    text = version_py.read_text(encoding="utf-8")
    version_py.write_text(
        re.sub(r"(?m)^__version__ = .*$", f"__version__ = {facts['module_version']!r}", text, count=1)
    )
    rename_distribution(dist, folder, "torch", facts["dist_version"])


def shape_tensorflow(facts):
    dist, folder = dist_info(WHEEL_NAMES["tensorflow"])
    rename_distribution(dist, folder, "tensorflow", facts["dist_version"])


def write_constraints(facts):
    for path in ("/etc/pip/constraint.txt", "/etc/pip/original_constraint.txt"):
        if os.path.exists(path):
            os.remove(path)
    if not facts["constraint_file"]:
        return
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude", "pip"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [ln for ln in frozen.splitlines() if ln and not ln.lower().startswith("nvidia-")]
    os.makedirs("/etc/pip", exist_ok=True)
    targets = ["/etc/pip/constraint.txt"] + (["/etc/pip/original_constraint.txt"] * facts["original_constraint_file"])
    for path in targets:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("".join(ln + "\n" for ln in lines))


def main(argv):
    facts = json.loads(argv[1])
    {"pytorch": shape_torch, "tensorflow": shape_tensorflow}[facts["framework"]](facts)
    write_constraints(facts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
