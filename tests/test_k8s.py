"""`imgbuild k8s`, Kubernetes on paper. No API server can run here, so every manifest is
validated offline against the published schemas: Kubernetes' own (`kubernetes-validate`, strict: an unknown
field fails) for the Job and for the pod the TrainJob patches, and Kubeflow Trainer's models
(`kubeflow-trainer-api`) for the TrainJob, which must come back from them unchanged."""

from __future__ import annotations

import json
import re
import subprocess
from decimal import Decimal

import kubernetes_validate
import pytest
import requests
import yaml
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

from imgbuild.clusters.k8s import K8sJob, manifest
from imgbuild.config.site import K8sSite, checked_section
from imgbuild.errors import ImgbuildError, RecipeError, UsageError
from tests.conftest import run_cli, use_site_config

#: Kubernetes releases a site may run, old to new: every manifest is checked against each strictly.
K8S_VERSIONS = ("1.30.0", "1.33.0", "1.35.0")
IMAGE = "registry.example.org/lab/research:24.05@sha256:" + "a" * 64
SITE = checked_section(
    K8sSite,
    "k8s",
    {
        "namespace": "ml",
        "queue": "team-a",
        "priority_class": "research",
        "pull_secrets": ["lab-registry"],
        "volumes": ["datasets:/datasets:ro", "scratch:/scratch"],
        "mem_per_gpu": "60Gi",
    },
)


def validated(doc: dict) -> dict:
    """The manifest, validated by the schemas of what it is; returns it."""
    if doc["kind"] == "TrainJob":
        # Trainer's models: wrong types fail; an unknown field would be dropped, so the round trip must be exact
        assert TrainerV1alpha1TrainJob.from_dict(doc).to_dict() == doc
        patch = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod_spec = patch["template"]["spec"]["template"]["spec"]
        container = {**pod_spec["containers"][0], "image": doc["spec"]["trainer"]["image"]}
        container["resources"] = doc["spec"]["trainer"]["resourcesPerNode"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "node"}}
        pod["spec"] = {**pod_spec, "containers": [container]}
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(pod, version, strict=True)  # the patched pod is a valid pod
    else:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    return doc


@pytest.mark.parametrize(
    "gpus, nodes, torchrun, kind",
    [
        (1, 1, None, "Job"),
        (0, 1, None, "Job"),
        (4, 1, False, "Job"),
        (2, 1, None, "TrainJob"),
        (8, 4, None, "TrainJob"),
        (1, 1, True, "TrainJob"),
    ],
)
def test_every_layout_validates_against_the_published_schemas(gpus, nodes, torchrun, kind):
    job = K8sJob(IMAGE, ["python3", "train.py", "--lr", "3e-4"], "research", 1000, 1000, gpus, nodes, torchrun=torchrun)
    job.site = SITE
    doc = validated(manifest(job))
    assert doc["kind"] == kind and doc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert doc["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "research"  # Kueue's WorkloadPriorityClass
    assert doc["metadata"]["namespace"] == "ml" and doc["metadata"]["name"] == "research"
    if kind == "Job":
        pulls = doc["spec"]["template"]["spec"]["imagePullSecrets"]
    else:
        patch = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pulls = patch["template"]["spec"]["template"]["spec"]["imagePullSecrets"]
    assert pulls == [{"name": "lab-registry"}]  # the pod's, in the Trainer's PodSpecPatch for a TrainJob
    if kind == "Job":
        pod = doc["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"] == IMAGE and container["command"] == ["python3", "train.py", "--lr", "3e-4"]
        resources = container["resources"]
    else:
        pod = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = pod["template"]["spec"]["template"]["spec"]
        trainer = doc["spec"]["trainer"]
        # the command as typed, under torchrun (the runtime gives PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR ...)
        assert trainer["command"] == ["torchrun", "train.py", "--lr", "3e-4"]
        assert trainer["numNodes"] == nodes and trainer["numProcPerNode"] == max(gpus, 1)
        assert doc["spec"]["runtimeRef"] == {
            "name": "torch-distributed", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"
        }  # fmt: skip
        resources = trainer["resourcesPerNode"]
    assert pod["securityContext"] == {
        "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}
    }  # fmt: skip
    assert pod["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert pod["volumes"][1]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert resources["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
    assert resources["limits"]["memory"] == f"{60 * max(gpus, 1)}Gi" == resources["requests"]["memory"]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"image": "lab/research:24.05"}, "pinned by digest"),
        ({"image": "lab/research@sha256:" + "a" * 63}, "pinned by digest"),
        ({"name": "Research"}, "--name 'Research'"),
        ({"name": "a" * 64}, "--name"),
        ({"name": "x;rm"}, "--name"),
        ({"nodes": 2, "torchrun": False}, "runs under torchrun"),
        ({"command": []}, "give the command"),
    ],
)
def test_what_kubernetes_would_refuse_is_refused_here(change, words):
    fields = {"image": IMAGE, "command": ["t.py"], "name": "research", "uid": 1000, "gid": 1000, **change}
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace("[", r"\[")):
        manifest(K8sJob(**fields))


@pytest.mark.parametrize(
    "section",
    [
        {"volumes": ["Data:/data"]},
        {"volumes": ["data:relative"]},
        {"volumes": ["data:/da\u202eta"]},
        {"volumes": ["data:/data:rw"]},
        {"queue": "team a"},
        {"namespace": "ML"},
        {"shm_size": "16 GB"},
        {"shm_size": "١٦Gi"},
        {"gpu_resource": "gpu"},
        {"scheduler": "yunikorn"},
    ],
)
def test_the_k8s_section_of_the_site_config_is_checked_like_any_input(section, tmp_path, monkeypatch):
    from imgbuild.config.settings import load_settings

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"k8s": section}, allow_unicode=True))
    use_site_config(monkeypatch, str(site))
    with pytest.raises(RecipeError, match=r"k8s\."):
        load_settings({})


def test_a_recipe_that_was_never_pushed_has_no_digest_to_pin(tmp_path):
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: never-pushed\nbase: {framework: pytorch, tag: "24.05"}\n')
    res = run_cli("k8s", str(recipe), "--", "python3", "t.py", cwd=tmp_path, env={"DOCKER_HOST": "unix:///nonexistent"})
    assert res.code in (2, 3) and "Traceback" not in res.err, res.err
    bad = run_cli("k8s", IMAGE, "--mem", "64 GB", "--", "t.py")
    assert bad.code == 2 and "--mem '64 GB': not a Kubernetes quantity" in bad.err


@pytest.mark.engine
def test_the_cli_pins_an_image_and_a_pushed_recipe_by_their_registry_digests(testbed, tmp_path, unique, cleanup_images):
    """End to end on the bed: a tag is pinned by the registry's digest for it; a recipe by the digest its push
    recorded; the written manifest validates."""
    registry = testbed["IMGBUILD_TESTBED_REGISTRY"]
    tag = f"{registry}/nvidia/pytorch:24.05-py3"
    accept = ", ".join(
        [
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.docker.distribution.manifest.v2+json",
            "application/vnd.oci.image.manifest.v1+json",
        ]
    )
    head = requests.head(
        f"http://{registry}/v2/nvidia/pytorch/manifests/24.05-py3", headers={"Accept": accept}, timeout=30
    )
    digest = head.headers["Docker-Content-Digest"]
    out = tmp_path / "job.yaml"
    res = run_cli("k8s", tag, "--gpus", "2", "--nodes", "2", "-o", str(out), "--", "python3", "train.py")
    assert res.code == 0, res.err
    doc = validated(yaml.safe_load(out.read_text()))
    assert doc["spec"]["trainer"]["image"] == f"{tag}@{digest}"
    assert doc["metadata"]["generateName"] == "pytorch-"

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: k8s-{unique}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n')
    built = run_cli("build", str(recipe), cwd=tmp_path)
    assert built.code == 0, built.err
    local = built.out.strip().splitlines()[-1].split(" -> ")[0]
    cleanup_images.append(local)
    pushed = f"{registry}/lab/k8s-{unique}:v1"
    for step in (["docker", "tag", local, pushed], ["docker", "push", pushed]):
        assert subprocess.run(step, capture_output=True).returncode == 0, step
    cleanup_images.append(pushed)
    res = run_cli("k8s", str(recipe), "--gpus", "1", "--name", "smoke", "--", "python3", "t.py", cwd=tmp_path)
    assert res.code == 0, res.err
    doc = validated(yaml.safe_load(res.out))
    image = doc["spec"]["template"]["spec"]["containers"][0]["image"]
    inspect = subprocess.run(["docker", "image", "inspect", "-f", "{{json .RepoDigests}}", local], capture_output=True)
    assert image in json.loads(inspect.stdout) and image.startswith(f"{registry}/lab/k8s-{unique}@sha256:")


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("pull_secrets", ["Lab_Registry"], "not a Secret name"),
        ("pull_secrets", ["a" * 64], "not a Secret name"),
        ("pull_secrets", ["ok", "x\ny"], "not a Secret name"),
        ("pull_secrets", [f"s{n}" for n in range(17)], "16"),
        ("pull_secrets", "lab-registry", "list"),
        ("priority_class", "high priority", "not a label value"),
        ("priority_class", "-high", "not a label value"),
        ("priority_class", "h" * 64, "not a label value"),
        ("queue", "team a", "not a label value"),
        ("namespace", "ML", "not a namespace name"),
    ],
)
def test_a_sites_kubernetes_values_are_checked_whole_and_refused_in_one_line(key, value, said):
    from imgbuild.errors import UsageError

    with pytest.raises(UsageError) as refused:
        checked_section(K8sSite, "k8s", {key: value})
    assert said in str(refused.value) and "\n" not in str(refused.value).strip(), str(refused.value)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize(
    "scheduler, scheduler_name, label, annotation",
    [
        ("kueue", None, ("kueue.x-k8s.io/queue-name", "team-a"), None),
        ("volcano", "volcano", None, ("scheduling.volcano.sh/queue-name", "team-a")),
        ("runai", "runai-scheduler", ("runai/queue", "team-a"), None),
    ],
)
def test_the_queue_goes_where_the_sites_scheduler_reads_it(scheduler, scheduler_name, label, annotation, nodes):
    """Kueue reads a label on the job, Volcano a queue annotation (and runs its own scheduler), Run:ai its
    scheduler and a queue label; each manifest still passes the schemas."""
    from imgbuild.clusters.k8s import notes

    site = checked_section(K8sSite, "k8s", {"queue": "team-a", "scheduler": scheduler})
    doc = validated(manifest(K8sJob(IMAGE, ["python3", "t.py"], "job", 1000, 1000, gpus=2, nodes=nodes, site=site)))
    if doc["kind"] == "Job":
        pod = doc["spec"]["template"]
        assert pod["spec"].get("schedulerName") == scheduler_name
    else:  # the runtime names the scheduler (a TrainJob's pod patch cannot); the site is told so
        pod = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = pod["template"]["spec"]["template"]
        job = K8sJob(IMAGE, ["python3", "t.py"], "job", 1000, 1000, gpus=2, nodes=nodes, site=site)
        assert bool(notes(job)) == bool(scheduler_name)
    for meta in (doc["metadata"], pod.get("metadata", {}) if scheduler != "kueue" else doc["metadata"]):
        queue_labels = {
            k: v for k, v in meta.get("labels", {}).items() if k in ("kueue.x-k8s.io/queue-name", "runai/queue")
        }
        assert queue_labels == (dict([label]) if label else {})
        assert meta.get("annotations", {}) == (dict([annotation]) if annotation else {})


def test_the_pods_group_owns_their_volumes_and_a_root_caller_is_told(tmp_path):
    from imgbuild.clusters.k8s import notes

    job = K8sJob(IMAGE, ["python3", "t.py"], "job", 1000, 2000)
    assert manifest(job)["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 2000
    assert notes(job) == []
    root = K8sJob(IMAGE, ["python3", "t.py"], "job", 0, 0)
    assert "restricted Pod Security Standard refuses it" in notes(root)[0]


#: A quantity as Kubernetes parses one (k8s.io/apimachinery pkg/api/resource/quantity.go: <signedNumber><suffix>,
#: the suffix binary Ki..Ei, decimal m k M G T P E, or an exponent e<signedNumber>), and each suffix's factor.
K8S_QUANTITY = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]+)?")
FACTOR = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
          **{f"{s}i": 1024 ** (i + 1) for i, s in enumerate("KMGTPE")}}  # fmt: skip


def k8s_bytes(quantity: str) -> Decimal:
    number, suffix = re.fullmatch(r"([0-9.]+)(.*)", quantity).groups()  # type: ignore[union-attr]
    return Decimal(number) * FACTOR[suffix]


@hypothesis_settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(
    number=st.one_of(st.integers(1, 999_999_999).map(str), st.decimals("0.001", "99999", places=3).map(str)),
    suffix=st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "m"]),
    gpus=st.integers(1, 16),
)
def test_a_pods_memory_is_the_quantity_per_gpu_times_its_gpus_exactly_as_kubernetes_writes_one(number, suffix, gpus):
    """`128000Mi` per GPU x 8 was written `1.024e+06Mi` (a float's exponent form, which Kubernetes refuses), and
    seven digits lost the rest."""
    per_gpu = number + suffix
    site = checked_section(K8sSite, "k8s", {"mem_per_gpu": per_gpu})
    doc = manifest(K8sJob(IMAGE, ["python3", "t.py"], "job", 1000, 1000, gpus=gpus, site=site))
    pod = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else None
    resources = pod["containers"][0]["resources"] if pod else doc["spec"]["trainer"]["resourcesPerNode"]
    memory = resources["limits"]["memory"]
    assert K8S_QUANTITY.fullmatch(memory) and memory == resources["requests"]["memory"], memory
    assert k8s_bytes(memory) == k8s_bytes(per_gpu) * gpus, (per_gpu, gpus, memory)


@pytest.mark.parametrize("quantity", ["16K", "16ki", "1e3Gi"])
def test_a_quantity_kubernetes_would_refuse_is_refused_in_the_site_config(quantity):
    with pytest.raises(ImgbuildError, match="k8s.mem_per_gpu"):
        checked_section(K8sSite, "k8s", {"mem_per_gpu": quantity})
