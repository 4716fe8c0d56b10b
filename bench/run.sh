#!/usr/bin/env bash
# One command for the whole side-by-side benchmark: flowrl vs transformers (rows 1-3) and TRL's
# GRPOTrainer (row 4), peak RSS of each (row 5), and a flowrl scaling table; writes
# bench/results/results.md and results.json. Not part of the test suite or CI.
#
#   bash bench/run.sh
#
# Sizes (defaults = issue 10's full comparison) can be lowered with environment variables:
#   BENCH_PROMPTS=8 BENCH_N=8 BENCH_NEW=128 BENCH_MICRO=32 BENCH_REPS=3 BENCH_THREADS=$(nproc)
#   BENCH_SCALE_PROMPTS="2 4 8" BENCH_SCALE_NEW="32 64 128" (flowrl step time vs batch / length;
#   set either to "" to skip), BENCH_SKIP_SETUP=1 (venv already installed).
# Every measurement runs REPS + 1 times; the first is a warm-up and the medians are over the rest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
P=${BENCH_PROMPTS:-8}
N=${BENCH_N:-8}
NEW=${BENCH_NEW:-128}
MICRO=${BENCH_MICRO:-32}
REPS=${BENCH_REPS:-3}
THREADS=${BENCH_THREADS:-$(nproc)}
SCALE_P=${BENCH_SCALE_PROMPTS-"2 4 8"}
SCALE_NEW=${BENCH_SCALE_NEW-"32 64 128"}
work="$root/bench/work"
venv="$root/bench/.venv"
mkdir -p "$work" "$root/bench/results"

[ -n "${BENCH_SKIP_SETUP:-}" ] || bash bench/setup_venv.sh
cargo build --release -q -p flowrl-bench --bin bench-make-model
cargo build --release -q --bin flowrl

# The random model is written once (flowrl's saver); both sides load this directory.
if [ ! -f "$work/model/model.safetensors" ]; then
  target/release/bench-make-model bench/model_config.json "$work/model" 0
fi
max_p=$P
for p in $SCALE_P; do [ "$p" -gt "$max_p" ] && max_p=$p; done
"$venv/bin/python" bench/python/make_prompts.py datasets/shapes/train.parquet "$work/prompts.parquet" "$max_p" 224

export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
cat /proc/loadavg > "$work/loadavg_before"

# flowrl: one GRPO step per run step; rows 1-3 are its rollout / old log-prob / update nodes.
flowrl_run() { # out prompts new steps
  local out=$1 p=$2 new=$3 steps=$4 rows=$(($2 * N)) m=$MICRO old_micro=()
  [ "$m" -gt "$rows" ] && m=$rows
  # The `old` node is optional (see grpo_bench.toml): size it only where the graph has it.
  grep -q '^\[nodes\.old\]' bench/grpo_bench.toml && old_micro=(--set nodes.old.micro_batch_size="$m")
  /usr/bin/time -f "%M %e" -o "$out.time" target/release/flowrl run bench/grpo_bench.toml \
    --out "$out" --force --steps "$steps" \
    --set nodes.data.batch_size="$p" --set nodes.rollout.n="$N" \
    --set nodes.rollout.max_new_tokens="$new" "${old_micro[@]}" \
    --set nodes.update.mini_batch_size="$p" --set nodes.update.micro_batch_size="$m" \
    > "$out.log" 2>&1
}
echo "== flowrl: $P prompts x n=$N, $NEW new tokens, $((REPS + 1)) steps"
flowrl_run "$work/flowrl" "$P" "$NEW" $((REPS + 1))

cd bench/python
echo "== transformers + torch: rows 1-3"
# Row (3)'s reference recomputes the layers in its backward when flowrl's update does.
ref_ckpt=()
grep -q "^gradient_checkpointing = true" "$root/bench/grpo_bench.toml" && ref_ckpt=(--gradient-checkpointing)
/usr/bin/time -f "%M %e" -o "$work/ref.time" "$venv/bin/python" ref_rows.py "$work/model" \
  "$work/prompts.parquet" "$work/ref.json" --prompts "$P" --n "$N" --new "$NEW" \
  --micro "$MICRO" --reps $((REPS + 1)) --threads "$THREADS" "${ref_ckpt[@]}" > "$work/ref.log" 2>&1
echo "== TRL GRPOTrainer: $((REPS + 1)) steps"
/usr/bin/time -f "%M %e" -o "$work/trl.time" "$venv/bin/python" trl_step.py "$work/model" \
  "$work/prompts.parquet" "$work/trl.json" --prompts "$P" --n "$N" --new "$NEW" \
  --micro "$MICRO" --steps $((REPS + 1)) --threads "$THREADS" --workdir "$work/trl" > "$work/trl.log" 2>&1
cd "$root"

rm -rf "$work"/scale_*
for p in $SCALE_P; do
  echo "== scaling: $p prompts"
  flowrl_run "$work/scale_p$p" "$p" "$NEW" 2
done
for t in $SCALE_NEW; do
  echo "== scaling: $t new tokens"
  flowrl_run "$work/scale_t$t" "$P" "$t" 2
done
cat /proc/loadavg > "$work/loadavg_after"

"$venv/bin/python" bench/python/report.py "$work" bench/results \
  --prompts "$P" --n "$N" --new "$NEW" --micro "$MICRO" --reps "$REPS" --threads "$THREADS"
