"""Stage 3: render a plan into a build context (Dockerfile, pip files, scripts, copied files).

Deterministic: the same plan renders byte-identical files on any machine (sorted, no timestamps,
normalised modes, no absolute host paths).
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild import __version__, limits
from imgbuild.errors import UsageError
from imgbuild.facts import UV_VERSION, Label
from imgbuild.ngc import FRAMEWORKS
from imgbuild.payload import PAYLOAD_DIR, PIP_SCRIPTS, SMOKE_MODULES, SMOKE_PACKAGE, STACK_SCRIPT
from imgbuild.pipeline.plan import TEMPLATES_DIR, Plan, hashed_pins
from imgbuild.pipeline.record import RECORD_FILE, Record
from imgbuild.pipeline.stack import step_kinds

if TYPE_CHECKING:
    import jinja2

#: imgbuild's own scripts, written into every context for the build but never committed (the context's
#: .gitignore lists them; the lock records their digest): a reviewer sees the recipe's files, not ours.
OWN_SCRIPTS = {
    "imgbuild/pip/install.sh": TEMPLATES_DIR / "install.sh",
    **{f"imgbuild/pip/{inside}": PAYLOAD_DIR / name for name, inside in PIP_SCRIPTS.items()},
    "imgbuild/user/add-user.sh": TEMPLATES_DIR / "add-user.sh",
    **{f"imgbuild/smoke/{name}": SMOKE_PACKAGE / name for name in SMOKE_MODULES},
    "imgbuild/stack/stack_check.py": STACK_SCRIPT,
}
#: Folders of the context that are imgbuild's own whole (the smoke package): ignored as one, whatever they hold.
OWN_FOLDERS = ("imgbuild/smoke/",)
#: Files a build leaves beside the context: not part of what the recipe renders to, never committed.
RUN_FILES = ("smoke.json", "smoke.verify.json", "build.log")
GITIGNORE = "# imgbuild's own scripts: written for each build, recorded in imgbuild.lock.json by digest\n" + "".join(
    f"/{path}\n" for path in (*OWN_FOLDERS, *(p for p in OWN_SCRIPTS if not p.startswith(OWN_FOLDERS)), *RUN_FILES)
)
TEMPLATE_FOR_BACKEND = {"buildkit": "Dockerfile.buildkit.j2", "sdk": "Dockerfile.j2"}
#: The context's folders that BuildKit Dockerfile steps bind-mount (each step's line carries their digest).
MOUNTED_FOLDERS = ("imgbuild/pip", "imgbuild/pip-lock", "imgbuild/user", "imgbuild/stack")


@dataclass(frozen=True)
class RenderedFile:
    context_path: str
    dest: str
    chown: str  # Dockerfile --chown value; empty: root owns it
    mode: str | None  # the recipe's octal mode, applied to every file under dest


def _dq(value: str) -> str:
    """Escape for a double-quoted Dockerfile word; `$VAR` expansion stays available on purpose."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _kv_pairs(mapping: dict[str, str], quote_keys: bool = False) -> list[str]:
    """`KEY="value"` words for ENV and LABEL, in the mapping's order."""
    return [f'{json.dumps(k) if quote_keys else k}="{_dq(v)}"' for k, v in mapping.items()]


def _exec_form(value: str | list[str]) -> str:
    """Exec-form JSON for RUN, ENTRYPOINT and CMD; a string runs as `/bin/sh -c` would run it. In JSON form a
    `run:` command cannot continue into the next line (a trailing `\\`) nor open a heredoc: BuildKit parses
    neither there."""
    if isinstance(value, str):
        return json.dumps(["/bin/sh", "-c", value], ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False)


def template_cache(cache_dir: str | Path) -> jinja2.BytecodeCache | None:
    """Compiled templates kept between runs in `<cache_dir>/templates`, or None.

    Lexing and compiling the Dockerfile templates is most of a render's own time (about 35 ms of 40 here);
    Jinja reuses a compiled template only while its source's checksum and Jinja's version match. A compiled
    template is code, so the folder is used only when the caller owns it and its parent, and no one else
    can write either (a shared `cache_dir` set by a site gets no cache, not someone else's code)."""
    import os
    import stat

    folder = Path(cache_dir) / "templates"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        infos = [os.lstat(folder), os.lstat(folder.parent)]
    except OSError:
        return None
    ours = all(stat.S_ISDIR(i.st_mode) and i.st_uid == os.geteuid() for i in infos)
    if not ours or infos[0].st_mode & 0o077 or infos[1].st_mode & 0o022:
        return None  # private folder, parent no one else can write
    import jinja2

    return jinja2.FileSystemBytecodeCache(str(folder))


def template_environment(cache: jinja2.BytecodeCache | None = None) -> jinja2.Environment:
    """Jinja over imgbuild's templates folder, as every template of it is rendered."""
    return _environment(cache)


def _environment(cache: jinja2.BytecodeCache | None = None) -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        bytecode_cache=cache,
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["dq"] = _dq
    env.filters["exec_form"] = _exec_form
    env.filters["kv_pairs"] = _kv_pairs
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    env.filters["sh_env"] = sh_env
    env.filters["sh"] = shlex.quote
    return env


def image_labels(plan: Plan) -> dict[str, str]:
    recipe = plan.loaded.recipe
    labels = dict(sorted(recipe.labels.items()))
    labels.update(
        {
            Label.VERSION: __version__,
            Label.RECIPE: plan.loaded.name,
            Label.RECIPE_HASH: plan.content_hash,
            Label.INPUT_HASH: plan.input_hash,
            Label.BASE: plan.base.ref,
            Label.BASE_DIGEST: plan.base.identity,
            Label.BASE_FRAMEWORK: plan.base.framework,
            Label.BASE_FRAMEWORK_VERSION: plan.base.framework_version,
        }
    )
    if recipe.description:
        labels["org.opencontainers.image.description"] = recipe.description
    # The OCI base annotations: Renovate, crane and registry UIs see the base and its staleness without us.
    labels["org.opencontainers.image.base.name"] = plan.base.ref
    if plan.base.digest:
        labels["org.opencontainers.image.base.digest"] = plan.base.digest
    return labels


def requirements_text(plan: Plan) -> str:
    recipe = plan.loaded.recipe
    lines = ["# Rendered by imgbuild from the recipe's pip section; installed under the base's pins."]
    if recipe.pip.index_url:
        lines.append(f"--index-url {recipe.pip.index_url}")
    lines += [f"--extra-index-url {url}" for url in recipe.pip.extra_index_urls]
    lines += [f"--trusted-host {host}" for host in recipe.pip.trusted_hosts]
    lines += [option for option in plan.loaded.requirement_options if option not in lines]
    lines += list(recipe.pip.packages)
    if plan.loaded.requirements_path:
        lines.append(f"# from {plan.loaded.requirements_path.name} (and the files it nests)")
        lines += [" ".join((line.spec, *line.hashes)) for line in plan.loaded.requirements]
    return "\n".join(lines) + "\n"


def lock_layer_text(plan: Plan, requirements: str) -> str:
    """The lock layer's requirements: the recipe's index options (from its `requirements`) and the lock's pins, each
    with its hashes where the lock has them (then pip and uv check every file they install against them)."""
    lines = ["# The recipe's lock (imgbuild lock), installed exactly; the next layer adds what it lacks."]
    return "\n".join([*lines, *_index_options(requirements), *hashed_pins(plan.loaded)]) + "\n"


def _index_options(requirements: str) -> list[str]:
    """The option lines (index URLs, trusted hosts) of the pip step's `requirements.txt`."""
    return [line for line in requirements.splitlines() if line.startswith("--")]


def no_build_isolation_text(plan: Plan, requirements: str) -> str:
    """What `pip.no_build_isolation` builds, a line each: the recipe's own requirement for the package where it
    has one (its version range, extras), else the bare name (a dependency of another); pip builds these first,
    from the recipe's index (its option lines, as in `requirements`)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    asked: dict[str, str] = {}
    specs = [*plan.loaded.recipe.pip.packages, *(line.spec for line in plan.loaded.requirements)]
    for spec in specs:
        try:
            asked.setdefault(str(canonicalize_name(Requirement(spec).name)), spec)
        except InvalidRequirement:  # validate refused it already; a bare name still builds
            continue
    names = [str(canonicalize_name(name)) for name in plan.loaded.recipe.pip.no_build_isolation]
    wanted = [asked.get(name, name) for name in dict.fromkeys(names)]
    return "".join(f"{line}\n" for line in [*_index_options(requirements), *wanted])


def constraints_text(plan: Plan) -> str:
    lines = [
        "# Pins imgbuild adds on top of the base's own (its constraint file, or a freeze of it):",
        "# the base's framework, as its image config declares it, and the recipe's constraints.",
    ]
    lines += list(plan.protected)
    lines += list(plan.loaded.recipe.pip.constraints)
    lines += [line.spec for line in plan.loaded.requirement_constraints]
    return "\n".join(lines) + "\n"


def context_path_for(dest: str) -> str:
    """Where `files[].dest` lives in the context: `files/<dest>`, never outside `files/`."""
    rel = posixpath.normpath("files/" + dest.lstrip("/"))
    if rel == "files" or not rel.startswith("files/") or ".." in rel.split("/"):
        raise UsageError(f"files: destination {dest[:80]!r} leaves the build context")
    return rel


@dataclass(frozen=True)
class Context:
    """A build context in memory: the files imgbuild renders (content, mode) and the recipe's own files to
    copy (checked source, mode). Written by `context.write_context`, compared by `context.diff_context`."""

    rendered: dict[str, tuple[bytes, int]]
    copies: dict[str, tuple[Path, int]]

    def text(self, path: str) -> str:
        return self.rendered[path][0].decode()

    def paths(self) -> set[str]:
        return set(self.rendered) | set(self.copies)


def _recipe_pip_files(plan: Plan, requirements: str) -> dict[str, str]:
    """The pip step's inputs a recipe has or has not (a file is absent where the recipe has none of it)."""
    recipe = plan.loaded.recipe
    files: dict[str, str] = {}
    if plan.loaded.lock_pins:
        files["resolved.txt"] = "# The recipe's lock (imgbuild lock): what pip resolved, installed again.\n" + "".join(
            f"{pin}\n" for pin in plan.loaded.lock_pins
        )
    if recipe.pip.unpin:
        files["unpin.txt"] = "".join(f"{name}\n" for name in recipe.pip.unpin)
    if recipe.pip.no_build_isolation:
        files["no-build-isolation.txt"] = no_build_isolation_text(plan, requirements)
    if recipe.pip.provides:
        files["provides.txt"] = "".join(f"{k} {v}\n" for k, v in sorted(recipe.pip.provides.items()))
    framework = FRAMEWORKS.get(plan.base.framework)
    if framework:
        files["framework.txt"] = "".join(f"{name}\n" for name in framework.packages)
    if recipe.pip.installer == "uv":  # the step installs it itself where the uv stage's mount came empty
        files["uv.txt"] = f"uv=={UV_VERSION}\n"
    return files


def _pip_folders(plan: Plan, backend: str) -> dict[str, tuple[bytes, int]]:
    """The pip step's folder (`imgbuild/pip/`), and with a lock on BuildKit the lock layer's (`pip-lock/`)."""
    rendered: dict[str, tuple[bytes, int]] = {}

    def put(path: str, text: str, mode: int = 0o644) -> None:
        rendered[path] = (text.encode(), mode)

    requirements = requirements_text(plan)
    put("imgbuild/pip/requirements.txt", requirements)
    put("imgbuild/pip/constraints.txt", constraints_text(plan))
    for name, text in _recipe_pip_files(plan, requirements).items():
        put(f"imgbuild/pip/{name}", text)
    own = [path.rsplit("/", 1)[1] for path in OWN_SCRIPTS if path.startswith("imgbuild/pip/")]  # install.sh, guard
    for name in own:
        path = f"imgbuild/pip/{name}"
        put(path, _own_file(OWN_SCRIPTS[path]), 0o755 if name.endswith(".sh") else 0o644)
    if plan.loaded.lock_pins and backend == "buildkit":
        # The lock layer: exactly the lock's pins, from a folder of its own, so that editing the recipe's
        # packages leaves this layer cached and the next layer installs only what the lock lacks.
        inputs = ("constraints.txt", "unpin.txt", "provides.txt", "no-build-isolation.txt", "framework.txt", "uv.txt")
        for name in (*inputs, *own):
            if f"imgbuild/pip/{name}" in rendered:
                rendered[f"imgbuild/pip-lock/{name}"] = rendered[f"imgbuild/pip/{name}"]
        put("imgbuild/pip-lock/requirements.txt", lock_layer_text(plan, requirements))
        put("imgbuild/pip-lock/lock-layer", "installed with --no-deps: every dependency is pinned here\n")
    return rendered


def mount_digest(rendered: dict[str, tuple[bytes, int]], folder: str) -> str:
    """A digest of what a RUN step bind-mounts from `folder` (names, modes, contents). The step's line carries
    it: Buildah keys a step by its line alone and reuses it after the mounted files changed
    (containers/buildah#5400); BuildKit, which keys the files, runs it again exactly when the digest changes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in rendered if p.startswith(folder + "/")):
        content, mode = rendered[path]
        digest.update(f"{path[len(folder) + 1 :]}\0{mode:o}\0{len(content)}\0".encode())
        digest.update(content)
    return f"sha256:{digest.hexdigest()}"


def render(
    plan: Plan, backend: str = "buildkit", cache: jinja2.BytecodeCache | None = None, cache_scope: str = ""
) -> Context:
    """The build context for `plan`. Pure: it reads nothing but imgbuild's own templates and writes nothing
    (but for the compiled templates of `cache`, a `template_cache`, when the caller gives one). `cache_scope`:
    whose build caches the steps use ("" for the engine's own user, root or a docker-group user; "u<uid>" when
    imgbuild builds for a user through sudo): one user's package build must never write a wheel another user's
    build then installs."""
    recipe = plan.loaded.recipe
    rendered: dict[str, tuple[bytes, int]] = {}

    def put(path: str, text: str, mode: int = 0o644) -> None:
        rendered[path] = (text.encode(), mode)

    files, copies = _files(plan)
    has_pip = bool(recipe.pip.packages or plan.loaded.requirements_path)
    if has_pip:
        rendered.update(_pip_folders(plan, backend))
    if recipe.user:
        put("imgbuild/user/add-user.sh", _own_file(OWN_SCRIPTS["imgbuild/user/add-user.sh"]), 0o755)
    for name in SMOKE_MODULES:  # the smoke test, a package copied into the image as a folder
        put(f"imgbuild/smoke/{name}", _own_file(SMOKE_PACKAGE / name))
    checked = step_kinds(recipe, bool(plan.loaded.requirements_path))
    if checked:  # the byte check's script and what it protects (each kind of step is checked after it)
        put("imgbuild/stack/stack_check.py", _own_file(STACK_SCRIPT))
        put("imgbuild/stack/protected.json", plan.stack.spec_text())

    user = recipe.user
    context = {
        **_common(plan),
        "backend": backend,
        "files": files,
        "has_pip": has_pip,
        "checked": checked,
        "lock_layer": "imgbuild/pip-lock/lock-layer" in rendered,
        "uv_version": UV_VERSION if has_pip and recipe.pip.installer == "uv" else "",
        "pip_limits": (int(limits.PIP_RESOLVE_SECONDS), limits.PIP_DOWNLOAD_BYTES),  # build args override them
        "uid_default": (user.uid if user and user.uid else 1000),
        "gid_default": (user.gid if user and user.gid else 1000),
        # Caches are per base: two distributions must never share apt lists or wheels.
        "cache_key": hashlib.sha256(plan.base.ref.encode()).hexdigest()[:12]
        + (f"-{cache_scope}" if cache_scope else ""),
        "inputs": {folder: mount_digest(rendered, folder) for folder in MOUNTED_FOLDERS},
    }
    put("Dockerfile", _environment(cache).get_template(TEMPLATE_FOR_BACKEND[backend]).render(context))
    put(".dockerignore", "".join(f"{name}\n" for name in ("imgbuild.lock.json", *RUN_FILES, ".gitignore")))
    put(".gitignore", GITIGNORE)
    put(RECORD_FILE, Record.of(plan, backend).text())
    return Context(rendered, copies)


def _files(plan: Plan) -> tuple[list[RenderedFile], dict[str, tuple[Path, int]]]:
    """The recipe's `files:` as the templates name them, and the copies that put them into the context."""
    recipe = plan.loaded.recipe
    files: list[RenderedFile] = []
    copies: dict[str, tuple[Path, int]] = {}
    for spec in recipe.files:
        context_path = context_path_for(spec.dest)
        for f in plan.loaded.file_manifest[spec.dest]:
            mode = int(spec.mode, 8) if spec.mode else (0o755 if f.executable else 0o644)
            copies[f"{context_path}/{f.rel}" if f.rel else context_path] = (f.path, mode)
        owner = spec.owner or ("user" if recipe.user else "root")
        chown = "$IMGBUILD_UID:$IMGBUILD_GID" if owner == "user" and recipe.user else ""
        files.append(RenderedFile(context_path, spec.dest, chown, spec.mode))
    return files, copies


def _common(plan: Plan) -> dict[str, Any]:
    recipe = plan.loaded.recipe
    return {
        "version": __version__,
        "recipe_file": plan.loaded.name,
        "recipe": recipe,
        "base": plan.base,
        "labels": image_labels(plan),
        "home": (recipe.user.home or f"/home/{recipe.user.name}") if recipe.user else "",
    }


BOOTSTRAPS = ("docker-daemon", "docker-archive", "native")


_ENV_REFERENCE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def sh_env(value: str) -> str:
    """A value as a Dockerfile ENV means it, for a shell: `$VAR` and `${VAR}` expand (`/opt/bin:$PATH`),
    nothing else does (`$(...)`, backticks, `\\`, `"` are literal)."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value):
        return value
    out, last = ['"'], 0
    for ref in _ENV_REFERENCE.finditer(value):
        out.append(re.sub(r'([\\"`$])', r"\\\1", value[last : ref.start()]))
        out.append(ref.group(0))
        last = ref.end()
    out.append(re.sub(r'([\\"`$])', r"\\\1", value[last:]))
    return "".join(out) + '"'


def _apptainer_fault(plan: Plan, files: list[RenderedFile]) -> None:
    """What a definition cannot carry as Apptainer reads it: white space in a %files path (it splits there),
    and `{{` anywhere (Apptainer's build-argument templating would replace it)."""
    recipe = plan.loaded.recipe
    for i, f in enumerate(files):
        if any(c.isspace() for c in f.dest + f.context_path):
            raise UsageError(
                f"files[{i}].dest {f.dest!r}: an Apptainer %files line cannot hold white space; "
                "use --from docker-daemon or docker-archive (they start from the built image)"
            )
    texts = [
        *recipe.env.values(),
        *recipe.args.values(),
        *(c if isinstance(c, str) else " ".join(c) for c in recipe.run),
    ]
    if any("{{" in text for text in texts):
        raise UsageError(
            "the recipe holds `{{`, which Apptainer reads as a build argument; "
            "use --from docker-daemon or docker-archive"
        )


def apptainer_definition(plan: Plan, bootstrap: str = "docker-daemon", archive: str | None = None) -> str:
    """The Apptainer definition for `plan`: from the built image (docker-daemon), its saved archive
    (docker-archive), or the recipe rendered natively from the build context (native). Pure, like render."""
    if bootstrap not in BOOTSTRAPS:
        raise UsageError(f"--from: {bootstrap!r} is not one of {', '.join(BOOTSTRAPS)}")
    recipe = plan.loaded.recipe
    files, _ = _files(plan)
    if bootstrap == "native":
        _apptainer_fault(plan, files)
    command = recipe.entrypoint if recipe.entrypoint is not None else recipe.cmd
    runscript = ""
    if isinstance(command, list) and command:
        runscript = shlex.join(command)
    elif isinstance(command, str):
        runscript = "/bin/sh -c " + shlex.quote(command)
    context = {
        **_common(plan),
        "bootstrap": bootstrap,
        "source": plan.target if bootstrap == "docker-daemon" else (archive or f"{plan.name}.tar"),
        "files": files,
        "has_pip": bool(recipe.pip.packages or plan.loaded.requirements_path),
        "run": [c if isinstance(c, str) else shlex.join(c) for c in recipe.run],
        # the image is built as the recipe's user would be in Docker; Apptainer then runs as the caller
        "uid": plan.uid,
        "gid": plan.gid,
        "env": dict(recipe.env) if bootstrap == "native" else {},
        "runscript": runscript,
    }
    return _environment().get_template("apptainer.def.j2").render(context)


@functools.cache
def _own_file(path: Path) -> str:
    """imgbuild's own scripts and templates (package data), read once."""
    return path.read_text()
