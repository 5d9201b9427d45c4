# Stand-in for redis:7.4.1-alpine (Docker Hub only) in `make compose-check`: Debian's redis-server on the local base.
ARG LOCAL_BASE=pagedserve-local/debian:bookworm
FROM ${LOCAL_BASE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/*
USER 999:1000
EXPOSE 6379
CMD ["redis-server", "--save", "", "--appendonly", "no", "--protected-mode", "no"]
