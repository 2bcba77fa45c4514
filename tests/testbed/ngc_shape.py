"""Runs inside a stand-in while it is built: gives its framework NGC's version shapes (stdlib only).

    python3 ngc_shape.py FACTS_JSON

FACTS_JSON is one `tests/ngc_facts.py standin` answer. PyTorch: `torch.__version__` becomes the NGC string
(`2.13.0a0+07cecf4168.nv24.05`) and the distribution's metadata its pip form (`...nv24.5`); TensorFlow:
the `tensorflow-cpu` distribution becomes `tensorflow` with an `+nvYY.M` version, `tf.__version__` stays
bare, as in NGC. Then `/etc/pip/constraint.txt` is written where NGC has one (pip-normalised freeze, without
the `nvidia-*` CUDA wheels, which NGC installs as system libraries) and removed where it has none. Before it, the
distributions NGC ships beside its framework are written as metadata only (bundled.py, beside this script), so the
constraint file and every freeze list them as NGC's do; where the release has real wheels (the CUDA stand-in), they
are installed first: a bundled distribution by pip, NVIDIA's compiler unpacked where NGC's is (/usr/local/cuda).
"""

import importlib.metadata as md
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

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
        pinned = re.compile(rf"(?m)^Requires-Dist: ({re.escape(framework)})\s*(?:\([^)\n]*\)|[=<>!~][^;\n]*)[ \t]*")
        meta.write_text(pinned.sub(r"Requires-Dist: \1", meta.read_text(encoding="utf-8")), encoding="utf-8")
        rename_distribution(dist, folder, name, version)


def install_wheels(folder, site, major, cuda_home="/usr/local/cuda"):
    """The release's real wheels: NVIDIA's (nvcc, cicc, crt) a system toolkit, as in NGC: their nvidia/cuMAJOR tree
    unpacked into `cuda_home` with no distribution recorded (pip never sees NGC's nvcc), and the CUDA runtime's
    headers beside it (torch's own wheel brings them), which nvcc compiles against; every other one (torchvision,
    the Pillow it imports) installed by pip without its dependencies (its framework is the image's own)."""
    wheels = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".whl"))
    real = [w for w in wheels if not os.path.basename(w).lower().startswith("nvidia_")]
    if real:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir"]
        subprocess.run([*pip, "--no-compile", *real], check=True)
    prefix = f"nvidia/cu{major}/"
    for wheel in (w for w in wheels if w not in real):
        with zipfile.ZipFile(wheel) as archive:
            for entry in archive.infolist():
                if not entry.filename.startswith(prefix) or entry.is_dir():
                    continue
                target = os.path.join(cuda_home, entry.filename[len(prefix) :])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(entry) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.chmod(target, (entry.external_attr >> 16) & 0o777 or 0o644)
    headers = os.path.join(site, "nvidia", f"cu{major}", "include")
    if os.path.isdir(headers):
        shutil.copytree(headers, os.path.join(cuda_home, "include"), dirs_exist_ok=True)


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
    if facts["wheel_folder"]:
        install_wheels(facts["wheel_folder"], site, facts["nvcc"])
    {"pytorch": shape_torch, "tensorflow": shape_tensorflow}[facts["framework"]](facts)
    write_bundled(site, facts["bundled"], WHEEL_NAMES[facts["framework"]][-1])
    write_constraints(facts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
