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


def wheel(
    folder: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    requires: tuple[str, ...] = (),
    extras: tuple[str, ...] = (),
) -> None:
    """A real wheel: METADATA (its extras, and requirements, which may name them), WHEEL and a RECORD with sha256
    hashes, as build backends write them."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        [*(f"Provides-Extra: {extra}\n" for extra in extras), *(f"Requires-Dist: {req}\n" for req in requires)]
    )
    content = dict(files)
    content[f"{dist}/METADATA"] = meta.encode()
    content[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: imgbuild-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )

    def line(path: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(data)}\n"

    content[f"{dist}/RECORD"] = (
        "".join(line(path, data) for path, data in content.items()) + f"{dist}/RECORD,,\n"
    ).encode()
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as archive:
        for path, data in content.items():  # the same bytes for the same wheel (no clock): a base made once
            member = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            member.external_attr = 0o644 << 16
            archive.writestr(member, data)


def guard_folder(folder: Path) -> Path:
    """The guard and what it imports, as the context holds them (`imgbuild/pip/`): guard.py's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, inside in PIP_SCRIPTS.items():
        shutil.copy(PAYLOAD_DIR / name, folder / inside)
    return folder / "guard.py"


def _folder_digest(folder: Path) -> str:
    """What a base installed from `folder` can depend on: every file's name and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder)}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _relocate(venv: Path, was: Path) -> None:
    """A copied environment's own paths: the scripts' `#!` lines, activate's and pyvenv.cfg's folder."""
    for path in [venv / "pyvenv.cfg", *(p for p in (venv / "bin").iterdir() if p.is_file() and not p.is_symlink())]:
        data = path.read_bytes()
        if bytes(was) in data:
            path.write_bytes(data.replace(bytes(was), bytes(venv)))


def _copy_environment(source: Path, venv: Path) -> None:
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(source), str(venv)], check=True)
    _relocate(venv, source)


class BaseEnvironments:
    """The base environments of one test session (one per xdist worker). `python -m venv` (pip from ensurepip,
    3-10 s) runs once; each distinct base (its wheels' bytes and the names installed) is a copy of that with real
    pip installing the base, made once; each test gets a copy of its own (about 0.1 s), relocated to its folder.
    `with_pip=False`: a venv without pip, the base installed by this interpreter's pip (`pip --python`)."""

    def __init__(self, root: Path):
        self.root, self.made = root, dict[str, Path]()

    def copy(self, venv: Path, wheels: Path, base: list[str], with_pip: bool = True) -> None:
        made = f"{sys.executable}\0{_folder_digest(wheels)}\0{base}\0{with_pip}"
        key = hashlib.sha256(made.encode()).hexdigest()[:16]
        template = self.made.get(key) or self._made(key, wheels, base, with_pip)
        _copy_environment(template, venv)

    def _made(self, key: str, wheels: Path, base: list[str], with_pip: bool) -> Path:
        bare = self.root / ("bare" if with_pip else "bare-without-pip")
        if not (bare / "bin" / ("pip" if with_pip else "python")).exists():  # pip is ensurepip's last step
            shutil.rmtree(bare, ignore_errors=True)
            subprocess.run(
                [sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(bare)], check=True
            )
        template = self.root / key
        shutil.rmtree(template, ignore_errors=True)  # a base whose install failed before
        _copy_environment(bare, template)
        environ = _clean_environ(template, self.root / f"{key}-pip-cache")
        pip = [str(template / "bin" / "python3"), "-m", "pip"]
        if not with_pip:
            pip = [sys.executable, "-m", "pip", "--python", str(template / "bin" / "python")]
        install = ["install", "-q", "--no-index", "--find-links", str(wheels), *base]
        subprocess.run([*pip, *install], env=environ, check=True)
        self.made[key] = template
        return template


def _clean_environ(venv: Path, pip_cache: Path) -> dict[str, str]:
    """This machine's environment with `venv` first on PATH and the site's pip and uv configuration kept out."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "UV_"))}
    environ.update(PATH=f"{venv / 'bin'}:{environ['PATH']}", PIP_CONFIG_FILE=os.devnull)
    environ["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # pip's wheel cache of the caller's own: a source build another test (another xdist worker) made of a package
    # of the same name and version is never this one's
    environ["PIP_CACHE_DIR"] = str(pip_cache)
    return environ


class PipStep:
    """A base environment holding `base` (names or name==version from `wheels`), and the step's folder."""

    def __init__(
        self,
        bases: BaseEnvironments,
        tmp_path: Path,
        wheels: Path,
        base: list[str],
        frameworks: tuple[str, ...] = (),
        *,
        installer: str,  # one of INSTALLERS, named by each test: a test of the step runs with each
    ):
        self.wheels, self.venv, self.folder = wheels, tmp_path / "venv", tmp_path / "pip"
        self.installer, self.cache = installer, tmp_path / "uv-cache"
        bases.copy(self.venv, wheels, base)
        guard_folder(self.folder)
        install_script(self.folder, installer)
        (self.folder / "constraints.txt").write_text("")
        (self.folder / "framework.txt").write_text("".join(f"{n}\n" for n in frameworks))

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python3"

    def environ(self) -> dict[str, str]:
        environ = _clean_environ(self.venv, self.cache.with_name("pip-cache"))
        environ["IMGBUILD_LOCK_UV_CACHE"] = str(self.cache)  # install.sh's uv cache: this test's own
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
    import gzip
    import io
    import tarfile

    top = f"{name}-{version}"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": backend,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as packed, tarfile.open(fileobj=packed, mode="w") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sdist(folder: Path, name: str, version: str, backend: str) -> None:
    (folder / f"{name}-{version}.tar.gz").write_bytes(sdist_bytes(name, version, backend))
