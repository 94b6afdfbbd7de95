# sluice as a container: built in one stage, run from a small non-root one.
#   docker build -t sluice .
#   docker run -p 8080:8080 -p 8081:8081 sluice
# (Not built by the test suite: the development machine has no container
# runtime. The test suite checks what it can: the binary's flags and the
# healthcheck path.)
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sluice-server --bin sluice

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home sluice
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
COPY --from=build /src/examples/sluice.yaml /etc/sluice/sluice.yaml
USER 10001
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=2s CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["sluice", "serve", "--config", "/etc/sluice/sluice.yaml", "--http", "0.0.0.0:8080", "--grpc", "0.0.0.0:8081"]
