# Canopy: every executable in one image. Build with `docker build -t canopy .`; run the stack
# with `docker-compose up` (docker-compose.yml). Secrets never go into the image.

# --- build: every executable, release mode, Swift's standard library linked in statically
ARG SWIFT_VERSION=6.3.1
FROM swift:${SWIFT_VERSION}-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libzmq3-dev libvips-dev libsqlite3-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The manifest first: dependencies resolve once and stay cached while only sources change.
COPY Package.swift ./
RUN swift package resolve
COPY . .
RUN set -eux; \
    for product in canopy-broker canopy canopy-images canopy-care canopy-identify canopy-remind canopy-api; do \
        swift build -c release --static-swift-stdlib --product "$product"; \
    done; \
    mkdir -p /out; \
    bin="$(swift build -c release --show-bin-path)"; \
    cp "$bin"/canopy "$bin"/canopy-broker "$bin"/canopy-images "$bin"/canopy-care "$bin"/canopy-identify "$bin"/canopy-remind "$bin"/canopy-api /out/; \
    cp -R "$bin"/*.resources /out/

# --- runtime: the libraries the executables link (libcurl4 for Foundation's networking, which
# the `health` commands use: it stays a shared library with --static-swift-stdlib), a user of
# their own, nothing else.
# Every path a compose volume mounts (/data, /photos) exists here, owned by that user: an
# engine copies an image path's owner and mode into a new named volume, and makes a root-owned
# directory for a path the image lacks (uploads then failed with Permission denied).
FROM debian:bookworm-slim
ARG SWIFT_VERSION
LABEL org.opencontainers.image.title="Canopy" \
      org.opencontainers.image.description="Plant-care backend: message-bus services (broker, images, care, identify, remind, api) and the canopy CLI" \
      org.opencontainers.image.source="https://github.com/canopy/canopy" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.canopy.swift-version="${SWIFT_VERSION}"
RUN apt-get update \
    && apt-get install -y --no-install-recommends libzmq5 libvips42 libsqlite3-0 libcurl4 ca-certificates tzdata \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin canopy \
    && mkdir -p /data /photos \
    && chown canopy:canopy /data /photos \
    && chmod 0700 /data /photos
COPY --from=build /out/ /usr/local/bin/
USER 10001:10001
WORKDIR /data
ENV CANOPY_DATA_DIR=/data \
    CANOPY_ENDPOINT=tcp://broker:5555
EXPOSE 5555 8080 9400-9405
CMD ["canopy", "--help"]
