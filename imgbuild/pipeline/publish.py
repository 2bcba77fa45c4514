"""PublishRequest a built image: push it, attach its smoke record, and with a key sign it and attach its provenance and
SBOM (cosign's tags), as one step that runs sharing an engine cannot interleave.

Runners that share one engine (CI containers on the host's socket) hold the target's engine-wide lease
(engine.lease) from re-tagging their own image to signing it, so no run pushes another's image under its own
provenance. A run that finds this plan's build already in the registry, signed by its key when it signs, leaves it
there (the same inputs, pushed by another runner a moment ago). Runs on different engines push different digests,
and each digest's attachments are its own: the tag ends at one runner's image with that runner's records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imgbuild import imageref
from imgbuild.config.settings import Settings
from imgbuild.engine import ImageEngine
from imgbuild.engine.lease import lease
from imgbuild.errors import EnvironmentProblem, ImgbuildError, JobFailed, RegistryCorrupt, UsageError
from imgbuild.facts import Label
from imgbuild.pipeline.plan import Plan
from imgbuild.platforms import arch_of
from imgbuild.registry.auth import engine_auth
from imgbuild.registry.client import RegistryClient
from imgbuild.registry.manifest import PlatformImage, split_reference
from imgbuild.registry.transport import digest_of
from imgbuild.reserved import platform_tag

if TYPE_CHECKING:
    from imgbuild.supply.attest import PublicKey, Signer

#: How long a push and its signing may hold the target's lease (one push may take an hour: engine.podman).
PUBLISH_SECONDS = 3600 + 600


@dataclass(frozen=True)
class RemoteBuild:
    """The registry's copy of a target: its digest (of the bytes served, never a header), the input hash its label
    carries ("" none), and whether the key asked about signed it."""

    digest: str
    input_hash: str
    signed: bool
    platforms: tuple[str, ...] = ()  # the CPU architectures a manifest list at the tag holds; () one image


def remote_build(target: str, settings: Settings, verifier: PublicKey | None = None) -> RemoteBuild | None:
    """The registry's copy of `target`, None where there is none or it cannot be read. With `verifier` (the signer's
    public key) its signature is verified as `verify` does: a label anyone can copy and any `.sig` tag vouch for
    nothing."""
    from imgbuild.supply.verify import check_signature

    host, repo, tag = split_reference(target)
    client = RegistryClient.for_host(host, settings)
    try:
        digest = client.content_digest(repo, tag)
        if not digest:
            return None
        manifest, config = client.image_config(repo, digest)
    except RegistryCorrupt:
        raise  # a registry that serves other bytes than it names is no copy to judge, and no absence either
    except ImgbuildError:
        return None
    remote = str(((config.get("config") or {}).get("Labels") or {}).get(Label.INPUT_HASH) or "")
    platforms = manifest.platforms
    if verifier is None:
        return RemoteBuild(digest, remote, False, platforms)
    try:
        signed = check_signature(client, repo, f"{host}/{repo}", digest, verifier).ok
    except RegistryCorrupt:
        raise
    except ImgbuildError:
        signed = False
    return RemoteBuild(digest, remote, signed, platforms)


@dataclass(frozen=True)
class PublishRequest:
    """One build's publication, made once (pipeline.build_job) and taken whole by `publish` (one image) and
    `publish_platforms` (a manifest list): the plan built, the smoke report of the engine's own platform (JSON), the
    settings and engine it goes through, the backend that built it (never "auto" once picked), the signer (None:
    pushed unsigned) and where progress goes."""

    plan: Plan
    smoke: dict[str, Any]
    settings: Settings
    engine: ImageEngine
    backend: str
    signer: Signer | None
    log: Callable[[str], None]

    def said(self, prefix: str) -> Callable[[str], None]:
        """`log`, each line under `prefix` (an image reference)."""
        return lambda text: self.log(f"{prefix}: {text}")


def publish(request: PublishRequest, image_id: str) -> str:
    """Push `image_id` (this run's build of the request's plan) as its target and attach its smoke record beside it
    (a fresh runner's next smoke test spares what imported there); with a signer (attest.Signer), sign the pushed
    digest and attach its provenance and SBOM. Returns the digest the target holds."""
    from imgbuild.pipeline.spared import smoke_record, smoke_scope
    from imgbuild.supply import attest

    plan, settings, engine, signer, log = request.plan, request.settings, request.engine, request.signer, request.log
    target = plan.target
    ref = imageref.parse(target)
    with lease(engine.leases, target, image_id, PUBLISH_SECONDS, request.said(target)):
        there = remote_build(target, settings, signer.public_key() if signer is not None else None)
        if there is not None and there.input_hash == plan.input_hash and (signer is None or there.signed):
            log(f"{target}: the registry has this build already ({there.digest[:19]}, the same inputs): left as it is")
            return there.digest
        own = arch_of(engine.host_platform())
        if there is not None and set(there.platforms) - {own}:  # this platform's push would drop the others
            raise UsageError(
                f"{target} is a manifest list of {', '.join(there.platforms)} in the registry: pushing this machine's "
                f"platform alone would drop the others; build it with --platform "
                f"{','.join('linux/' + p for p in there.platforms)} --push"
            )
        engine.images.tag(image_id, target)  # this run's image, whatever another run promoted since
        log(f"{target}: pushing")
        digest = str(engine.images.push(target, engine_auth(target), request.said(target), settings.registry_deadline))
        client = RegistryClient.for_host(ref.registry, settings)
        _still_ours(client, target, digest)
        if request.smoke.get("ok") is True:  # a fresh runner's next smoke test imports only what changed (vouched)
            try:
                record = smoke_record(request.smoke, plan.base.identity, smoke_scope(plan), digest, signer)
                attest.publish(client, ref.repository, digest, record)
            except ImgbuildError as exc:
                log(f"{target}: no smoke record attached ({str(exc)[:160]}): the next fresh runner imports all again")
        if signer is not None:
            _sign(request, signer, digest, client)
    return digest


def _sign(request: PublishRequest, signer: Signer, digest: str, client: RegistryClient) -> None:
    """Sign `digest` (the target's, pushed) and attach its provenance and SBOM, cosign's tags."""
    from imgbuild.pipeline.describe import describe
    from imgbuild.supply import attest

    plan, engine = request.plan, request.engine
    ref = imageref.parse(plan.target)
    used = engine.pick_backend(request.backend)  # the backend that built it, never "auto"
    builder = {"engine": str(engine.host_info().get("version", "")), "kind": engine.name, "backend": used}
    made = describe(plan, request.smoke, ref.name, digest, builder)
    tags = attest.publish(client, ref.repository, digest, attest.attachments(made, signer))
    request.log(f"{plan.target}: signed {digest[:19]}; attached {', '.join(tags)}")


def publish_platforms(request: PublishRequest, builds: list[tuple[str, str]]) -> str:
    """Push one image per platform (`builds`: (platform, image id), each built and smoke-tested) as
    `<tag>-<arch>`, then the manifest list of them at the target's tag; with a signer, sign the list's digest and
    attach its provenance and SBOM (of the smoke report, the engine's own platform's). Returns the list's digest, of
    the bytes put; a tag another pusher moved meanwhile fails the run (exit 1) with both digests named, nothing
    signed. A registry that refuses a manifest list is an environment problem (exit 3): the platforms' tags stay."""
    from imgbuild.registry.manifest import manifest_list

    plan, settings, engine, signer, log = request.plan, request.settings, request.engine, request.signer, request.log
    target = plan.target
    ref = imageref.parse(target)
    client = RegistryClient.for_host(ref.registry, settings)
    images: list[PlatformImage] = []
    with lease(engine.leases, target, builds[0][1], PUBLISH_SECONDS, request.said(target)):
        for platform, image_id in builds:
            per = f"{plan.image}:{platform_tag(plan.tag, platform)}"
            engine.images.tag(image_id, per)
            log(f"{per}: pushing ({platform})")
            digest = str(engine.images.push(per, engine_auth(per), request.said(per), settings.registry_deadline))
            body, media_type, served = client.manifest_raw(ref.repository, digest)
            images.append(PlatformImage(platform, served, media_type, len(body)))
        content, list_type = manifest_list(images)
        try:
            client.put_manifest(ref.repository, ref.reference, content, list_type)
        except ImgbuildError as exc:
            pushed = ", ".join(platform_tag(plan.tag, i.platform) for i in images)
            raise EnvironmentProblem(
                f"{target}: the registry refused the manifest list of {len(images)} platforms ({str(exc)[:200]}); "
                f"each platform's image is pushed as {pushed}"
            ) from None
        digest = digest_of(content)  # of the bytes put, never of what the tag serves a moment later
        _still_ours(client, target, digest)
        log(f"{target}: manifest list {digest} ({', '.join(i.platform for i in images)})")
        if signer is not None:
            _sign(request, signer, digest, client)
            _sign_entries(client, ref.name, ref.repository, images, signer)
    return digest


def _sign_entries(client: RegistryClient, image: str, repo: str, images: list[PlatformImage], signer: Signer) -> None:
    """Sign each platform's image of a manifest list too (cosign's `sign --recursive`): a runtime that resolves the
    list to its own platform's entry (and `run.signed_only`, asked of that entry) finds it signed by the same key."""
    from imgbuild.supply import attest

    for entry in images:
        attest.publish(client, repo, entry.digest, {"sig": attest.signature_artifact(image, entry.digest, signer)})


def _still_ours(client: RegistryClient, target: str, pushed: str) -> None:
    """Refuse to go on (sign, attach) when the tag no longer serves `pushed`, the digest of what this run put:
    another pusher moved it meanwhile. Whatever is signed is `pushed` itself, never a digest read back."""
    ref = imageref.parse(target)
    held = client.content_digest(ref.repository, ref.reference)
    if held != pushed:
        raise JobFailed(
            f"{target}: this run pushed {pushed}, but the tag now holds {held or 'nothing'}: another pusher "
            "moved it meanwhile; nothing signed or attached (run again once the other push is done)"
        )
