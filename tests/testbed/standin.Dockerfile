# The framework layer of a stand-in NGC image: a debootstrapped Debian 12 and a real build of the
# framework. Each release's env, labels, entrypoint, version shapes and constraint file go on top of it
# (tests/testbed/release.py, from the facts in tests/ngc_facts.py), so imgbuild sees what it would see on nvcr.io.
# The CPU stand-ins have no CUDA; the CUDA one (pytorch-cuda) has the real CUDA user space from the index,
# and no GPU: GPU checks in either report "skip: no GPU visible".
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
ARG FRAMEWORK
ARG PACKAGES
# NGC images install into the system Python; the 24.04-based ones set PIP_BREAK_SYSTEM_PACKAGES=1 (the
# release layer does); whether they keep the PEP 668 marker is not recorded, and this one has none.
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && python3 -m pip install --no-index --no-cache-dir --no-compile --find-links /tmp/wheels ${PACKAGES} \
 && mkdir -p /etc/pip /workspace \
 && ln -sf /usr/bin/python3 /usr/local/bin/python \
 && rm -rf /root/.cache /var/lib/apt/lists/*
