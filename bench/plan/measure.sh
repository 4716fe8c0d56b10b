#!/usr/bin/env bash
# Predicted vs measured memory: for each row below, `flowrl plan --json` (the prediction, made
# before anything loads) and the run itself under /usr/bin/time (maximum resident set size).
# Writes bench/results/plan.table.md and bench/results/plan.json (or into $OUT).
#
#   bash bench/plan/measure.sh    # the bench shape needs bench/work: bench/run.sh makes it
#
# Shipped graphs run 2 steps (past a critic warm-up) with their eval node every step; the bench shape (bench/grpo_bench.toml:
# hidden 512, 8 layers, vocabulary 32k, 8 prompts × n 8 × 128 new tokens) runs 3 steps per variant
# (the AdamW moments exist from the first update on: the second step reaches the steady peak).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FLOWRL:-target/release/flowrl}
out=${OUT:-bench/results}
work=$(mktemp -d)

shipped() { # name graph
  local sets=() steps=2 warmup
  grep -q '^\[nodes.eval\]' "$2" && sets=(--set nodes.eval.every=1)
  # A critic warm-up skips the actor's update for its first steps: run past it.
  warmup=$(sed -n 's/^critic_warmup = \([0-9]*\)/\1/p' "$2")
  [ -n "$warmup" ] && [ "$warmup" -ge "$steps" ] && steps=$((warmup + 1))
  row "$1" "$2" "$steps" "${sets[@]}"
}

row() { # name graph steps sets...
  local name=$1 graph=$2 steps=$3; shift 3
  "$bin" plan "$graph" --json "$@" > "$work/$name.plan.json"
  /usr/bin/time -f "%M" -o "$work/$name.time" "$bin" run "$graph" --steps "$steps" --out "$work/run_$name" \
    --force --progress quiet "$@" > "$work/$name.log" 2>&1 || { echo "$name failed:"; tail "$work/$name.log"; exit 1; }
  python3 - "$name" "$work" "$*" >> "$work/rows.jsonl" <<'PY'
import json, sys
name, work, sets = sys.argv[1:]
plan = json.load(open(f"{work}/{name}.plan.json"))
predicted = plan["process_peak_bytes"]
measured = int(open(f"{work}/{name}.time").read().split()[-1]) * 1024
print(json.dumps({"row": name, "sets": sets, "what": "process peak RSS", "predicted_bytes": predicted,
                  "measured_bytes": measured, "error": predicted / measured - 1,
                  "peak_at": plan["process"]["peak_at"]}))
PY
  tail -1 "$work/rows.jsonl"
}

for g in grpo_vlm grpo_vlm_lora ppo_vlm dapo_vlm grpo_gemma4 grpo_qwen3_vl sft_vlm sft_gemma4 sft_qwen3_vl; do
  shipped "$g" "graphs/$g.toml"
done
b=bench/grpo_bench.toml
row bench $b 3
row bench_batch4 $b 3 --set nodes.data.batch_size=4 --set nodes.update.mini_batch_size=4
row bench_n4 $b 3 --set nodes.rollout.n=4
row bench_new64 $b 3 --set nodes.rollout.max_new_tokens=64
row bench_micro16 $b 3 --set nodes.update.micro_batch_size=16 --set nodes.old.micro_batch_size=16
row bench_no_ckpt $b 3 --set nodes.update.gradient_checkpointing=false
row bench_lora $b 3 --set 'models.policy.lora={rank=16}'
row bench_bf16 $b 3 --set models.policy.precision=bf16

python3 - "$work/rows.jsonl" "$out" <<'PY'
import json, sys, datetime
path, out = sys.argv[1:]
data = [json.loads(l) for l in open(path)]
name = "plan"
json.dump(data, open(f"{out}/{name}.json", "w"), indent=1)
mib = lambda b: f"{b / 2**20:.0f} MiB"
lines = [f"| row | overrides | predicted | measured | error | peak at (plan) |", "|---|---|---:|---:|---:|---|"]
for d in data:
    at = " + ".join(f"{p['node']}/{p['phase']}" for p in d["peak_at"])
    lines.append(f"| {d['row']} | {d['sets'] or '—'} | {mib(d['predicted_bytes'])} | {mib(d['measured_bytes'])} | {d['error']*100:+.1f} % | {at} |")
worst = max(abs(d["error"]) for d in data)
text = "\n".join(lines)
open(f"{out}/{name}.table.md", "w").write(text + f"\n\nLargest error: {worst*100:.1f} % ({datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; {data[0]['what']}).\n")
print(text)
print(f"largest error {worst*100:.1f} %")
PY
