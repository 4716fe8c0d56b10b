#!/usr/bin/env bash
# Packs the four binaries bench/gpu/check.sh runs into bench/gpu/bin.tar.gz (stripped, gzip), the
# one file to carry to the GPU machine; check.sh unpacks it into bench/gpu/bin/. Also writes
# bench/gpu/bin/BUILD_INFO (commit, uncommitted files, date, rustc, CUDARC_CUDA_VERSION), which
# check.sh copies into its table, and adds cubecl's kernel and autotune cache (bench/gpu/cache,
# restored from an earlier run's $OUT/cubecl-cache.tar.gz) when there is one with CUDA entries:
# its compiled kernels only if they were compiled by these very binaries (bench/gpu/cache/BUILD),
# its CUDA autotune results always.
#
#   bash bench/gpu/pack.sh            pack what target/release holds
#   bash bench/gpu/pack.sh --build    build first (CUDARC_CUDA_VERSION=13000 unless set):
#       cargo build --release --features cuda --bin flowrl
#       cargo build --release -p flowrl-bench --bin bench-make-model
#       cargo build --release -p flowrl-bench --features cuda,vulkan --bin bench-gpu-micro
#       cargo test --release -p flowrl-models --features cuda-tests --test cuda --no-run
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}

if [ "${1:-}" = --build ]; then
  cargo build --release --features cuda --bin flowrl
  cargo build --release -p flowrl-bench --bin bench-make-model
  # (vulkan too: the same binary then runs here as a dry run, `--device vulkan`)
  cargo build --release -p flowrl-bench --features cuda,vulkan --bin bench-gpu-micro
  cargo test --release -p flowrl-models --features cuda-tests --test cuda --no-run
fi

test_bin=$(ls -t target/release/deps/cuda-* 2> /dev/null | while read -r f; do
  case "$f" in *.d|*.rlib|*.rmeta|*.o) continue ;; esac
  [ -f "$f" ] && [ -x "$f" ] && { echo "$f"; break; }
done || true)
missing=0
for f in target/release/flowrl target/release/bench-make-model target/release/bench-gpu-micro "$test_bin"; do
  if [ -z "$f" ] || [ ! -x "$f" ]; then
    echo "missing: ${f:-target/release/deps/cuda-<hash> (the test executable of models/tests/cuda.rs)}" >&2
    missing=1
  fi
done
[ "$missing" = 0 ] || { echo "build them first: bash bench/gpu/pack.sh --build" >&2; exit 1; }

if target/release/flowrl validate graphs/grpo_vlm.toml --device cuda 2>&1 | grep -q "built without CUDA"; then
  echo "warning: target/release/flowrl is built without CUDA (cargo build --release --features cuda --bin flowrl)" >&2
fi
if ! target/release/bench-gpu-micro --help 2>&1 | grep -q "built with: cuda"; then
  echo "warning: target/release/bench-gpu-micro is built without CUDA (--features cuda,vulkan)" >&2
fi
if [ "$("$test_bin" --list 2> /dev/null | grep -c ': test$' || true)" = 0 ]; then
  echo "warning: $test_bin lists no tests: built without --features cuda-tests?" >&2
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/bin"
copy() { # SRC NAME: stripped when strip exists
  if ! command -v strip > /dev/null 2>&1 || ! strip -o "$stage/bin/$2" "$1" 2> /dev/null; then
    cp "$1" "$stage/bin/$2"
  fi
}
copy target/release/flowrl flowrl
copy target/release/bench-make-model bench-make-model
copy target/release/bench-gpu-micro bench-gpu-micro
copy "$test_bin" cuda-test
{
  echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo '?') with $(git status --short 2> /dev/null | wc -l) uncommitted files"
  echo "packed $(date -u '+%Y-%m-%d %H:%M UTC'); $(rustc --version 2> /dev/null || echo 'rustc ?'); CUDARC_CUDA_VERSION=$CUDARC_CUDA_VERSION"
  echo "test executable: $test_bin ($("$test_bin" --list 2> /dev/null | grep -c ': test$' || true) tests)"
} > "$stage/bin/BUILD_INFO"

# The cache: check.sh's stamp is the sha256 of its flowrl, cuda-test and bench-gpu-micro (in that
# order), i.e. of these stripped copies once unpacked.
parts=(bin)
cache=bench/gpu/cache
if [ -d "$cache" ]; then
  stamp=$(for b in flowrl cuda-test bench-gpu-micro; do sha256sum "$stage/bin/$b"; done | awk '{print $1}' | sha256sum | cut -c1-16)
  mkdir -p "$stage/cache"
  found=0
  for d in "$cache"/autotune/*/device-*cuda*; do
    [ -d "$d" ] || continue
    rel=${d#"$cache"/}
    mkdir -p "$stage/cache/$(dirname "$rel")"
    cp -r "$d" "$stage/cache/$rel"
    found=1
  done
  if [ -d "$cache/cuda" ] && [ "$(cat "$cache/BUILD" 2> /dev/null)" = "$stamp" ]; then
    cp -r "$cache/cuda" "$stage/cache/cuda"
    cp "$cache/BUILD" "$stage/cache/BUILD"
    echo "cache: CUDA autotune results and the compiled kernels (same binaries, stamp $stamp)"
    found=1
  elif [ -d "$cache/cuda" ]; then
    echo "cache: CUDA autotune results only; the compiled kernels are from other binaries (stamp $(cat "$cache/BUILD" 2> /dev/null || echo none), these $stamp)"
  fi
  if [ "$found" = 1 ]; then
    parts+=(cache)
    echo "cache: $(find "$stage/cache" -type f | wc -l) files, $(du -sh "$stage/cache" | cut -f1)"
  else
    echo "cache: $cache holds no CUDA entries (only what a Vulkan run left): not packed"
  fi
fi
tar czf bench/gpu/bin.tar.gz -C "$stage" "${parts[@]}"
cat "$stage/bin/BUILD_INFO"
ls -l "$stage/bin"
size=$(stat -c %s bench/gpu/bin.tar.gz)
echo "wrote bench/gpu/bin.tar.gz: $((size / 1048576)) MiB (carry it: the carried paths may hold 64 MiB in all)"
[ "$size" -le $((60 * 1048576)) ] || echo "warning: over 60 MiB" >&2
