# syntax=docker/dockerfile:1
# restatus's container image, for any OCI builder:
#   docker build -t registry.example.com/restatus:0.1.0 .      (or podman, buildah, kaniko)
# The release binary links glibc dynamically (rustls with aws-lc-rs, zstd), so the runtime is
# distroless/cc: glibc, libgcc_s, CA certificates, user nonroot (65532), and nothing else (no
# shell, no package manager). Build and runtime are both Debian 12, so the glibc matches.
# scripts/image assembles the same layout without a container runtime and checks it.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# `restatus --version` names the commit: from .git when the context has it, else from this
# (docker build --build-arg RESTATUS_GIT_COMMIT=$(git rev-parse --short HEAD) .).
ARG RESTATUS_GIT_COMMIT=
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin restatus \
    && strip -o /restatus target/release/restatus

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title=restatus \
      org.opencontainers.image.description="Status snapshots of Kubernetes objects to S3, restored after clusterctl move" \
      org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /restatus /usr/local/bin/restatus
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/restatus"]
