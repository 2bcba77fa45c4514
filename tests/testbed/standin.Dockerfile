# The framework layer of a stand-in NGC image: a Debian 12 root filesystem and a real build of the
# framework. Each release's env, labels, entrypoint, version shapes and constraint file go on top of it
# (tests/testbed/release.py, from the facts in tests/ngc_facts.py), so imgbuild sees what it would see on nvcr.io.
# The CPU stand-ins have no CUDA; the CUDA one (pytorch-cuda) has the real CUDA user space from the index,
# and no GPU: GPU checks in either report "skip: no GPU visible".
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE} AS installed
ARG PACKAGES
# The install, with its largest folders (torch/lib; the CUDA wheels' nvidia/) set apart: each becomes a layer of
# its own below, as NGC's images are many layers. A push compresses each layer on one core: one 800 MB layer took
# 44 s on two cores, one of them idle.
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && python3 -m pip install --no-index --no-cache-dir --no-compile --find-links /tmp/wheels ${PACKAGES} \
 && site=/usr/local/lib/python3.11/dist-packages && mkdir -p /apart/lib /apart/cuda \
 && if [ -d "$site/torch/lib" ]; then mkdir /apart/lib/torch && mv "$site/torch/lib" /apart/lib/torch/; fi \
 && if [ -d "$site/nvidia" ]; then mv "$site/nvidia" /apart/cuda/; fi

FROM ${ROOTFS_IMAGE}
COPY --from=installed /usr/local/ /usr/local/
COPY --from=installed /apart/lib/ /usr/local/lib/python3.11/dist-packages/
COPY --from=installed /apart/cuda/ /usr/local/lib/python3.11/dist-packages/
# NGC images install into the system Python; the 24.04-based ones set PIP_BREAK_SYSTEM_PACKAGES=1 (the
# release layer does); whether they keep the PEP 668 marker is not recorded, and this one has none.
RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && mkdir -p /etc/pip /workspace \
 && ln -sf /usr/bin/python3 /usr/local/bin/python \
 && rm -rf /root/.cache /var/lib/apt/lists/*
