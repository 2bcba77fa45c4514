#!/usr/bin/env python3
"""Tag listing cost: a repository with 600 tags in the test bed's registry, cold and from cache.

Run after the test bed is up:  s=$(tests/testbed/up) && eval "$s" && .venv/bin/python benchmarks/tags_listing.py
Prints HTTP request counts and wall time per scenario, side by side, in one run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imgbuild.registry.client import RegistryClient  # noqa: E402
from imgbuild.registry.tags import TagCache, add_details, list_tags, select  # noqa: E402
from tests.fake_nvcr import ngc_tag_names, push_many_tags  # noqa: E402

REPO = "imgbuildbench/pytorch600"


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    registry = os.environ.get("IMGBUILD_TESTBED_REGISTRY")
    if not registry:
        sys.exit('bring the test bed up first: s=$(tests/testbed/up) && eval "$s"')
    names = ngc_tag_names(600)
    push_many_tags(registry, REPO, "nvidia/pytorch", "24.05-py3", names)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = TagCache(Path(tmp), ttl=3600)

        client = RegistryClient(registry, insecure=True)
        (tags, _, _), secs = timed(lambda: list_tags(client, REPO, cache, refresh=True))
        rows.append(("list 600 tags, cold", len(tags), client.requests_made, secs))

        client = RegistryClient(registry, insecure=True)
        (tags, age, _), secs = timed(lambda: list_tags(client, REPO, cache))
        rows.append(("list 600 tags, from cache", len(tags), client.requests_made, secs))

        infos = select(tags, since=None, variant="none", limit=20)
        client = RegistryClient(registry, insecure=True)
        _, secs = timed(lambda: add_details(client, REPO, infos, cache))
        rows.append(("--details for 20 tags, cold", len(infos), client.requests_made, secs))

        infos = select(tags, since=None, variant="none", limit=20)
        client = RegistryClient(registry, insecure=True)
        _, secs = timed(lambda: add_details(client, REPO, infos, cache))
        rows.append(("--details for 20 tags, configs cached", len(infos), client.requests_made, secs))

        env = dict(os.environ, IMGBUILD_CACHE_DIR=tmp)
        cli = [sys.executable, "-m", "imgbuild", "tags", REPO, "--json"]
        _, secs = timed(lambda: subprocess.run([*cli, "--refresh"], env=env, check=True, capture_output=True))
        rows.append(("imgbuild tags (CLI), cold", 600, "-", secs))
        _, secs = timed(lambda: subprocess.run(cli, env=env, check=True, capture_output=True))
        rows.append(("imgbuild tags (CLI), from cache", 600, "-", secs))

    print(f"{'scenario':<40} {'tags':>5} {'HTTP requests':>14} {'seconds':>9}")
    for name, count, reqs, secs in rows:
        print(f"{name:<40} {count:>5} {reqs!s:>14} {secs:>9.3f}")
    print("\nregistry: distribution 2.8 on 127.0.0.1 (returns all tags in one response; nvcr.io may paginate)")


if __name__ == "__main__":
    main()
