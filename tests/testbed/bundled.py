"""Writes metadata-only distributions into a stand-in's site-packages (stdlib only): the Python packages NGC ships
beside its framework (torchvision, pytorch-triton, flash-attn, transformer-engine, DALI), as names and versions that
pip and uv list, resolve against and hold in the constraint file, with no code. A recipe that asks for torchvision
then meets the base's own, as on nvcr.io; importing one fails, which no check of imgbuild's relies on.

    python3 bundled.py SITE_PACKAGES NAME==VERSION...

Run by tests/testbed/ngc_shape.py while each stand-in is built, before its constraint file is written.
"""

import os
import re
import sys

INSTALLER = "imgbuild-ngc-standin"  # what `pip list -v` shows as the installer: never taken for a real wheel


def dist_folder(name, version):
    """The dist-info folder's name as pip writes it: `pytorch_triton-3.4.0+gitc817b9b6.dist-info`."""
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"


def write_metadata_only(site, name, version):
    """One distribution with METADATA, INSTALLER and RECORD only; an existing one of that name is left alone (a
    real build of it in the stand-in wins). Returns the folder written, or "" when one was there."""
    canonical = re.sub(r"[-_.]+", "-", name).lower()
    for entry in os.listdir(site):
        stem = entry.removesuffix(".dist-info")
        if stem != entry and re.sub(r"[-_.]+", "-", stem.rsplit("-", 1)[0]).lower() == canonical:
            return ""
    folder = os.path.join(site, dist_folder(name, version))
    os.makedirs(folder)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: stands in for the distribution NGC ships; metadata only, no code (imgbuild test bed)\n",
        "INSTALLER": INSTALLER + "\n",
    }
    files["RECORD"] = "".join(f"{os.path.basename(folder)}/{f},,\n" for f in (*files, "RECORD"))
    for file, text in files.items():
        with open(os.path.join(folder, file), "w", encoding="utf-8") as handle:
            handle.write(text)
    return folder


def main(argv):
    if len(argv) < 2 or not os.path.isdir(argv[1]):
        print("usage: bundled.py SITE_PACKAGES NAME==VERSION...", file=sys.stderr)
        return 2
    for pin in argv[2:]:
        name, _, version = pin.partition("==")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or not re.fullmatch(r"[A-Za-z0-9_.!+-]+", version):
            print(f"bundled.py: not NAME==VERSION: {pin[:80]!r}", file=sys.stderr)
            return 2
        write_metadata_only(argv[1], name, version)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
