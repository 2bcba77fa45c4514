"""imgbuild.hostio.regular: files opened, written and named in their errors as a user can act on them."""

from __future__ import annotations

import ast
import os
import re
import stat
from pathlib import Path

import pytest


def test_a_full_disk_under_the_build_log_names_the_log(tmp_path):
    """A build log on a full disk: write() and close() errors carry no file name, so the log's own errors add it
    (one line, exit 3), never `cannot use: No space left on device` alone."""
    import errno
    from pathlib import Path

    from imgbuild.errors import ending
    from imgbuild.hostio.regular import open_log

    with pytest.raises(OSError) as caught, open_log(Path("/dev/full")) as log:
        log.write("#5 [2/5] RUN pip install ...\n" * 1000)
        log.flush()
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/dev/full"
    lines, code = ending(caught.value)
    assert lines == ["imgbuild: cannot use /dev/full: No space left on device"] and code == 3


# --- a file written whole ---------------------------------------------------------------------------------------

#: Renames and links that are not a file written whole, or that still write one their own way, by path: the count
#: of `os.replace`/`os.rename`/`os.link` and one-argument `.replace(x)`/`.rename(x)` each file may hold.
RENAMES_ELSEWHERE = {
    "hostio/regular.py": 3,  # the one writer: os.replace, or os.link for a file written only where nothing is; the
    # unnamed (O_TMPFILE) file given its name through /proc
    "pipeline/context.py": 3,  # a rendered context folder swapped in whole, and put back on failure
    "payload/lock_resolve.py": 1,  # a pip --target folder moved into place inside the image (stdlib only)
    "clusters/oci.py": 1,  # an unpacked bundle folder moved to the name the user gave
    "servers/usage.py": 1,  # the usage log rotated
}


def _is_rename(node: ast.AST) -> bool:
    """os.replace, os.rename, os.renames, os.link or shutil.move named (called or passed), or a one-argument
    `.replace(x)`/`.rename(x)` (Path's; str.replace takes two, dataclasses.replace keywords)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in {"os", "shutil"}:
        return node.attr in ({"replace", "rename", "renames", "link"} if node.value.id == "os" else {"move"})
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"replace", "rename"}
        and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "os")
        and len(node.args) == 1
        and not node.keywords
    )


def test_a_file_is_written_whole_in_one_place():
    """A new temporary-file-then-rename outside imgbuild.hostio.regular fails here: each writer of its own had its own
    fsync guarantees (a ledger every `run` depends on was never synced)."""
    package = Path(__file__).resolve().parent.parent / "imgbuild"
    found = {}
    for module in sorted(package.rglob("*.py")):
        text = module.read_text(encoding="utf-8")
        if not re.search(r"os\.(replace|renames?|link)\b|shutil\.move\b|\.(replace|rename)\(", text):
            continue  # nothing to parse: the scan stays fast
        count = sum(map(_is_rename, ast.walk(ast.parse(text))))
        if count:
            found[module.relative_to(package).as_posix()] = count
    assert found == RENAMES_ELSEWHERE


def test_a_file_written_whole_has_exactly_the_mode_given_and_its_folder_synced(tmp_path, monkeypatch):
    from imgbuild.hostio.regular import write_atomic

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(stat.S_IFMT(os.fstat(fd).st_mode)), real(fd))[1])
    old_umask = os.umask(0o077)
    try:
        write_atomic(tmp_path / "ledger.json", b"{}", mode=0o644)
    finally:
        os.umask(old_umask)
    assert (tmp_path / "ledger.json").read_bytes() == b"{}"
    assert stat.S_IMODE((tmp_path / "ledger.json").stat().st_mode) == 0o644  # not the umask's 0600
    assert synced == [stat.S_IFREG, stat.S_IFDIR]  # the bytes, then the folder's entry for the new name
    write_atomic(tmp_path / "ledger.json", b"[]", mode=0o600)
    assert stat.S_IMODE((tmp_path / "ledger.json").stat().st_mode) == 0o600  # the mode given, not the old one


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    from imgbuild.hostio.regular import whole_file

    path = tmp_path / "queue.json"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), whole_file(path) as handle:
        handle.write(b"half")
        raise RuntimeError("killed while writing")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["queue.json"]


def test_a_new_file_is_written_only_where_nothing_is_not_even_a_dangling_link(tmp_path):
    from imgbuild.hostio.regular import write_atomic

    link = tmp_path / "recipe.yaml"
    link.symlink_to(tmp_path / "elsewhere.yaml")
    with pytest.raises(FileExistsError) as caught:
        write_atomic(link, "name: x\n", replace=False)
    assert caught.value.filename == str(link)  # named by the file asked for, not the temporary one beside it
    assert not (tmp_path / "elsewhere.yaml").exists() and [p.name for p in tmp_path.iterdir()] == ["recipe.yaml"]
    write_atomic(tmp_path / "new.yaml", "name: y\n", replace=False)
    assert (tmp_path / "new.yaml").read_text() == "name: y\n"


@pytest.mark.root("gives a file to another user")
def test_root_writing_a_users_file_in_a_shared_folder_takes_away_only_what_it_is_told_was_planted(tmp_path):
    from imgbuild.hostio.regular import write_atomic

    shared = tmp_path / "state"
    shared.mkdir()
    shared.chmod(0o1777)
    path = shared / "queue-1234.json"
    path.mkdir()  # a folder planted at the name root writes
    (path / "kept").write_text("x")
    with pytest.raises(IsADirectoryError) as caught:
        write_atomic(path, b"{}")  # not said to be a shared folder: nothing removed
    assert caught.value.filename == str(path) and (path / "kept").exists()
    write_atomic(path, b"{}", mode=0o600, owner=1234, planted=True)
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode) and info.st_uid == 1234 and stat.S_IMODE(info.st_mode) == 0o600
    assert path.read_bytes() == b"{}" and [p.name for p in shared.iterdir()] == ["queue-1234.json"]


def _full_disk(*args, **kwargs):
    import errno
    import os

    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("writer", ["write_atomic", "write_new"])
def test_a_full_disk_under_any_written_file_names_the_file(writer, tmp_path, monkeypatch):
    """fsync's and write's ENOSPC name no file: merge-reports' JUnit file, bump's recipe, init's recipe did not."""
    import os

    from imgbuild.errors import ending
    from imgbuild.hostio.regular import write_atomic
    from imgbuild.pipeline.starter import write_new

    target = tmp_path / "report.xml"
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(OSError) as caught:
        (write_atomic if writer == "write_atomic" else write_new)(target, "<testsuites/>")
    lines, code = ending(caught.value)
    assert lines == [f"imgbuild: cannot use {target}: No space left on device"] and code == 3
    assert os.listdir(tmp_path) == []  # nothing half-written, no temporary file


def test_a_killed_write_leaves_no_file_beside_the_one_it_replaces(tmp_path):
    """A kill -9 mid-fsync left `.NAME.PID.HEX.partial` beside a recipe (git add picks it up)."""
    import signal
    import subprocess
    import sys
    import time

    recipe = tmp_path / "demo.yaml"
    recipe.write_text("name: demo\n")
    code = (
        "import os, sys, time; from pathlib import Path; from imgbuild.hostio.regular import write_atomic\n"
        "real = os.fsync\n"
        "def slow(fd): print('syncing', flush=True); time.sleep(30)\n"
        "os.fsync = slow\n"
        f"write_atomic(Path({str(recipe)!r}), 'name: demo\\ntag: v2\\n')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout and proc.stdout.readline().strip() == "syncing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    time.sleep(0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.yaml"]
    assert recipe.read_text() == "name: demo\n"


def test_the_next_write_sweeps_what_a_killed_one_left(tmp_path):
    """Where the file system has no O_TMPFILE the temporary file is named; a dead writer's is swept."""
    from imgbuild.hostio.regular import write_atomic

    dead = tmp_path / ".demo.yaml.999999999.0badf00d.partial"  # no such PID
    dead.write_text("half")
    other = tmp_path / ".other.yaml.999999999.0badf00d.partial"  # another file's: not this write's to judge
    other.write_text("half")
    write_atomic(tmp_path / "demo.yaml", "name: demo\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "demo.yaml"]


def test_an_image_saved_to_a_file_is_written_whole_and_never_through_a_link(tmp_path):
    """`docker save` into the name the user gave (Apptainer's archive): an engine that ends the stream midway
    leaves no half archive, and a link planted at the name is replaced, its target untouched."""
    from imgbuild.engine.images import DockerImages

    class Image:
        def __init__(self, broken: bool) -> None:
            self.broken = broken

        def save(self, named: bool):
            yield b"layer-1"
            if self.broken:
                raise OSError(5, "Input/output error")
            yield b"layer-2"

    class Client:
        class images:  # noqa: N801 - docker-py's attribute
            broken = False

            @classmethod
            def get(cls, ref: str) -> Image:
                return Image(cls.broken)

    out, victim = tmp_path / "x.tar", tmp_path / "victim"
    victim.write_bytes(b"theirs")
    out.symlink_to(victim)
    DockerImages(Client()).save("lab/x:1", out)
    assert out.read_bytes() == b"layer-1layer-2" and not out.is_symlink() and victim.read_bytes() == b"theirs"
    Client.images.broken = True
    with pytest.raises(OSError):
        DockerImages(Client()).save("lab/x:1", out)
    assert out.read_bytes() == b"layer-1layer-2" and sorted(os.listdir(tmp_path)) == ["victim", "x.tar"]


def test_a_file_written_for_a_user_is_written_whole_never_through_a_link(tmp_path):
    """A report written as the user acting through sudo (`--report`): a link at the name is replaced, never
    followed to a file the link names."""
    from imgbuild.hostio.acting import write_as

    out, victim = tmp_path / "report.json", tmp_path / "victim"
    victim.write_text("theirs\n")
    out.symlink_to(victim)
    write_as(None, out, "{}\n")
    assert out.read_text() == "{}\n" and not out.is_symlink() and victim.read_text() == "theirs\n"
