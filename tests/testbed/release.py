"""The test bed's NGC releases, built from the recorded facts (tests/ngc_facts.py); stdlib only.

python3 release.py context KEY PUBLIC FROM_IMAGE DIR [--wheels=FOLDER] [ENV=VALUE ...]
    writes DIR/Dockerfile (and the entrypoint, the shaping scripts) for the stand-in of release KEY over
    FROM_IMAGE, whose framework's public version is PUBLIC; ENV=VALUE overrides the amd64 env (the CUDA
    stand-in says what it has installed); the wheels in FOLDER (the release's real bundled distributions and
    tools, ngc_facts.standin's `wheels`) are mounted where the shaping installs them (tests/testbed/ngc_shape.py)
python3 release.py context-arm64 KEY PUBLIC FROM_IMAGE DIR
    the same for the arm64 image of release KEY (NGC's arm64 env and labels), over an arm64 FROM_IMAGE
python3 release.py index REGISTRY KEY PUBLIC [ARM64_SOURCE]
    turns the pushed amd64 image at KEY's tag into a manifest list with an arm64 image: a config-only one that
    carries NGC's arm64 config (registry code, `tags` and fleet checks read it), or the real arm64 image pushed
    to ARM64_SOURCE (REPO:TAG in the same registry), whose blobs are mounted into KEY's repository
python3 release.py has-arm64 REGISTRY KEY
    exit 0 when KEY's manifest list holds a real arm64 image made from these facts
python3 release.py fingerprint
    a hash of everything a stand-in is made from: a bed built from other facts is rebuilt
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shlex
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import ngc_facts  # noqa: E402

FINGERPRINT_LABEL = "org.imgbuild.testbed.facts"
LIST_TYPE = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
SLA_LICENSE = (
    "GOVERNING TERMS: The software and materials are governed by the NVIDIA Software License Agreement\n"
    "(found at https://www.nvidia.com/en-us/agreements/enterprise-software/nvidia-software-license-agreement/)\n\n"
)


def fingerprint() -> str:
    """What the stand-ins are made from: the facts they carry (not the prose around them) and the scripts."""
    parts = [HERE / "release.py", HERE / "ngc_shape.py", HERE / "bundled.py", HERE / "nvidia_entrypoint.sh"]
    parts += sorted((HERE / "entrypoint.d").iterdir())
    digest = hashlib.sha256()
    for path in parts:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    keys = (*ngc_facts.STANDIN_KEYS, ngc_facts.CUDA_STANDIN_KEY)
    digest.update(json.dumps([ngc_facts.standin(key, "0.0.0") for key in keys], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _quote(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid, fully quoted Dockerfile ENV/LABEL value


def context(
    key: str,
    public: str,
    from_image: str,
    out: Path,
    overrides: dict[str, str],
    platform: str = "amd64",
    wheels: Path | None = None,
) -> None:
    facts = ngc_facts.standin(key, public)
    env = {**facts["env"][platform], **overrides}
    labels = dict(facts["labels"][platform])
    for name, label in (("CUDNN_VERSION", "cudnn"), ("NCCL_VERSION", "nccl")):
        if name in overrides and f"com.nvidia.{label}.version" in labels:
            labels[f"com.nvidia.{label}.version"] = overrides[name]
    labels[FINGERPRINT_LABEL] = fingerprint()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "nvidia_entrypoint.sh", out / "nvidia_entrypoint.sh")
    shutil.copytree(HERE / "entrypoint.d", out / "entrypoint.d", dirs_exist_ok=True)
    if facts["license"] == "sla":
        (out / "entrypoint.d" / "30-container-license.txt").write_text(SLA_LICENSE)
    shutil.copy(HERE / "ngc_shape.py", out / "ngc_shape.py")
    shutil.copy(HERE / "bundled.py", out / "bundled.py")
    keys = ("framework", "module_version", "dist_version", "constraint_file", "original_constraint_file", "bundled")
    shaping = {k: facts[k] for k in keys}
    shaping["nvcc"] = facts["nvcc"] if wheels else ""  # the compiler comes with the release's wheels
    shaping["wheel_folder"] = "/tmp/wheels" if wheels else ""
    mount = ""
    if wheels:
        shutil.copytree(wheels, out / "wheels", ignore=shutil.ignore_patterns(".*"))
        mount = "--mount=type=bind,source=wheels,target=/tmp/wheels "
    lines = [
        f"FROM {from_image}",
        "COPY nvidia_entrypoint.sh /opt/nvidia/nvidia_entrypoint.sh",
        "COPY entrypoint.d/ /opt/nvidia/entrypoint.d/",
        "COPY ngc_shape.py bundled.py /tmp/shape/",
        f"RUN {mount}python3 /tmp/shape/ngc_shape.py {shlex.quote(json.dumps(shaping))} && rm -r /tmp/shape "
        "&& mkdir -p /workspace",
        "ENV " + " \\\n    ".join(f"{k}={_quote(v)}" for k, v in env.items()),
        "LABEL " + " \\\n      ".join(f"{_quote(k)}={_quote(v)}" for k, v in labels.items()),
        "WORKDIR /workspace",
        "EXPOSE 8888/tcp 6006/tcp",
        'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]',
        'CMD ["/bin/bash"]',
    ]
    (out / "Dockerfile").write_text("\n".join(lines) + "\n")


# --- the manifest list ---------------------------------------------------------------------------------


def _request(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    return urllib.request.urlopen(req, timeout=60)  # noqa: S310 - the bed's own registry on 127.0.0.1


def _put_blob(base: str, repo: str, blob: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    try:
        _request("HEAD", f"{base}/v2/{repo}/blobs/{digest}")
        return digest
    except urllib.error.HTTPError:
        pass
    with _request("POST", f"{base}/v2/{repo}/blobs/uploads/") as resp:
        location = resp.headers["Location"]
    if location.startswith("/"):
        location = base + location
    sep = "&" if "?" in location else "?"
    _request("PUT", f"{location}{sep}digest={digest}", blob, {"Content-Type": "application/octet-stream"}).close()
    return digest


def _get(base: str, repo: str, reference: str) -> tuple[bytes, str]:
    accept = {"Accept": f"{MANIFEST_TYPE}, {LIST_TYPE}"}
    with _request("GET", f"{base}/v2/{repo}/manifests/{reference}", headers=accept) as resp:
        return resp.read(), resp.headers.get("Content-Type", "")


def _json_blob(base: str, repo: str, digest: str) -> dict:
    with _request("GET", f"{base}/v2/{repo}/blobs/{digest}") as resp:
        return json.loads(resp.read())


def _mount(base: str, repo: str, source_repo: str, digest: str) -> None:
    """A blob of `source_repo` made a blob of `repo` too (the registry's cross-repository mount)."""
    url = f"{base}/v2/{repo}/blobs/uploads/?mount={digest}&from={source_repo}"
    with _request("POST", url) as resp:
        if resp.status != 201:
            raise RuntimeError(f"the registry did not mount {digest} into {repo}")


def _real_arm64(base: str, repo: str, source: str) -> dict:
    """The arm64 image pushed to `source` (REPO:TAG), copied into `repo` by digest; its list entry."""
    source_repo, _, source_tag = source.rpartition(":")
    body, media_type = _get(base, source_repo, source_tag)
    manifest = json.loads(body)
    for blob in [manifest["config"], *manifest["layers"]]:
        _mount(base, repo, source_repo, blob["digest"])
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    _request("PUT", f"{base}/v2/{repo}/manifests/{digest}", body, {"Content-Type": media_type}).close()
    return {
        "mediaType": media_type,
        "size": len(body),
        "digest": digest,
        "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"},
    }


def has_arm64(registry: str, key: str) -> bool:
    facts = ngc_facts.standin(key, "0.0.0")
    base, repo = f"http://{registry}", facts["repo"]
    try:
        body, media_type = _get(base, repo, facts["tag"])
        if not media_type.startswith(LIST_TYPE):
            return False
        entry = next(m for m in json.loads(body)["manifests"] if m["platform"]["architecture"] == "arm64")
        manifest = json.loads(_get(base, repo, entry["digest"])[0])
        config = _json_blob(base, repo, manifest["config"]["digest"])
    except (urllib.error.URLError, StopIteration, KeyError, ValueError):
        return False
    labels = config.get("config", {}).get("Labels") or {}
    return len(manifest["layers"]) > 1 and labels.get(FINGERPRINT_LABEL) == fingerprint()


def index(registry: str, key: str, public: str, arm64_source: str = "") -> None:
    facts = ngc_facts.standin(key, public)
    base, repo, tag = f"http://{registry}", facts["repo"], facts["tag"]
    body, media_type = _get(base, repo, tag)
    if media_type.startswith(LIST_TYPE):
        if not arm64_source:
            return
        amd64 = next(m for m in json.loads(body)["manifests"] if m["platform"]["architecture"] == "amd64")
    else:
        amd64 = {
            "mediaType": MANIFEST_TYPE,
            "size": len(body),
            "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
            "platform": {"architecture": "amd64", "os": "linux"},
        }
    arm64 = _real_arm64(base, repo, arm64_source) if arm64_source else _config_only_arm64(base, repo, facts)
    listing = json.dumps({"schemaVersion": 2, "mediaType": LIST_TYPE, "manifests": [amd64, arm64]}).encode()
    _request("PUT", f"{base}/v2/{repo}/manifests/{tag}", listing, {"Content-Type": LIST_TYPE}).close()


def _config_only_arm64(base: str, repo: str, facts: dict) -> dict:
    """The arm64 image: NGC's arm64 config over one empty layer; its Env and Labels are what is read."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w"):
        pass
    layer = gzip.compress(raw.getvalue(), mtime=0)
    labels = {**facts["labels"]["arm64"], FINGERPRINT_LABEL: fingerprint()}
    config = {
        "architecture": "arm64",
        "variant": "v8",
        "os": "linux",
        "config": {
            "Env": [f"{k}={v}" for k, v in facts["env"]["arm64"].items()],
            "Labels": labels,
            "Entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"],
            "Cmd": ["/bin/bash"],
            "WorkingDir": "/workspace",
            "ExposedPorts": {"6006/tcp": {}, "8888/tcp": {}},
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]},
    }
    config_blob = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "size": len(config_blob), "digest": _put_blob(base, repo, config_blob)},
        "layers": [{"mediaType": LAYER_TYPE, "size": len(layer), "digest": _put_blob(base, repo, layer)}],
    }
    arm_body = json.dumps(manifest).encode()
    arm_digest = "sha256:" + hashlib.sha256(arm_body).hexdigest()
    _request("PUT", f"{base}/v2/{repo}/manifests/{arm_digest}", arm_body, {"Content-Type": MANIFEST_TYPE}).close()
    return {
        "mediaType": MANIFEST_TYPE,
        "size": len(arm_body),
        "digest": arm_digest,
        "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"},
    }


def main(argv: list[str]) -> int:
    if len(argv) >= 6 and argv[1] == "context":
        options = [item for item in argv[6:] if item.startswith("--wheels=")]
        overrides = dict(item.split("=", 1) for item in argv[6:] if item not in options)
        wheels = Path(options[-1].partition("=")[2]) if options else None
        context(argv[2], argv[3], argv[4], Path(argv[5]), overrides, wheels=wheels)
    elif len(argv) == 6 and argv[1] == "context-arm64":
        context(argv[2], argv[3], argv[4], Path(argv[5]), {}, platform="arm64")
    elif len(argv) in (5, 6) and argv[1] == "index":
        index(argv[2], argv[3], argv[4], argv[5] if len(argv) == 6 else "")
    elif len(argv) == 4 and argv[1] == "has-arm64":
        return 0 if has_arm64(argv[2], argv[3]) else 1
    elif len(argv) == 2 and argv[1] == "fingerprint":
        print(fingerprint())
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
