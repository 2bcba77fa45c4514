"""`slurm --runtime edf`: CSCS's Container Engine on Alps. The job writes an environment definition file and runs
its step with `srun --environment=FILE`, as eth-cscs/cscs-docs `docs/software/container-engine/run.md` shows. The
EDF is judged by `edf.md` and `resource-hook.md` (TOML; `image` as enroot's `[REGISTRY#]IMAGE[:TAG]` or a .sqsh
path; `workdir`; `mounts` as `SOURCE:DESTINATION[:FLAGS]`; `[annotations]` of string values, the NCCL hook
`com.hooks.aws_ofi_nccl.enabled` / `.variant`), read back with Python's own TOML parser after the script's shell
wrote it. No Alps machine is reachable from here: the Container Engine itself is not run."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from imgbuild.clusters.slurm import JobSpec, sbatch_script
from imgbuild.config.site import slurm_site
from imgbuild.errors import UsageError
from imgbuild.shellwords import UserWord


def written_edf(script: str, tmp_path, env: dict[str, str] | None = None, cwd=None) -> dict:
    """The EDF the script's own lines write, run by bash in `cwd` with Slurm's variables."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("edf="))
    end = lines.index("IMGBUILD_EDF", start + 1)
    submit = tmp_path / "submit"
    submit.mkdir(exist_ok=True)
    folder = cwd or submit
    program = "\n".join(["set -euo pipefail", *lines[start : end + 1], 'cat "$edf"'])
    run_env = {"PATH": "/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(submit), "SLURM_JOB_ID": "42", "USER": "alice",
               "SCRATCH": "/capstor/scratch/cscs/alice", **(env or {})}  # fmt: skip
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, env=run_env, cwd=folder, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (submit / ".imgbuild-edf-42.toml").read_text() == done.stdout
    return tomllib.loads(done.stdout)


def job(**kw) -> JobSpec:
    return JobSpec(["python3", "train.py"], kw.pop("image", "registry.example.org/lab/research:v1"), runtime="edf",
                   **{"gpus": 4, "framework": "pytorch", **kw})  # fmt: skip


def test_the_edf_names_the_image_as_enroot_does_the_job_folder_and_the_nccl_hook(tmp_path):
    script = sbatch_script(job(binds=["/capstor/scratch/cscs", "/store/lab:/data:ro"]))
    edf = written_edf(script, tmp_path)
    assert edf["image"] == "registry.example.org#lab/research:v1"
    assert edf["workdir"] == "/workspace"
    assert edf["mounts"] == [f"{tmp_path / 'submit'}:/workspace", "/capstor/scratch/cscs:/capstor/scratch/cscs",
                             "/store/lab:/data:ro"]  # fmt: skip
    assert edf["annotations"] == {"com": {"hooks": {"aws_ofi_nccl": {"enabled": "true", "variant": "cuda-dl"}}}}
    step = next(line for line in script.splitlines() if line.startswith("srun --cpus-per-task"))
    assert '"--environment=$edf"' in step and "trap 'rm -f \"$edf\"' EXIT" in script


@pytest.mark.parametrize("cuda, variant", [("12", "cuda12"), ("13", "cuda13"), ("11", "cuda-dl"), ("", "cuda-dl")])
def test_the_nccl_hook_variant_follows_the_images_cuda_major(cuda, variant, tmp_path):
    """CSCS builds its NCCL plugin per CUDA major (numbered variants must match the image's CUDA); cuda-dl, their
    general recommendation, where the image's CUDA is unknown or has no numbered variant."""
    edf = written_edf(sbatch_script(job(cuda_major=cuda)), tmp_path)
    assert edf["annotations"]["com"]["hooks"]["aws_ofi_nccl"]["variant"] == variant


def test_a_cpu_job_gets_no_nccl_hook_and_the_site_adds_its_own(tmp_path):
    site = slurm_site({"runtime": "edf", "edf_annotations": {"com.hooks.cxi.enabled": "false"}})
    edf = written_edf(sbatch_script(job(gpus=0, edf_annotations=dict(site.edf_annotations))), tmp_path)
    assert edf["annotations"] == {"com": {"hooks": {"cxi": {"enabled": "false"}}}}


def test_a_squashfs_image_is_named_by_its_path(tmp_path):
    assert written_edf(sbatch_script(job(image="/capstor/images/research.sqsh")), tmp_path)["image"] == (
        "/capstor/images/research.sqsh"
    )


@pytest.mark.parametrize(
    "bind, mount",
    [
        (UserWord("$SCRATCH/data:/data"), "/capstor/scratch/cscs/alice/data:/data"),  # the job's variables expand
        (UserWord("${SCRATCH}:/scratch:ro"), "/capstor/scratch/cscs/alice:/scratch:ro"),
        (UserWord("/d/$(id):/d"), "/d/$(id):/d"),  # never a command substitution
        (UserWord("/d/`id`:/d"), "/d/`id`:/d"),
        (UserWord("/d/$((1+1)):/d"), "/d/$((1+1)):/d"),
        (UserWord('/d/"quoted":/d'), '/d/"quoted":/d'),  # TOML's escape, not the end of the string
        (UserWord("/d/back\\slash:/d"), "/d/back\\slash:/d"),
        (UserWord("/d/$SCRATCH$(id):/d"), "/d/$SCRATCH$(id):/d"),  # a word with more than variables: all literal
        (UserWord('/d/x]"], image = "evil:/d'), '/d/x]"], image = "evil:/d'),  # no way out of the string
    ],
)
def test_each_bind_reaches_the_edf_as_one_string_with_only_its_variables_expanded(bind, mount, tmp_path):
    edf = written_edf(sbatch_script(job(binds=[bind])), tmp_path)
    assert edf["mounts"][1:] == [mount] and edf["image"] == "registry.example.org#lab/research:v1"


@pytest.mark.parametrize("folder", ['quo"te', "back\\slash", "new\nline"])
def test_a_job_folder_that_cannot_be_written_into_toml_stops_the_job_with_one_line(folder, tmp_path):
    script = sbatch_script(job())
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("edf="))
    end = lines.index("IMGBUILD_EDF", start + 1)
    odd = tmp_path / folder
    odd.mkdir()
    (tmp_path / "submit").mkdir()
    env = {"PATH": "/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path / "submit"), "SLURM_JOB_ID": "1"}
    done = subprocess.run(["bash", "-c", "\n".join(lines[start : end + 1])], capture_output=True, text=True,
                          env=env, cwd=odd, timeout=30)  # fmt: skip
    assert done.returncode == 2 and "cannot go into an EDF" in done.stderr
    assert not (tmp_path / "submit" / ".imgbuild-edf-1.toml").exists()


@pytest.mark.parametrize(
    "annotations",
    [{"Com.Hooks": "true"}, {"com.hooks.x": "a b"}, {"com.hooks.x": 'a"b'}, {"com.hooks.x": "$(id)"}, {"": "x"}],
)
def test_site_annotations_are_checked_whole(annotations):
    with pytest.raises(UsageError, match="slurm.edf_annotations"):
        slurm_site({"edf_annotations": annotations})


def test_a_recipes_image_runs_from_the_squashfs_export_writes():
    from imgbuild.clusters.jobs import JobFlags, job_from_flags

    made = job_from_flags(JobFlags(["t.py"], "lab/research:v1", "research", runtime="edf", local_image=True),
                          slurm_site({"sif_dir": "/capstor/images"}))  # fmt: skip
    assert made.image == "/capstor/images/research_v1.sqsh"
