# Stand-in for prom/prometheus (Docker Hub only) in `make compose-check`: Debian's prometheus on the local base.
# Debian's build keeps its data in /var/lib/prometheus/metrics2, which the user running it must own.
ARG LOCAL_BASE=pagedserve-local/debian:bookworm
FROM ${LOCAL_BASE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && chown -R 65534:65534 /var/lib/prometheus
USER 65534:65534
WORKDIR /var/lib/prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
