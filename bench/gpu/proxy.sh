#!/usr/bin/env bash
# The GPU path counted without a GPU: builds `bench-gpu-proxy` (bench/src/gpu_proxy.rs) and runs
# it on the software Vulkan device (Mesa's lavapipe), which writes bench/results/gpu_proxy.md and
# bench/results/gpu_proxy.json: kernel launches per decoder layer and per decoding step, host
# reads per step and per row, device memory per log-prob and update micro-batch, and whether a
# 4,096-token, 16-head pass materialises its attention scores; with flowrl's kernels (`now`)
# and without them (`before`). Counts, not times. About 10 minutes on 2 cores.
#
#   bash bench/gpu/proxy.sh [OUT_DIR]     (default bench/results)
#
# Needs a Vulkan driver: `apt-get install mesa-vulkan-drivers` (lavapipe runs everywhere).
# The build also compiles the CUDA backend (`cuda` feature) only to share the workspace's
# `--features cuda,vulkan` artifacts; nothing runs on CUDA.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${1:-$root/bench/results}"
if ! ls /usr/share/vulkan/icd.d/*.json > /dev/null 2>&1; then
  echo "no Vulkan driver: apt-get install mesa-vulkan-drivers" >&2
  exit 1
fi
export CUBECL_AUTOTUNE_LEVEL=minimal
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
cargo build --release -q -p flowrl-bench --features vulkan,cuda --bin bench-gpu-proxy
target/release/bench-gpu-proxy "$out"
