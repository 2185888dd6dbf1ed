#!/usr/bin/env bash
# A Triton newer than the GPU machine's, small enough to carry to it beside the working tree.
#
#   bash bench/triton_overlay.sh [VERSION]        # writes .triton-overlay/ (ignored by git)
#
# The wheel's libtriton.so (about 480 MB, with debug info) is stripped and xz-compressed (about
# 38 MB for 3.9.0); the rest of the package goes in a tarball without the AMD libraries, CUPTI and
# the bundled ptxas (the machine's own Triton has one). On the GPU machine, carry .triton-overlay
# and unpack it in front of the installed Triton:
#
#   T=$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))")
#   mkdir -p /tmp/tov && tar -xJf .triton-overlay/rest.tar.xz -C /tmp/tov
#   xz -T4 -dc .triton-overlay/libtriton.so.xz > /tmp/tov/triton/_C/libtriton.so
#   export PYTHONPATH=/tmp/tov:$PWD TRITON_PTXAS_BLACKWELL_PATH=$T/backends/nvidia/bin/ptxas-blackwell
#
# (Triton 3.9 compiles for sm_90 with the tool it calls ptxas-blackwell.) bench/multicast_probe.py
# ran this way.
set -euo pipefail
version="${1:-3.9.0}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.triton-overlay"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m pip download -q "triton==$version" --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_27_x86_64 -d "$work"
unzip -q "$work"/triton-*.whl -d "$work/pkg"
pkg="$work/pkg/triton"
strip --strip-unneeded "$pkg/_C/libtriton.so"
mkdir -p "$out"
xz -T0 -9 -c "$pkg/_C/libtriton.so" > "$out/libtriton.so.xz"
rm -f "$pkg/_C/libtriton.so" "$pkg/_C/libproton.so"
rm -rf "$pkg/backends/nvidia/lib/cupti" "$pkg/backends/nvidia/lib/cupti-blackwell" \
    "$pkg/backends/nvidia/bin/ptxas" "$pkg/backends/nvidia/bin/ptxas-blackwell" "$pkg/backends/nvidia/bin/nvdisasm" \
    "$pkg/FileCheck" "$pkg/instrumentation" "$pkg/plugins"
# the AMD backend's Python stays (backends are discovered by entry point), its libraries go
find "$pkg/backends/amd" -name '*.so' -size +1M -delete
tar -C "$work/pkg" -cJf "$out/rest.tar.xz" triton
du -sh "$out"/*
