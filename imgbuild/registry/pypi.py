"""Whether a package index has a project, asked before a cure that names one is printed: the CUDA 13 build of
faiss-gpu-cu12 would be faiss-gpu-cu13, which is not on PyPI. The project's PEP 503/691 page, its status only,
within a deadline; None when the index cannot say (offline, a server error, an index that wants credentials)."""

from __future__ import annotations

import re

import requests

from imgbuild.registry.transport import TRANSPORT_ERRORS, shutdown

PYPI = "https://pypi.org/simple"


def has_project(index_url: str, name: str, timeout: float = 5.0, verify: bool | str = True) -> bool | None:
    url = f"{index_url.rstrip('/')}/{re.sub(r'[-_.]+', '-', name).lower()}/"
    try:
        resp = requests.get(
            url,
            headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"},
            timeout=timeout,
            stream=True,  # the status is the answer: the page is never read
            verify=verify,
        )
    except (requests.RequestException, OSError, ValueError, *TRANSPORT_ERRORS):  # type: ignore[misc]
        return None
    try:
        return True if resp.status_code == 200 else False if resp.status_code == 404 else None
    finally:
        shutdown(resp)
        resp.close()
