# domaind's image: the node daemon (`domaind run`) and the controller (`domaind
# controller`) from one binary.
#
#   docker build -t REGISTRY/domaind:TAG .
#
# The chart runs the image tagged with its appVersion unless image.tag says otherwise
# (README.md, "On a cluster"). CI cannot build this file (no container engine or registry
# on its machines); deploy/image/check-rootfs.sh proves the runtime stage's contents
# instead.

# Both stages on Debian bookworm: the binary asks for the builder's glibc symbol
# versions, which the runtime's glibc must have.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# The dist profile (Cargo.toml): stripped, no debug info, thin LTO. The cache mounts
# (BuildKit's, which buildah and podman also read) keep the crates and the build outputs
# between builds on one machine; the binary is copied out of the cache for the next
# stage.
#
# jemalloc (the binary's allocator) fixes its page size when it is built: Grace (arm64)
# kernels often run 64 KiB pages, on which a build for 4 KiB pages will not start. 64 KiB
# pages work on either kernel.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    if [ "$(uname -m)" = aarch64 ]; then export JEMALLOC_SYS_WITH_LG_PAGE=16; fi; \
    cargo build --locked --profile dist --bin domaind \
    && cp target/dist/domaind /usr/local/bin/domaind

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="domaind" \
      org.opencontainers.image.description="ComputeDomains for NVIDIA multi-node NVLink racks, formed peer to peer" \
      org.opencontainers.image.source="https://github.com/domaind/domaind" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
# The same list check-rootfs.sh builds CI's root filesystem from: what the binary and the
# driver root's IMEX binaries need at run time. The slim base has most of it already;
# naming it keeps it there.
COPY deploy/image/runtime-packages /tmp/runtime-packages
RUN set -eu; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $(sed -e 's/#.*//' /tmp/runtime-packages); \
    rm -rf /var/lib/apt/lists/* /tmp/runtime-packages
COPY --from=build /usr/local/bin/domaind /usr/local/bin/domaind
# The driver root (the chart's node.driverRoot, mounted at /driver-root) supplies
# nvidia-imex and nvidia-imex-ctl through PATH, after the image's own directories.
# NVML is found there by the daemon itself (--driver-root), not through
# LD_LIBRARY_PATH: the driver root's library directories hold its own glibc, which must
# not be loaded beside this image's dynamic loader.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/driver-root/usr/bin:/driver-root/bin
# Non-root unless a pod says otherwise: the controller runs as this user on a read-only
# root filesystem; the node daemon's DaemonSet asks for root (it is privileged).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/domaind"]
