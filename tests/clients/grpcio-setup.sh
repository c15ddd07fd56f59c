#!/bin/sh
# Installs the pinned Python gRPC client the `grpcio_*` tests of tests/plugin/grpc_authority.rs
# run against the plugin's sockets: a venv at $DEST/venv with grpcio (gRPC C-core)
# and nothing else (the test hand-encodes its protobuf messages, so no grpcio-tools).
# Idempotent: a venv that already has the pinned version is kept. The last line
# printed names the interpreter and the version, for the test to read:
#   python=<absolute path> grpcio=<version>
# Usage: tests/clients/grpcio-setup.sh [DEST]   (default target/tessera-grpcio-py)
set -eu
GRPCIO_VERSION=1.85.1
DEST=${1:-target/tessera-grpcio-py}
mkdir -p "$DEST"
[ -x "$DEST/venv/bin/python" ] || ${PYTHON:-python3} -m venv "$DEST/venv"
PY="$DEST/venv/bin/python"
"$PY" -c "import grpc, sys; sys.exit(grpc.__version__ != '$GRPCIO_VERSION')" 2>/dev/null ||
    "$PY" -m pip install --quiet --disable-pip-version-check "grpcio==$GRPCIO_VERSION"
ABS=$(cd "$DEST" && pwd)
echo "python=$ABS/venv/bin/python grpcio=$GRPCIO_VERSION"
