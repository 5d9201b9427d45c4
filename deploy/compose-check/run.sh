#!/usr/bin/env bash
# make compose-check / make test: install Debian's docker.io and debootstrap where missing (root), then run the check.
# Exit 3: it cannot run here (not root and the tools are missing, or no Docker daemon could be started); make test
# says so loudly and goes on. Any other non-zero exit is a failed check.
set -u
py="$1"
if ! { command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null \
      || { echo "compose-check: installing docker.io/debootstrap failed" >&2; exit 1; }
  else
    echo "compose-check: docker.io/debootstrap missing and not root: NOT RUN" >&2
    exit 3
  fi
fi
exec "$py" "$(dirname "$0")/compose_check.py"
