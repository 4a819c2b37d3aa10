# flashgate's container image: built in a Rust image, run in Debian's slim one as a user without
# privileges. Build: docker build -t flashgate .
# Run: docker run -p 8080:8080 -p 9091:9091 -v $PWD/gateway.yaml:/etc/flashgate/gateway.yaml:ro \
#        -e FLASHGATE_SIGNING_SECRET=... -e FLASHGATE_ADMIN_TOKEN=... flashgate
# (the configuration's listeners must bind 0.0.0.0 inside the container, and admin.listen on a
# non-loopback address needs admin.token_env; see docs/operating.md, "Container image and systemd unit").

FROM rust:1.95-bookworm AS build
# cmake: Pingora's build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --locked --release --bin flashgate --bin demo-upstream

FROM debian:bookworm-slim
# ca-certificates: TLS to Redis or an identity provider's keys; tini: a small init as PID 1
# (forwards SIGTERM to the gateway, reaps children).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 flashgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin flashgate \
    && mkdir -p /etc/flashgate
COPY --from=build /src/target/release/flashgate /usr/local/bin/flashgate
COPY --from=build /src/target/release/demo-upstream /usr/local/bin/demo-upstream
# The user made above (numeric: a host reading the image resolves no name).
USER 10001:10001
EXPOSE 8080 9091
# SIGTERM drains (server.grace_period_secs); give `docker stop -t` at least that long.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/flashgate"]
CMD ["serve", "--config", "/etc/flashgate/gateway.yaml"]
