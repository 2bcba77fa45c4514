"""Runs inside a stand-in while it is built: gives its framework NGC's version shapes (stdlib only).

    python3 ngc_shape.py FACTS_JSON

FACTS_JSON is one `tests/ngc_facts.py standin` answer. PyTorch: `torch.__version__` becomes the NGC string
(`2.13.0a0+07cecf4168.nv24.05`) and the distribution's metadata its pip form (`...nv24.5`); TensorFlow:
the `tensorflow-cpu` distribution becomes `tensorflow` with an `+nvYY.M` version, `tf.__version__` stays
bare, as in NGC. Then `/etc/pip/constraint.txt` is written where NGC has one (pip-normalised freeze, without
the `nvidia-*` CUDA wheels, which NGC installs as system libraries) and removed where it has none. Before it, the
distributions NGC ships beside its framework are written as metadata only (bundled.py, beside this script), so the
constraint file and every freeze list them as NGC's do; and where the stand-in has a CUDA compiler from PyPI, it is
linked where NGC's is (/usr/local/cuda/bin/nvcc).
"""

import importlib.metadata as md
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bundled  # noqa: E402 - beside this script in the stand-in's build context

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


def write_bundled(site, pins, framework):
    """NGC's bundled distributions in the framework's own site-packages: a real one installed from a wheel (the CUDA
    stand-in's torchvision) takes NGC's version (its distribution and its `version.py`) and requires the base's
    framework by name, not PyPI's exact release; any other is written as metadata only."""
    for pin in pins:
        name, _, version = pin.partition("==")
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            bundled.write_metadata_only(site, name, version)
            continue
        folder = str(dist._path)  # noqa: SLF001 - the folder is what gets renamed
        version_py = pathlib.Path(site, re.sub(r"[-.]+", "_", name), "version.py")
        if version_py.exists():
            text = version_py.read_text(encoding="utf-8")
            version_py.write_text(re.sub(r"(?m)^__version__ = .*$", f"__version__ = {version!r}", text, count=1))
        meta = pathlib.Path(folder, "METADATA")
        pinned = re.compile(rf"(?m)^Requires-Dist: ({re.escape(framework)})\s*[=<>!~][^;\n]*")
        meta.write_text(pinned.sub(r"Requires-Dist: \1", meta.read_text(encoding="utf-8")), encoding="utf-8")
        rename_distribution(dist, folder, name, version)


def link_nvcc(major):
    """/usr/local/cuda/bin/nvcc, as NGC has it, to the nvcc NVIDIA's wheel installed (nvidia/cuMAJOR/bin/nvcc;
    nvcc finds cicc and its headers from its own folder)."""
    for site in sys.path:
        found = os.path.join(site, "nvidia", f"cu{major}", "bin", "nvcc")
        if os.path.isfile(found):
            os.makedirs("/usr/local/cuda/bin", exist_ok=True)
            os.symlink(found, "/usr/local/cuda/bin/nvcc")
            return
    raise SystemExit(f"ngc_shape: no nvidia/cu{major}/bin/nvcc installed")


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
    site = os.path.dirname(dist_info(WHEEL_NAMES[facts["framework"]])[1])
    {"pytorch": shape_torch, "tensorflow": shape_tensorflow}[facts["framework"]](facts)
    write_bundled(site, facts["bundled"], WHEEL_NAMES[facts["framework"]][-1])
    if facts["nvcc"]:
        link_nvcc(facts["nvcc"])
    write_constraints(facts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
