"""NERSC's two runtimes, judged by their projects' own documents (no NERSC machine is reachable from here):

- Shifter (NERSC/shifter `doc/wlm/slurm.rst`, `doc/modules.rst`): the Slurm plugin takes `#SBATCH --image=docker:
  REPO:TAG` and `#SBATCH --volume=HOST:CONTAINER` (best in the batch script: given to the `shifter` command they
  start a new instance), sets the image up on every node before the script runs, and the step runs
  `srun shifter COMMAND`; a site's modules are `shifter --module=NAME`. The environment passes into the container.
- podman-hpc (NERSC/podman-hpc `podman_hpc/podman_hpc.py`, `etc/modules.d/*.yaml`): `podman-hpc run` is podman's
  run with the site's module flags (`--gpu`, `--nccl`); Podman's `-e NAME*` passes every host variable that
  starts so. The runtime itself runs on the Slurm bed with real Podman (tests/test_slurm_site.py)."""

from __future__ import annotations

import pytest

from imgbuild.clusters.jobs import JobFlags, job_from_flags
from imgbuild.clusters.slurm import JobSpec, sbatch_script
from imgbuild.config.site import slurm_site
from imgbuild.errors import UsageError
from imgbuild.shellwords import UserWord

IMAGE = "registry.nersc.gov/lab/research:v1"


def step_of(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("srun --cpus-per-task"))


def test_a_shifter_job_names_its_image_and_fixed_volumes_in_the_batch_script():
    job = JobSpec(["python3", "train.py"], IMAGE, gpus=4, nodes=2, runtime="shifter", shifter_modules=["gpu"],
                  binds=["/pscratch/sd/a/alice", "/global/cfs/cdirs/lab:/data:ro"])  # fmt: skip
    script = sbatch_script(job)
    head = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --image=docker:registry.nersc.gov/lab/research:v1" in head
    assert "#SBATCH --volume=/pscratch/sd/a/alice:/pscratch/sd/a/alice" in head
    assert "#SBATCH --volume=/global/cfs/cdirs/lab:/data:ro" in head
    step = step_of(script)
    assert " shifter --module=gpu env OMP_NUM_THREADS=10 torchrun " in step and "--image" not in step


def test_a_volume_with_a_variable_goes_to_the_shifter_command_where_the_shell_expands_it():
    """No shell reads an #SBATCH line: `$SCRATCH` there would reach Shifter as the letters $SCRATCH."""
    script = sbatch_script(JobSpec(["t.py"], IMAGE, gpus=1, runtime="shifter", stage=["/d/a.tar"],
                                   binds=[UserWord("$SCRATCH/data:/data")]))  # fmt: skip
    assert not any("$" in line for line in script.splitlines() if line.startswith("#SBATCH"))
    step = step_of(script)
    assert '"--volume=$SCRATCH/data:/data"' in step and '"--volume=$LOCAL_SCRATCH:$LOCAL_SCRATCH"' in step


@pytest.mark.parametrize(
    "bind", ["/data x:/d", "/d\n#SBATCH --uid=0", "/d#x:/d", "/d'x:/d", '/d"x:/d', "/d;rm:/d", "/d\t:/d"]
)
def test_a_bind_that_cannot_stand_in_an_sbatch_line_is_one_line(bind):
    with pytest.raises(UsageError) as refused:
        sbatch_script(JobSpec(["t.py"], IMAGE, gpus=1, runtime="shifter", binds=[UserWord(bind)]))
    assert "#SBATCH line" in str(refused.value) and "\n" not in str(refused.value)


def test_a_recipes_image_built_here_is_refused_for_shifter_with_the_way_out():
    """Shifter's image gateway pulls from registries: `alice/research:v1`, built on this machine only, would be
    looked up on Docker Hub, where a stranger may own that name."""
    with pytest.raises(UsageError, match="Docker Hub"):
        job_from_flags(JobFlags(["t.py"], "alice/research:v1", "research", runtime="shifter", local_image=True),
                       slurm_site({}))  # fmt: skip
    made = job_from_flags(JobFlags(["t.py"], IMAGE, "research", runtime="shifter", local_image=True),
                          slurm_site({"shifter_modules": ["gpu", "nccl-plugin"]}))  # fmt: skip
    assert made.image == IMAGE and made.shifter_modules == ["gpu", "nccl-plugin"]


def test_podman_hpc_gets_the_sites_module_flags_the_steps_variables_and_never_pulls_on_a_node():
    step = step_of(sbatch_script(JobSpec(["python3", "train.py"], IMAGE, gpus=4, nodes=2, runtime="podman-hpc",
                                         binds=["/pscratch/sd/a/alice"])))  # fmt: skip
    assert step.startswith("srun --cpus-per-task=40 podman-hpc run --rm --pull never --gpu --nccl ")
    assert " -e 'SLURM_*' " in step and " -e IMGBUILD_TF_WORKERS " in step and " -e 'NCCL_*' " in step
    assert " --network host --ipc host --pid host " in step and ' -v "$PWD:/workspace" -w /workspace ' in step
    assert f" -v /pscratch/sd/a/alice:/pscratch/sd/a/alice {IMAGE} env " in step
    cpu = step_of(sbatch_script(JobSpec(["true"], IMAGE, gpus=0, runtime="podman-hpc")))
    assert "--gpu" not in cpu and "--nccl" not in cpu


@pytest.mark.parametrize("modules", [["gpu x"], ["$(id)"], ["a" * 65], [""]])
def test_site_shifter_modules_are_checked_whole(modules):
    with pytest.raises(UsageError, match="slurm.shifter_modules"):
        slurm_site({"shifter_modules": modules})
