"""`imgbuild run` from its words: the one grammar of its flags, read into one typed RunCall.

The command line reads a user's words with `grammar`, and the queue's child reads a queued job's with `parse`, the
same grammar (`servers/queuechild.py`); both hand the RunCall to `servers.run.launch`, which checks it and starts
it: a queued job starts exactly as its user typing `imgbuild run -d` would, through the same parse and checks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import click

#: Where `RunCommand` keeps the words it was given, in its context's `meta`: the audit log's record of the run.
_WORDS = "imgbuild.run.words"


class RunCommand(click.Command):
    """`--wait` takes an optional TIMEOUT: a bare `--wait` before the image must not swallow the image."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from imgbuild.config.checks import DURATION_RE

        ctx.meta[_WORDS] = tuple(args)
        out: list[str] = []
        rest = list(args)
        while rest:
            word = rest.pop(0)
            if word == "--":
                out += [word, *rest]
                break
            if word == "--wait" and not (rest and DURATION_RE.fullmatch(rest[0].strip().lower())):
                word = "--wait=30d"
            out.append(word)
        return super().parse_args(ctx, out)


@dataclass
class RunRequest:
    """What the user asked `imgbuild run` for, as flags."""

    image: str
    command: list[str] = field(default_factory=list)
    gpu_request: str = "none"
    force: bool = False
    cpus: float | None = None
    volumes: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    short: str | None = None
    detach: bool = False
    keep: bool = False
    shm_size: str | None = None
    no_workspace: bool = False
    as_user: str | None = None
    entrypoint: str | None = None
    interactive: bool = False
    terminal: bool = False
    jupyter: bool = False
    time: str | None = None  # --time: how long the container may run ("2d")
    notify: bool = False  # --notify: a notice when it ends (the reaper's next run)


@dataclass(frozen=True)
class RunCall:
    """What `imgbuild run WORDS` asks for: the container, how long to wait for busy GPUs (None: refuse at once),
    whether only to print its command line, and the words as given (for the audit log)."""

    request: RunRequest
    wait: str | None = None
    dry_run: bool = False
    words: tuple[str, ...] = ()


#: `imgbuild run`'s arguments and flags, in the order `--help` lists them.
_FLAGS: list[Callable[[Callable[..., None]], Callable[..., None]]] = [
    click.argument("image"),
    click.argument("command", nargs=-1, type=click.UNPROCESSED),
    click.option(
        "--gpus",
        "gpu_request",
        default="none",
        show_default=True,
        help="N least-loaded free GPUs, a list like 0,3, all, or none.",
    ),
    click.option("--force", is_flag=True, help="Take GPUs other users' processes are on."),
    click.option("--cpus", type=float, help="CPU limit (default: a fair share per GPU, 8-24 each)."),
    click.option("-v", "--volume", "volumes", multiple=True, help="Extra mounts, as docker -v."),
    click.option("-e", "--env", "env", multiple=True, help="Environment, as docker -e."),
    click.option("-p", "--publish", "ports", multiple=True, help="Ports, as docker -p."),
    click.option("--name", "short", help="The <name> in <user>_<name>_<n> (default: recipe or image name)."),
    click.option("-d", "--detach", is_flag=True, help="Run in the background."),
    click.option("--keep", is_flag=True, help="Keep the container after it exits (no --rm; detached runs always are)."),
    click.option("--shm-size", help="Private /dev/shm of this size instead of --ipc host."),
    click.option("--no-workspace", is_flag=True, help="Do not mount the current folder at /workspace."),
    click.option("--user", "as_user", metavar="UID:GID", help="Run as this user instead of yours."),
    click.option("--entrypoint", help="Override the image's entrypoint."),
    click.option(
        "--wait",
        "wait",
        default=None,
        metavar="[TIMEOUT]",
        help="Queue for busy GPUs (first come, first served) instead of refusing; give up after TIMEOUT (e.g. 2h).",
    ),
    click.option(
        "--time", "walltime", metavar="DURATION", help="Deadline: `imgbuild reap` stops it after this (e.g. 2d)."
    ),
    click.option(
        "--notify",
        is_flag=True,
        help="When it ends, a line in ~/imgbuild-notices.txt (and the site's notify_command).",
    ),
    click.option(
        "--jupyter",
        is_flag=True,
        help="JupyterLab in the background on a free port of 127.0.0.1; prints the ssh tunnel.",
    ),
    click.option("--dry-run", is_flag=True, help="Print the equivalent docker run line; start nothing."),
]


def grammar(fn: Callable[[RunCall], None]) -> Callable[..., None]:
    """`fn` as the callback of a click command (`cls=RunCommand`) that takes `imgbuild run`'s arguments and flags
    and hands `fn` one RunCall; `fn`'s docstring is the command's help."""

    def typed(
        image: str,
        command: tuple[str, ...],
        gpu_request: str,
        force: bool,
        cpus: float | None,
        volumes: tuple[str, ...],
        env: tuple[str, ...],
        ports: tuple[str, ...],
        short: str | None,
        detach: bool,
        keep: bool,
        shm_size: str | None,
        no_workspace: bool,
        as_user: str | None,
        entrypoint: str | None,
        wait: str | None,
        walltime: str | None,
        notify: bool,
        jupyter: bool,
        dry_run: bool,
    ) -> None:
        interactive = sys.stdin.isatty()  # this process's own terminal: the container gets one only where it has one
        request = RunRequest(
            image=image,
            command=list(command),
            gpu_request=gpu_request,
            force=force,
            cpus=cpus,
            volumes=list(volumes),
            env=list(env),
            ports=list(ports),
            short=short,
            detach=detach,
            keep=keep,
            shm_size=shm_size,
            no_workspace=no_workspace,
            as_user=as_user,
            entrypoint=entrypoint,
            jupyter=jupyter,
            interactive=interactive,
            terminal=interactive and sys.stdout.isatty(),
            time=walltime,
            notify=notify,
        )
        fn(RunCall(request, wait, dry_run, click.get_current_context().meta.get(_WORDS, ())))

    typed.__name__, typed.__doc__ = getattr(fn, "__name__", "run"), fn.__doc__
    decorated: Callable[..., None] = typed
    for flag in reversed(_FLAGS):
        decorated = flag(decorated)
    return decorated


def parse(words: list[str]) -> RunCall | None:
    """`imgbuild run WORDS` read by the command line's own grammar (a click error for words it refuses, as the
    command line's); None where the words asked only for the help, which is printed."""
    got: list[RunCall] = []

    def keep(call: RunCall) -> None:
        got.append(call)

    command = click.command("run", cls=RunCommand, context_settings={"help_option_names": ["-h", "--help"]})
    command(grammar(keep)).main(list(words), prog_name="imgbuild run", standalone_mode=False)
    return got[0] if got else None


def hide_values(words: list[str], mark: str = "***") -> list[str]:
    """`imgbuild run WORDS` as others may read them (`queue ls`, the audit log): the value of each variable run's
    grammar reads from them replaced by `mark`, in every spelling it reads (`-e N=V`, `--env N=V`, `--env=N=V`,
    `-eN=V`, `-deN=V`), its name kept, and any other word that ends the same way. Words the grammar refuses (a
    run that never starts, still audited) keep no value at all: every word's text after a `=` is hidden."""
    command = click.command("run", cls=RunCommand, add_help_option=False)(grammar(lambda call: None))
    try:
        with command.make_context("run", list(words)) as ctx:  # parsed and checked, nothing run or printed
            given: tuple[str, ...] = ctx.params["env"]
    except click.ClickException:
        return [word.partition("=")[0] + "=" + mark if "=" in word else word for word in words]
    variables = [item.partition("=") for item in given]
    secret = [(f"{name}={value}", len(value)) for name, eq, value in variables if eq and value]
    return [next((w[: len(w) - n] + mark for item, n in secret if w.endswith(item)), w) for w in words]
