"""Facts imgbuild writes and reads in more than one place, each written once here.

The NGC tag grammar and framework table live in `ngc.py`, image references in `imageref.py`, every
bound on input in `limits.py`; this module holds the label keys imgbuild puts on images and containers.
"""

from __future__ import annotations


class Label:
    """`org.imgbuild.*` label keys. Recipes may not set keys under PREFIX."""

    PREFIX = "org.imgbuild."
    # on images
    VERSION = PREFIX + "version"
    RECIPE = PREFIX + "recipe"
    RECIPE_HASH = PREFIX + "recipe-hash"
    INPUT_HASH = PREFIX + "input-hash"
    BASE = PREFIX + "base"
    BASE_DIGEST = PREFIX + "base-digest"
    BASE_FRAMEWORK = PREFIX + "base-framework"
    BASE_FRAMEWORK_VERSION = PREFIX + "base-framework-version"
    # on containers
    USER = PREFIX + "user"  # who started it (the caller, sudo-aware)
    GPUS = PREFIX + "gpus"  # the GPU indices it was given
    SMOKE_OF = PREFIX + "smoke-of"  # a smoke-test container, and the image it tests
