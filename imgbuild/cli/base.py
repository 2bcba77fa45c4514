"""The command group and what every cli module shares: the help's sections (each module declares its own),
settings from the flags given, JSON output."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from imgbuild import __version__
from imgbuild.errors import UsageError

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.hostio.host import Caller
    from imgbuild.supply.attest import Signer


class Section:
    """A heading of `imgbuild --help` and the commands a cli module declares under it, in the order declared.
    Sections are listed in the order their modules are imported (the pipeline's: cli/__init__.py)."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.names: list[str] = []
        SECTIONS.append(self)

    def command(
        self, name: str | None = None, cls: type[click.Command] | None = None
    ) -> Callable[[Callable[..., Any]], click.Command]:
        """A command of the root group under this heading: `name` where it is not the function's, `cls` where the
        command parses its arguments itself."""
        return self._listed(cli.command(name, cls=cls or click.Command))

    def group(self) -> Callable[[Callable[..., Any]], click.Group]:
        return self._listed(cli.group())

    def _listed(self, decorator: Callable[[Callable[..., Any]], Any]) -> Callable[[Callable[..., Any]], Any]:
        """`decorator` (the group's command or group), and the command it makes listed under this heading."""

        def register(fn: Callable[..., Any]) -> Any:
            made = decorator(fn)
            self.names.append(str(made.name))
            return made

        return register


SECTIONS: list[Section] = []


class SectionedGroup(click.Group):
    """Lists commands under their modules' headings, in the order of the pipeline."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        ordered = [name for section in SECTIONS for name in section.names if name in self.commands]
        return ordered + sorted(set(self.commands) - set(ordered))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for section in SECTIONS:
            rows = [(n, self.commands[n].get_short_help_str(70)) for n in section.names if n in self.commands]
            if rows:
                with formatter.section(section.title):
                    formatter.write_dl(rows)


def who_of(ctx: click.Context) -> Caller:
    """The caller, read once per command line: by `main` (which hands it to the group as its object), else
    here, the first time a command asks."""
    from imgbuild.hostio.host import Caller, caller

    root = ctx.find_root()
    if not isinstance(root.obj, Caller):
        root.obj = caller()
    return root.obj


def settings_of(ctx: click.Context, backend: str | None = None, builder: str | None = None) -> Settings:
    """Settings by precedence, with the root's --user/--ngc-registry and this command's --backend/--builder on top."""
    from imgbuild.config.settings import load_settings

    root = ctx.find_root().params
    merged = {
        "user": root.get("user"),
        "ngc_registry": root.get("ngc_registry"),
        "backend": backend,
        "builder": builder,
    }
    return load_settings(merged, who=who_of(ctx))


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "terminal_width": 100}


@click.group(cls=SectionedGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", "-V", prog_name="imgbuild")
@click.option("--user", metavar="NAME", help="Image namespace (IMGBUILD_USER; default: your login name).")
@click.option("--ngc-registry", metavar="HOST", help="NGC registry or mirror (IMGBUILD_NGC_REGISTRY; default nvcr.io).")
def cli(user: str | None, ngc_registry: str | None) -> None:
    """Build NGC-based images from YAML recipes, prove they work on the GPU, run them on shared servers.

    \b
    Exit codes: 0 success, 1 the job ran and failed (build, smoke test, stale check),
                2 bad input or usage, 3 environment (no Docker engine, registry unreachable).
    Read commands take --json.
    """


#: `--sign-key` of every command that pushes (build, rebuild): IMGBUILD_SIGN_KEY is a CI runner's key.
SIGN_KEY = click.option(
    "--sign-key",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="IMGBUILD_SIGN_KEY",
    help="--push: sign each pushed image with this cosign key (password in IMGBUILD_SIGN_PASSWORD or "
    "COSIGN_PASSWORD) and attach its provenance and SBOM. IMGBUILD_SIGN_KEY: the key of every push (a CI "
    "runner's), ignored by a command that pushes nothing.",
)


def open_signer(sign_key: Path | None, push: bool) -> Signer | None:
    """The signing key, opened before any build: a wrong key or password stops here, in one line."""
    if sign_key is None:
        return None
    import os

    from click.core import ParameterSource

    from imgbuild.supply.attest import load_signer

    if not push:
        if click.get_current_context().get_parameter_source("sign_key") == ParameterSource.ENVIRONMENT:
            return None  # the runner's key for its pushes; this command pushes nothing
        raise UsageError("--sign-key signs what is pushed: add --push")
    password = os.environ.get("IMGBUILD_SIGN_PASSWORD", os.environ.get("COSIGN_PASSWORD", ""))
    return load_signer(sign_key, password.encode())
