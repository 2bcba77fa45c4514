"""Registry: tags, mirror, verify."""

from __future__ import annotations

from pathlib import Path

import click

from imgbuild.cli.base import Section, emit_json, settings_of
from imgbuild.errors import EXIT_FAILED

SECTION = Section("Registry")

#: The tag selection `tags` and `mirror` share (the NGC tag grammar's release and variant).
_SINCE = click.option("--since", metavar="YY.MM", help="Only releases from this one on (e.g. 24.01).")
_VARIANT = click.option(
    "--variant", default="none", show_default=True, help="'none' for plain tags, 'all', or a variant such as igpu."
)


@SECTION.command()
@click.argument("repository", default="pytorch")
@_SINCE
@_VARIANT
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Newest N tags.")
@click.option("--all", "show_all", is_flag=True, help="No limit.")
@click.option("--details", is_flag=True, help="CUDA, cuDNN, framework, Python, driver, size, digest per tag.")
@click.option("--compatible", is_flag=True, help="Only tags this host's driver and GPUs can run.")
@click.option("--driver", metavar="VERSION", help="Driver version to check against (default: NVML / nvidia-smi).")
@click.option("--arch", metavar="GPU[,GPU]", help="GPUs to check against: models (v100, h100) or capabilities (8.9).")
@click.option("--refresh", is_flag=True, help="Ignore the cached tag list.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable listing.")
@click.pass_context
def tags(
    ctx: click.Context,
    repository: str,
    since: str | None,
    variant: str,
    limit: int,
    show_all: bool,
    details: bool,
    compatible: bool,
    driver: str | None,
    arch: str | None,
    refresh: bool,
    as_json: bool,
) -> None:
    """List NGC tags (pytorch, tensorflow or ORG/REPO), newest first, from the registry itself."""
    from imgbuild.registry import tags as tagmod
    from imgbuild.ui import print_table

    listing = tagmod.listing(
        settings_of(ctx),
        tagmod.Query(
            repository,
            since=since,
            variant=variant,
            limit=None if show_all else limit,
            details=details,
            compatible=compatible,
            driver=driver,
            arch=arch,
            refresh=refresh,
        ),
    )
    infos = listing.tags
    if as_json:
        emit_json(listing.to_json())
        return
    if details or compatible:
        columns = ["tag", "CUDA", "cuDNN", "framework", "python", "driver", "size", "digest"]
        rows = [
            [
                i.tag,
                i.cuda,
                i.cudnn,
                f"{i.framework} {i.framework_version}".strip(),
                i.python,
                i.driver,
                f"{i.size / 1e9:.1f} GB" if i.size else "",
                i.digest[:19],
            ]
            for i in infos
        ]
        if compatible:
            columns.append("why")
            for row, info in zip(rows, infos, strict=True):
                row.append(info.why)
    else:
        columns = ["tag", "release", "variant"]
        rows = [[i.tag, i.release, i.variant or ""] for i in infos]
    print_table(columns, rows, title=f"{listing.repository}: {len(infos)} of {listing.total} tags")
    for note in listing.notes:
        click.echo(f"note: {note}", err=True)


@SECTION.command()
@click.argument("repository", default="pytorch")
@click.option("--to", "to", required=True, metavar="REGISTRY", help="The site registry to copy into (host[:port]).")
@_SINCE
@_VARIANT
@click.option("--tag", "only", multiple=True, metavar="TAG", help="Only this tag (repeat for more).")
@click.option("--keep", type=click.IntRange(min=1), help="Prune mirrored tags of this selection beyond the newest N.")
@click.option("--dry-run", is_flag=True, help="Say what would be copied or pruned; copy nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@click.pass_context
def mirror(
    ctx: click.Context,
    repository: str,
    to: str,
    since: str | None,
    variant: str,
    only: tuple[str, ...],
    keep: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Copy NGC tags (pytorch, tensorflow or ORG/REPO) into a site registry, digests preserved."""
    from imgbuild.registry.mirror import MirrorRequest
    from imgbuild.registry.mirror import mirror as copy_tags
    from imgbuild.ui import Progress, print_table

    request = MirrorRequest(repository, to, since=since, variant=variant, keep=keep, dry_run=dry_run, tags=only)
    with Progress(f"imgbuild mirror {repository} --to {to}", enabled=not as_json) as progress:
        results = copy_tags(settings_of(ctx), request, progress)
    if as_json:
        emit_json([r.to_json() for r in results])
        return
    print_table(
        ["tag", "status", "digest", "blobs copied", "present", "mounted", "MiB copied"],
        [
            [r.tag, r.status, r.digest[:19], r.blobs_copied, r.blobs_present, r.blobs_mounted, r.bytes_copied >> 20]
            for r in results
        ],
        title=f"mirror to {to}",
    )


@SECTION.command()
@click.argument("image")
@click.option(
    "--key",
    "key",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The signer's public key (cosign.pub).",
)
@click.option("--recipe", type=click.Path(dir_okay=False, path_type=Path), help="Also check it was built from this.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable verdicts.")
@click.pass_context
def verify(ctx: click.Context, image: str, key: Path, recipe: Path | None, as_json: bool) -> None:
    """Check a pushed image: its signature by KEY over its digest, its signed SLSA provenance (and, with
    --recipe, that the recipe is the one it was built from), its SBOM (the one the provenance names, naming
    the base's digest). Exit 1 with a line per failure. imgbuild verify REGISTRY/REPO:TAG --key cosign.pub"""
    from imgbuild import imageref
    from imgbuild.errors import RegistryError
    from imgbuild.registry.client import RegistryClient
    from imgbuild.servers.spec import resolve_image
    from imgbuild.supply import attest, verify

    settings = settings_of(ctx)
    public_key = attest.load_verifier(key)
    recipe_content = None
    if recipe is not None:  # the whole content the image was built from: parents, requirements, lock, files
        from imgbuild.pipeline.plan import content_hash
        from imgbuild.recipe import load_recipe

        recipe_content = content_hash(load_recipe(recipe, secrets=settings.secrets()))
    ref = imageref.parse(resolve_image(image, settings)[0])
    client = RegistryClient.for_host(ref.registry, settings)
    digest = ref.digest or client.content_digest(ref.repository, ref.reference)  # hashed, never a header
    if not digest:
        raise RegistryError(f"{ref}: the registry has no such image")
    verdicts = verify.verify(client, ref.repository, ref.name, digest, public_key, recipe_content)
    if as_json:
        emit_json({"image": ref.name, "digest": digest, "verdicts": [v.__dict__ for v in verdicts]})
    else:
        for verdict in verdicts:
            click.echo(verdict.line())
    if not all(v.ok for v in verdicts):
        raise SystemExit(EXIT_FAILED)
