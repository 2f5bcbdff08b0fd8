#!/usr/bin/env bash
# make demo: the software device, the daemon and a demo application.
set -euo pipefail
echo "perfq demo: the software device (perfq-devsim) has not landed yet;" >&2
echo "  run 'make test' and 'make bench' to exercise the rings and region." >&2
exit 2
