"""The pip step as it runs in an image, on this machine: imgbuild's own install.sh and guard.py, real pip or real
uv (the default installer), real wheels made by the test, over a throwaway environment that plays the base.
`python3` on PATH is that environment's, as in an image; the site's pip and uv configuration is kept out.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from imgbuild.payload import PAYLOAD_DIR, PIP_SCRIPTS

TEMPLATES = Path(__file__).parent.parent / "imgbuild" / "templates"
INSTALLERS = ("uv", "pip")  # every test of the pip step runs with each
#: where install.sh finds uv in an image (its own build stage mounts it there)
UV_IN_IMAGE = "uv=/tmp/imgbuild-uv/bin/uv\n"


def install_script(folder: Path, installer: str) -> None:
    """install.sh as render copies it; with uv, the one line that says where uv is points at the uv on this
    machine instead of the image's mount."""
    text = (TEMPLATES / "install.sh").read_text()
    if installer == "uv":
        import uv

        assert UV_IN_IMAGE in text, "install.sh no longer finds uv where this test puts it"
        text = text.replace(UV_IN_IMAGE, f"uv={uv.find_uv_bin()}\n")
    (folder / "install.sh").write_text(text)


def wheel(folder: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()) -> None:
    """A real wheel: METADATA, WHEEL and a RECORD with sha256 hashes, as build backends write them."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {req}\n" for req in requires
    )
    content = dict(files)
    content[f"{dist}/METADATA"] = meta.encode()
    content[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: imgbuild-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )

    def line(path: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(data)}\n"

    record = "".join(line(path, data) for path, data in content.items()) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as archive:
        for path, data in content.items():
            archive.writestr(path, data)
        archive.writestr(f"{dist}/RECORD", record)


def guard_folder(folder: Path) -> Path:
    """The guard and what it imports, as the context holds them (`imgbuild/pip/`): guard.py's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, inside in PIP_SCRIPTS.items():
        shutil.copy(PAYLOAD_DIR / name, folder / inside)
    return folder / "guard.py"


class PipStep:
    """A base environment holding `base` (names or name==version from `wheels`), and the step's folder."""

    def __init__(
        self, tmp_path: Path, wheels: Path, base: list[str], frameworks: tuple[str, ...] = (), installer: str = "pip"
    ):
        self.wheels, self.venv, self.folder = wheels, tmp_path / "venv", tmp_path / "pip"
        self.installer, self.cache = installer, tmp_path / "uv-cache"
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
        self.pip("install", "-q", "--no-index", "--find-links", str(wheels), *base, check=True)
        guard_folder(self.folder)
        install_script(self.folder, installer)
        (self.folder / "constraints.txt").write_text("")
        (self.folder / "framework.txt").write_text("".join(f"{n}\n" for n in frameworks))

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python3"

    def environ(self) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "UV_"))}
        environ.update(PATH=f"{self.venv / 'bin'}:{environ['PATH']}", PIP_CONFIG_FILE=os.devnull)
        environ["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        environ["IMGBUILD_LOCK_UV_CACHE"] = str(self.cache)  # install.sh's uv cache: this test's own
        # pip's wheel cache too: a source build another test (another xdist worker) made of a package of the same
        # name and version is never this test's
        environ["PIP_CACHE_DIR"] = str(self.cache.with_name("pip-cache"))
        return environ

    def pip(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), "-m", "pip", *args], capture_output=True, text=True, env=self.environ(), check=check
        )

    def run(self, packages: list[str], index: str = "", **files: str) -> subprocess.CompletedProcess[str]:
        """install.sh with these requirements; `files` (provides, constraints, resolved) are the folder's
        other inputs, as render writes them (an empty text: no such file). `index`: an index's URL to install
        from, instead of the folder of wheels."""
        where = f"--index-url {index}\n" if index else f"--no-index\n--find-links {self.wheels}\n"
        (self.folder / "requirements.txt").write_text(where + "".join(f"{p}\n" for p in packages))
        for name in ("provides", "resolved", "constraints", "no-build-isolation", "unpin"):
            path = self.folder / f"{name}.txt"
            path.unlink(missing_ok=True)
            if files.get(name) or name == "constraints":
                index = f"--no-index\n--find-links {self.wheels}\n" if name == "no-build-isolation" else ""
                path.write_text(index + files.get(name, ""))
        return subprocess.run(
            ["sh", str(self.folder / "install.sh")], capture_output=True, text=True, env=self.environ()
        )

    def failure(self, proc: subprocess.CompletedProcess[str]) -> str:
        """The guard's one line, without its prefix."""
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("imgbuild: pip step failed: ")]
        assert proc.returncode != 0 and lines, proc.stdout + proc.stderr
        return lines[-1].removeprefix("imgbuild: pip step failed: ")


def sdist_bytes(name: str, version: str, backend: str) -> bytes:
    """A real source distribution (`.tar.gz`) whose build backend is `backend` (Python source, in the tree: PEP
    517's backend-path), with no build requirements of its own: what it imports must come from where it is built."""
    import io
    import tarfile

    top = f"{name}-{version}"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": backend,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sdist(folder: Path, name: str, version: str, backend: str) -> None:
    (folder / f"{name}-{version}.tar.gz").write_bytes(sdist_bytes(name, version, backend))
