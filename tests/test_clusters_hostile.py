"""What a Slurm job or an Apptainer definition carries from a user stays literal: shell payloads in a job's command
and binds, values that become #SBATCH lines, %-sections in a definition's run commands, env expansion as Docker's."""

from __future__ import annotations

import pytest

from imgbuild.errors import UsageError
from imgbuild.recipe import load_recipe
from tests.support import RECIPE_HEAD

SHELL_PAYLOADS = ["$(touch PWNED)", "`touch PWNED`", "$((0))$(touch PWNED)", "${HOME:-$(touch PWNED)}", "x;touch PWNED"]


def _native(tmp_path, body: str) -> str:
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import apptainer_definition
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "a.txt").write_text("a")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE_HEAD + body)
    return apptainer_definition(make_plan(load_recipe(recipe), settings(), fake_inspect), "native")


@pytest.mark.parametrize("payload", SHELL_PAYLOADS)
@pytest.mark.parametrize("runtime", ["apptainer", "docker", "pyxis"])
def test_the_jobs_command_and_binds_are_literal_when_the_job_starts(payload, runtime, tmp_path):
    """`$(...)` in the command ran when the job started (only $VAR/${VAR} may expand there)."""
    import os
    import subprocess

    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.clusters.slurm import sbatch_script
    from imgbuild.config.site import slurm_site

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for stub in ("srun", "apptainer", "docker", "nvidia-smi", "scontrol", "sbatch", "python3"):
        (bin_dir / stub).write_text('#!/bin/sh\nprintf "%s\\n" "$@" >> "$ARGS_LOG"\n')
        (bin_dir / stub).chmod(0o755)
    # srun runs its command as a node would (the docker runtime's `sh -c 'exec docker run ...'` included)
    (bin_dir / "srun").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@" >> "$ARGS_LOG"\n'
        'while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done\n[ $# -gt 0 ] && exec "$@"\n'
    )
    flags = JobFlags(
        ["python3", "train.py", "--tag", payload, "$HOME"],
        "/sif/x.sif" if runtime == "apptainer" else "lab/x:1",
        "x",
        gpus=1,
        runtime=runtime,
        binds=[f"/data/{payload}:/data"] if runtime != "pyxis" else [],
        usage=False,
    )
    script = tmp_path / "job.sh"
    script.write_text(sbatch_script(job_from_flags(flags, slurm_site({}))))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ARGS_LOG": str(tmp_path / "args.log"),
        "SLURM_JOB_ID": "7",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_NNODES": "1",
        "HOME": "/home/u",
    }
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert not (tmp_path / "PWNED").exists(), script.read_text()
    words = (tmp_path / "args.log").read_text().splitlines()
    assert payload in words or any(payload in w for w in words), words
    assert "/home/u" in words  # the job's own variables still expand


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("job_name", "x\ntouch PWNED"),
        ("job_name", "x y"),
        ("time", "1:00:00\ntouch PWNED"),
        ("time", "١:00:00"),
        ("mem", "64G\n#SBATCH --gres=gpu:8"),
        ("output", "out-%j.txt\ntouch PWNED"),
        ("partition", "gpu\nrm -rf ~"),
        ("account", "p;id"),
        ("gpu_type", "a100\n"),
    ],
)
def test_values_that_become_sbatch_lines_are_whole_string_checked(flag, value):
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    with pytest.raises(UsageError, match="is not valid here"):
        job_from_flags(JobFlags(["true"], "x.sif", "x", **{flag: value}), slurm_site({}))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/opt/tools/bin:$PATH", "/opt/tools/bin:/usr/bin:/bin"),
        ("${HOME}/cache", "/home/u/cache"),
        ("a$(touch PWNED)b", "a$(touch PWNED)b"),
        ("`touch PWNED`", "`touch PWNED`"),
        ('quote " and \\ back', 'quote " and \\ back'),
        ("$1 and $$", "$1 and $$"),
        ("it's", "it's"),
    ],
)
def test_apptainer_env_expands_variables_as_docker_env_does_and_nothing_else(value, expected, tmp_path):
    """`PATH: /opt/tools/bin:$PATH` (the docs' own example) stayed literal in the SIF."""
    import subprocess

    from imgbuild.pipeline.render import sh_env

    script = f'export X={sh_env(value)}\nprintf %s "$X"\n'
    out = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/u"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert out.stdout == expected and not (tmp_path / "PWNED").exists()


def test_a_run_command_starting_with_percent_cannot_end_post(tmp_path):
    """A `run:` command whose first word starts with % ended %post (Apptainer reads a section at a line's first
    word): each now runs as Docker's RUN does, through /bin/sh -c."""
    from spython.main.parse.parsers import SingularityParser

    path = tmp_path / "x.def"
    path.write_text(_native(tmp_path, "run: ['%setup', 'echo {a}']\n"))
    recipe = SingularityParser(str(path)).recipe["spython-base"]
    post = "\n".join(recipe.install)
    assert "/bin/sh -c %setup" in post and "/bin/sh -c 'echo {a}'" in post


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("files: [{src: a.txt, dest: '/opt/my data/a.txt'}]\n", "cannot hold white space"),
        ("run: ['echo {{ X }}']\n", "Apptainer reads as a build argument"),
        ("env: {A: '{{ secret }}'}\n", "Apptainer reads as a build argument"),
    ],
)
def test_what_a_definition_cannot_carry_is_refused_with_the_way_that_can(body, words, tmp_path):
    with pytest.raises(UsageError, match=words):
        _native(tmp_path, body)


def test_an_escaped_dollar_still_reaches_the_container_for_its_own_shell():
    r"""`sh -c "echo \$SLURM_PROCID \$(id -u)"` is the documented way to expand inside the container."""
    from imgbuild.shellwords import UserWord, shell_words

    assert shell_words([UserWord(r"echo \$SLURM_PROCID \$(id -u)")]) == r'"echo \$SLURM_PROCID \$(id -u)"'
    assert shell_words([UserWord("$(id -u)")]) == "'$(id -u)'"
