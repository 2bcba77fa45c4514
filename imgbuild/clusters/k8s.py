"""Kubernetes, on paper: the manifest for a training run, checked offline against the published schemas.

Pure: the job (image pinned by digest, command, GPUs, the caller's IDs, the site's `k8s:` section) in, one
manifest out. Across nodes, or more than one GPU under torchrun, a Kubeflow Trainer v2 `TrainJob` (the
site's ClusterTrainingRuntime, `torch-distributed` by default, sets the rendezvous; the command runs under
`torchrun`, which reads the `PET_*` variables the runtime gives each node); else a plain `batch/v1` Job of
one pod. Both carry:
- Kueue's `queue-name` and `priority-class` labels (the site's queue and WorkloadPriorityClass);
- the site's `imagePullSecrets`;
- `nvidia.com/gpu` limits;
- the caller's UID and GID;
- a memory-backed `/dev/shm`;
- the site's data volumes.

No API server runs where imgbuild is tested: the output is validated, never applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from imgbuild.clusters.launch import alone_command, launches_itself, torchrun_command
from imgbuild.clusters.launchers import World, told
from imgbuild.config.site import K8S_VOLUME_RE, K8sSite
from imgbuild.errors import UsageError

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine

TRAINER_API = "trainer.kubeflow.org"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Kueue's WorkloadPriorityClass label (sigs.k8s.io/kueue pkg/controller/constants: WorkloadPriorityClassLabel)
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: Kubernetes object names: an RFC 1035 label (a letter first: the Trainer's CEL rule on TrainJob names from v2.1,
#: `^[a-z]([-a-z0-9]*[a-z0-9])?$`, and Services built from the name), kept to 63.
NAME_RE = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
#: The runtime patch's manager: the Trainer's admission (JobSet plugin, v2.2+) requires a domain-prefixed path
#: (k8s apimachinery's IsDomainPrefixedPath, "such as acme.io/foo"), as its own examples use.
PATCH_MANAGER = "imgbuild.dev/imgbuild"
OLD_TRAINERS = ("2.0", "2.1")
DIGEST_RE = re.compile(r"[^@\s;|&$`'\"\\]+@sha256:[0-9a-f]{64}")


@dataclass
class K8sJob:
    image: str  # pinned: REPO[:TAG]@sha256:...
    command: list[str]
    name: str  # metadata.name, or the generateName stem when generate is set
    uid: int
    gid: int
    gpus: int = 1  # per node
    nodes: int = 1
    cpus: int | None = None  # per node (default: the site's CPUs per GPU)
    mem: str | None = None  # per node, a quantity (default: the site's memory per GPU)
    torchrun: bool | None = None  # default: more than one GPU in all
    generate: bool = False  # metadata.generateName (kubectl create) instead of a fixed name
    site: K8sSite = field(default_factory=K8sSite)
    framework: str = ""  # the image's (pytorch, tensorflow, jax; "" unknown): TensorFlow and JAX get no torchrun

    @property
    def self_launching(self) -> bool:
        return launches_itself(list(self.command))

    @property
    def uses_torchrun(self) -> bool:
        """A TrainJob (the torch runtime's PET_* rendezvous); torchrun itself only where the command is no
        launcher of its own."""
        if self.nodes > 1:
            return True
        if self.self_launching or (self.torchrun is None and self.framework in ("tensorflow", "jax")):
            return False
        return self.gpus > 1 if self.torchrun is None else self.torchrun


def check(job: K8sJob) -> None:
    """What Kubernetes would refuse, refused here with the flag to blame."""
    if not DIGEST_RE.fullmatch(job.image):
        raise UsageError(f"{job.image[:120]}: a Kubernetes job's image is pinned by digest (REPO@sha256:...)")
    if not NAME_RE.fullmatch(job.name):
        raise UsageError(
            f"--name {job.name[:80]!r}: a Kubernetes name is a lower-case letter, then letters, digits and - "
            "(63 at most)"
        )
    if job.uses_torchrun and job.site.trainer_version in OLD_TRAINERS:
        raise UsageError(
            f"k8s.trainer_version {job.site.trainer_version}: imgbuild writes TrainJobs for Kubeflow Trainer v2.2 or "
            "later (spec.runtimePatches, which v2.0 and v2.1 do not have); upgrade the Trainer, or run on one node"
        )
    if job.gpus < 0 or job.nodes < 1:
        raise UsageError("--gpus must be >= 0 and --nodes >= 1")
    if job.nodes > 1 and job.torchrun is False:
        raise UsageError("--nodes: a job across nodes runs under torchrun (Trainer's torch runtime)")
    if job.nodes > 1 and job.framework in ("tensorflow", "jax") and not job.self_launching:
        raise UsageError(
            f"--nodes: a {job.framework} job across nodes needs its own launcher (the Trainer's torch runtime runs "
            "torchrun); run on one node, or give the command that starts the workers"
        )
    if not job.command:
        raise UsageError("give the command after --, e.g. -- python3 train.py")


def _resources(job: K8sJob) -> dict[str, Any]:
    """Guaranteed QoS: requests equal to limits, so the node's CPUs and memory are the job's."""
    per_gpu_cpus = job.site.cpus_per_gpu * max(job.gpus, 1)
    amounts: dict[str, Any] = {"cpu": str(job.cpus or per_gpu_cpus)}
    mem = job.mem or (_times(job.site.mem_per_gpu, max(job.gpus, 1)) if job.site.mem_per_gpu else None)
    if mem:
        amounts["memory"] = mem
    limits = {**amounts, **({job.site.gpu_resource: str(job.gpus)} if job.gpus else {})}
    return {"limits": limits, "requests": dict(amounts)}


def _times(quantity: str, n: int) -> str:
    """A quantity (QUANTITY_RE) `n` times, exactly, as Kubernetes writes one: `60Gi` x 8 -> `480Gi`, `7.5Gi` x 3 ->
    `22.5Gi`, `128000Mi` x 8 -> `1024000Mi` (never a float's `1.024e+06Mi`, which Kubernetes refuses)."""
    from decimal import Decimal

    number, unit = re.fullmatch(r"([0-9.]+)(.*)", quantity).groups()  # type: ignore[union-attr]
    value = Decimal(number) * n
    text = format(value, "f")
    return (text.rstrip("0").rstrip(".") if "." in text else text) + unit


def _volumes(job: K8sJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): the memory-backed /dev/shm, then each site volume."""
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.site.shm_size}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for i, spec in enumerate(job.site.volumes):
        claim, path, read_only = K8S_VOLUME_RE.fullmatch(spec).groups()  # type: ignore[union-attr]
        volumes.append(
            {"name": f"data-{i}", "persistentVolumeClaim": {"claimName": claim, "readOnly": bool(read_only)}}
        )
        mounts.append({"name": f"data-{i}", "mountPath": path, "readOnly": bool(read_only)})
    return volumes, mounts


def _security(job: K8sJob) -> dict[str, Any]:
    """The pod's: the caller's IDs, their group owning the mounted volumes (fsGroup: a claim's files writable by
    the job) and the runtime's default seccomp profile (the restricted Pod Security Standard; a root caller's job
    cannot meet it: notes() says so)."""
    context: dict[str, Any] = {
        "runAsUser": job.uid,
        "runAsGroup": job.gid,
        "fsGroup": job.gid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if job.uid != 0:
        context["runAsNonRoot"] = True
    return context


#: A container's own context under the restricted Pod Security Standard: no privilege escalation, no capability.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _env(job: K8sJob) -> list[dict[str, str]]:
    """Threads per process, and a writable HOME for the caller's UID (the image's may not be theirs)."""
    cpus = job.cpus or job.site.cpus_per_gpu * max(job.gpus, 1)
    workers = max(job.gpus, 1) if job.uses_torchrun or job.self_launching else 1
    return [{"name": "OMP_NUM_THREADS", "value": str(max(1, cpus // workers))}, {"name": "HOME", "value": "/tmp/home"}]


def _pull_secrets(job: K8sJob) -> dict[str, Any]:
    """The pod's `imagePullSecrets`, where the site names any (a private registry's credentials, as Secrets)."""
    return {"imagePullSecrets": [{"name": s} for s in job.site.pull_secrets]} if job.site.pull_secrets else {}


#: Where each scheduler reads the job's queue: a label on the job (Kueue's LocalQueue, Run:ai's project queue) or
#: an annotation on the pods (Volcano's queue), and the pods' schedulerName ("" the cluster's default).
SCHEDULERS = {
    "kueue": ("", "label", QUEUE_LABEL),
    "volcano": ("volcano", "annotation", "scheduling.volcano.sh/queue-name"),
    "runai": ("runai-scheduler", "label", "runai/queue"),
}


def _queue(job: K8sJob, where: str) -> dict[str, str]:
    """The queue's label or annotation, where the site's scheduler reads it from (`where`: label or annotation)."""
    _, kind, key = SCHEDULERS[job.site.scheduler]
    return {key: job.site.queue} if job.site.queue and kind == where else {}


def _metadata(job: K8sJob) -> dict[str, Any]:
    meta: dict[str, Any] = {"generateName": f"{job.name}-"} if job.generate else {"name": job.name}
    if job.site.namespace:
        meta["namespace"] = job.site.namespace
    labels = {"app.kubernetes.io/managed-by": "imgbuild", **_queue(job, "label")}
    if job.site.priority_class:
        labels[PRIORITY_LABEL] = job.site.priority_class
    meta["labels"] = labels
    if annotations := _queue(job, "annotation"):
        meta["annotations"] = annotations
    return meta


def _pod_template_metadata(job: K8sJob) -> dict[str, Any]:
    """A Job's pod template's metadata: imgbuild's label, and the queue where the scheduler reads it from pods."""
    meta = _pod_metadata(job).get("metadata", {})
    return {**meta, "labels": {"app.kubernetes.io/managed-by": "imgbuild", **meta.get("labels", {})}}


def _pod_metadata(job: K8sJob) -> dict[str, Any]:
    """The pods' own queue label or annotation, where a scheduler other than Kueue reads it from each pod."""
    if job.site.scheduler == "kueue":
        return {}
    labels, annotations = _queue(job, "label"), _queue(job, "annotation")
    meta = {**({"labels": labels} if labels else {}), **({"annotations": annotations} if annotations else {})}
    return {"metadata": meta} if meta else {}


def _scheduler(job: K8sJob) -> dict[str, Any]:
    """The pod spec's schedulerName, where the site's scheduler is not the cluster's default one."""
    name = SCHEDULERS[job.site.scheduler][0]
    return {"schedulerName": name} if name else {}


def notes(job: K8sJob) -> list[str]:
    """What the caller should know of the manifest before applying it."""
    said = []
    if job.uid == 0:
        said.append(
            "the job runs as root (the caller's UID 0): a namespace under the restricted Pod Security Standard "
            "refuses it; write the manifest as the user the job should run as"
        )
    name = SCHEDULERS[job.site.scheduler][0]
    if name and job.uses_torchrun:
        said.append(
            f"a TrainJob's pods get their scheduler from the site's ClusterTrainingRuntime ({job.site.runtime}): it "
            f"must name schedulerName: {name} (Volcano: podGroupPolicy.volcano), which a TrainJob cannot patch"
        )
    return said


def _world(job: K8sJob) -> World:
    """The Trainer's torch runtime gives every node's pod its rank and the rendezvous as PET_* variables."""
    if job.nodes == 1:
        return World(1, max(job.gpus, 1), "0", "", "")
    return World(job.nodes, max(job.gpus, 1), "$PET_NODE_RANK", "$PET_MASTER_ADDR", "$PET_MASTER_PORT")


def plain_job(job: K8sJob) -> dict[str, Any]:
    """A `batch/v1` Job: one pod, the command as typed (never retried: a failed run is looked at, not rerun)."""
    volumes, mounts = _volumes(job)
    container = {
        "name": "main",
        "image": job.image,
        "command": told(alone_command(list(job.command)), _world(job)),
        "env": _env(job),
        "resources": _resources(job),
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job),
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": _pod_template_metadata(job),
                "spec": {
                    "restartPolicy": "Never",
                    **_scheduler(job),
                    "securityContext": _security(job),
                    "containers": [container],
                    "volumes": volumes,
                    **_pull_secrets(job),
                },
            },
        },
    }


def train_job(job: K8sJob) -> dict[str, Any]:
    """A Kubeflow Trainer v2 TrainJob: torchrun on each node, the runtime's rendezvous, the pod's user, shm and
    volumes as a runtime patch on the runtime's `node` job."""
    volumes, mounts = _volumes(job)
    pod_patch = {
        "securityContext": _security(job),
        "volumes": volumes,
        "containers": [{"name": "node", "volumeMounts": mounts, "securityContext": dict(CONTAINER_SECURITY)}],
        **_pull_secrets(job),
    }
    patch = {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": "node", "template": {"spec": {"template": {**_pod_metadata(job), "spec": pod_patch}}}},
                    ]
                }
            }
        },
    }
    return {
        "apiVersion": f"{TRAINER_API}/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(job),
        "spec": {
            "runtimeRef": {"name": job.site.runtime, "apiGroup": TRAINER_API, "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "image": job.image,
                "command": told(list(job.command), _world(job))
                if job.self_launching
                else ["torchrun", *torchrun_command(list(job.command))],
                "numNodes": job.nodes,
                "numProcPerNode": max(job.gpus, 1),
                "resourcesPerNode": _resources(job),
                "env": _env(job),
            },
            "runtimePatches": [patch],
        },
    }


def manifest(job: K8sJob) -> dict[str, Any]:
    """The one manifest for `job`, checked first."""
    check(job)
    return train_job(job) if job.uses_torchrun else plain_job(job)


# --- the edges: where the digest comes from ----------------------------------------------------------------


def default_name(short: str) -> str:
    """A Kubernetes name stem from an image's short name: `pytorch_research` -> `pytorch-research`."""
    stem = re.sub(r"[^a-z0-9-]+", "-", short.lower()).strip("-")[:50].strip("-")
    if stem and not stem[0].isalpha():
        stem = f"job-{stem}"[:50].strip("-")  # 3dunet -> job-3dunet: a Kubernetes name starts with a letter
    return stem or "imgbuild"


def pinned_image(image: str, settings: Settings, engine_of: Callable[[], ImageEngine]) -> str:
    """`image` pinned by its registry digest: as written where it carries one; a recipe's (or a local image's)
    from the digest its push recorded; else the registry's answer for the tag."""
    from imgbuild import imageref
    from imgbuild.errors import EnvironmentProblem
    from imgbuild.registry.client import RegistryClient
    from imgbuild.servers.spec import is_recipe, resolve_image

    ref, _ = resolve_image(image, settings)
    parsed = imageref.parse(ref)
    if parsed.digest:
        return ref
    if is_recipe(image) or not parsed.host:
        info = engine_of().images.image(ref)
        pushed = [d for d in (info.repo_digests if info else ()) if DIGEST_RE.fullmatch(d)]
        if not pushed:
            raise UsageError(
                f"{ref}: no registry digest recorded: push it first (imgbuild rebuild --push, docker push), or give "
                "REPO@sha256:... "
                "(a cluster pulls images by digest, never a local tag)"
            )
        return str(pushed[0])
    digest = RegistryClient.for_host(parsed.host, settings).content_digest(parsed.repository, parsed.reference)
    if not digest:
        raise EnvironmentProblem(f"{ref}: the registry has no such tag")
    return f"{parsed.name}:{parsed.tag or 'latest'}@{digest}"
