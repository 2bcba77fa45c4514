"""What an image must pass before `imgbuild run` starts it: the site's signature rule, where it may come from
(one built here is never pulled), and its config judged before its first run (LD_PRELOAD on a vulnerable
NVIDIA Container Toolkit host)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import UsageError
from imgbuild.servers.spec import is_recipe

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine
    from imgbuild.imageref import ImageRef


def under_prefix(ref: ImageRef, prefix: str) -> bool:
    """Whether the image `ref` (imageref.ImageRef) lies under `prefix` (REGISTRY[/PATH]), its registry compared by
    what it is, not how it is spelled: a site's `127.0.0.1:5000/lab` covers `localhost:5000/lab/x`."""
    from imgbuild import imageref

    try:
        wanted = imageref.parse(prefix.rstrip("/") + "/x")
    except imageref.BadReference:
        return False
    if ref.identity != wanted.identity:
        return False
    path = wanted.repository.removesuffix("x").rstrip("/")
    return not path or ref.repository == path or ref.repository.startswith(path + "/")


def check_signed(image: str, settings: Settings) -> str:
    """The image to run: under the site's `run.signed_only` prefixes, only one signed by `run.signing_key`, and
    then by its digest (the tag cannot move between the check and the pull); any other image as it is."""
    from imgbuild import imageref
    from imgbuild.errors import EnvironmentProblem
    from imgbuild.registry.client import RegistryClient
    from imgbuild.supply import attest, verify

    rules = settings.run
    if not rules.signed_only or is_recipe(image):
        return image
    try:
        ref = imageref.parse(image)
    except imageref.BadReference as exc:
        raise UsageError(f"image: {exc}; give REGISTRY/REPO:TAG or a recipe file") from None
    prefix = next((p for p in rules.signed_only if under_prefix(ref, p)), None)
    if prefix is None:
        return image
    if not rules.signing_key:
        raise EnvironmentProblem("the site sets run.signed_only but no run.signing_key to check against")
    client = RegistryClient.for_host(ref.registry, settings)
    digest = ref.digest or client.content_digest(ref.repository, ref.reference)  # hashed, never a header
    if not digest:
        raise UsageError(f"{image}: the registry has no such image")
    verdict = verify.check_signature(
        client, ref.repository, ref.name, digest, attest.load_verifier(Path(rules.signing_key))
    )
    if not verdict.ok:
        raise UsageError(
            f"{image}: this site runs images under {prefix} only when signed by its key ({verdict.detail})"
        )
    return f"{ref.name}@{digest}"


def built_here(image: str, namespaces: set[str]) -> bool:
    """`<user>/<name>:<tag>` with no registry host: the name imgbuild gives what it builds on this host. Never
    pulled: on Docker Hub that name is whoever registered it, not this host's user."""
    from imgbuild.imageref import BadReference, parse

    try:
        ref = parse(image)
    except BadReference:
        return False
    return not ref.host and "/" in ref.path and ref.path.split("/", 1)[0] in namespaces - {""}


def pull_to_inspect(image: str, engine: ImageEngine, local_only: bool) -> None:
    """An image this host does not have yet is pulled before it starts, so that its config (LD_PRELOAD, labels)
    is judged before its first run, not after; one built here is never pulled (`built_here`)."""
    from imgbuild.errors import EnvironmentProblem, ImgbuildError

    if local_only or engine.images.image(image) is not None:
        return
    try:
        engine.images.pull(image)
    except ImgbuildError as exc:
        raise EnvironmentProblem(str(exc)) from None


def check_preload(image: str, engine: ImageEngine) -> str:
    """Refuse to start an image whose config sets LD_PRELOAD where the host's toolkit would run it on the host
    (NVIDIAScape); elsewhere, a warning for the caller to print ("" when there is nothing to say)."""
    from imgbuild.gpu.toolkit import image_preload_verdict

    info = engine.images.image(image)
    verdict = image_preload_verdict(
        list((info.config if info else {}).get("Env") or []), engine.host_has_gpus, local=engine.shares_host()
    )
    if verdict is None:
        return ""
    if verdict[0] == "fail":
        raise UsageError(f"{image}: {verdict[1]}")
    return f"note: {image}: {verdict[1]}"
