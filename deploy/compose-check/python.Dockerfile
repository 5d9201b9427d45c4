# Python 3.11 from Debian's packages on a local Debian base (`make compose-check` imports one made by debootstrap,
# since no image hub answers there): a venv on PATH gives the `python` and `pip` the main Dockerfile expects.
ARG LOCAL_BASE=pagedserve-local/debian:bookworm
FROM ${LOCAL_BASE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/python
ENV PATH=/opt/python/bin:$PATH
