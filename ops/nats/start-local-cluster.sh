#!/usr/bin/env bash
# Start a local 3-server NATS JetStream cluster on loopback ports, stores under ${1:-./nats-cluster}.
# Prints the URL list for `rota up --nats URL,URL,URL`; Ctrl-C stops the three servers.
set -euo pipefail
exec python -m rota.controller.natscluster "${1:-./nats-cluster}" --servers 3
