#!/bin/sh
# Installs the pinned Python CUDA clients the interception tests run against real
# loaders (tests/clients.rs): a venv at $DEST/venv, and one directory per client
# version (pip --target, so that several versions coexist) for PYTHONPATH:
#   $DEST/cuda-bindings-<v>   cuda-bindings 12.9.4, 13.0.3, 13.5.0
#   $DEST/nvidia-ml-py-<v>    nvidia-ml-py 12.575.51, 13.615.71
# and the release-artifact toolchain (tests/release_artifact.rs): ziglang 0.17.0 in
# the venv and cargo-zigbuild 0.24.1 in $DEST/tools/bin.
# DEST defaults to target/tessera-cuda-py; the tests read TESSERA_CUDA_TEST_PY, and
# need $DEST/venv/bin and $DEST/tools/bin on PATH. The last line printed is the
# `export` to eval.
# Usage: cuda/ci-setup.sh [DEST]
set -eu
DEST=${1:-${TESSERA_CUDA_TEST_PY:-target/tessera-cuda-py}}
mkdir -p "$DEST"
# DEST may be kept between CI runs: the venv and the clients' compiled extensions are
# the Python's that made them, so another Python starts them over.
pyver=$(${PYTHON:-python3} -c 'import sys; print(sys.version)')
if [ "$(cat "$DEST/python-version" 2>/dev/null)" != "$pyver" ]; then
    rm -rf "$DEST/venv" "$DEST"/cuda-bindings-* "$DEST"/nvidia-ml-py-*
    printf '%s\n' "$pyver" >"$DEST/python-version"
fi
[ -x "$DEST/venv/bin/python" ] || ${PYTHON:-python3} -m venv "$DEST/venv"
PY="$DEST/venv/bin/python"
for v in 12.9.4 13.0.3 13.5.0; do
    [ -d "$DEST/cuda-bindings-$v/cuda" ] ||
        "$PY" -m pip install --quiet --no-compile --target "$DEST/cuda-bindings-$v" "cuda-bindings==$v"
done
for v in 12.575.51 13.615.71; do
    [ -f "$DEST/nvidia-ml-py-$v/pynvml.py" ] ||
        "$PY" -m pip install --quiet --no-compile --target "$DEST/nvidia-ml-py-$v" "nvidia-ml-py==$v"
done
"$PY" -m pip install --quiet ziglang==0.17.0
# In the debug profile: it drives one build, and its release build costs CI a minute.
# The version is checked, not just the file (DEST may be kept between CI runs).
"$DEST/tools/bin/cargo-zigbuild" --version 2>/dev/null | grep -qx 'cargo-zigbuild 0.24.1' ||
    CARGO_PROFILE_DEV_DEBUG=0 cargo install --quiet --locked --debug --force cargo-zigbuild@0.24.1 --root "$DEST/tools"
ABS=$(cd "$DEST" && pwd)
echo "export TESSERA_CUDA_TEST_PY=$ABS PATH=$ABS/venv/bin:$ABS/tools/bin:\$PATH"
