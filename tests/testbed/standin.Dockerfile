# A stand-in for an NVIDIA NGC framework image, built from a debootstrapped Debian 12 and a real
# CPU build of the framework. It carries the env and labels real NGC images carry, so imgbuild sees
# what it would see on nvcr.io. The CPU stand-ins have no CUDA; the CUDA one (pytorch-cuda) has the
# real CUDA user space from the index, and no GPU: GPU checks in either report "skip: no GPU visible".
ARG ROOTFS_IMAGE
FROM ${ROOTFS_IMAGE}
ARG FRAMEWORK
ARG PACKAGES
# NGC images install into the system Python and carry no PEP 668 marker; neither does this one.
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && python3 -m pip install --no-index --no-cache-dir --no-compile --find-links /tmp/wheels ${PACKAGES} \
 && mkdir -p /etc/pip /workspace \
 && python3 -m pip list --format=freeze --exclude pip > /etc/pip/constraint.txt \
 && ln -sf /usr/bin/python3 /usr/local/bin/python \
 && rm -rf /root/.cache /var/lib/apt/lists/*
