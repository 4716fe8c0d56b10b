#!/usr/bin/env bash
# bench/lora_3b.sh [DIR]: a Qwen2.5-VL-3B-sized policy on this machine's CPU with LoRA, writing
# bench/results/lora_3b.md:
#
#   1. `flowrl generate` on the bf16 checkpoint in DIR (default /tmp/flowrl-3b, written by
#      `target/release/bench-load DIR`), greedy, 16 new tokens, precision bf16: load seconds,
#      tokens/s, peak RSS;
#   2. `flowrl run bench/grpo_3b_lora.toml` (2 GRPO steps: rank-16 adapters on the frozen bf16
#      base, reference = the base with adapters off, 2 prompts x n 2, 16 new tokens): per-node
#      seconds of the last step and peak RSS.
#
# Not part of the tests (minutes, ~13 GiB of memory). Build first: cargo build --release.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dir="${1:-/tmp/flowrl-3b}"
out="$(mktemp -d)"
flowrl=target/release/flowrl
[ -f "$dir/model.safetensors.index.json" ] || {
  echo "no checkpoint in $dir: run cargo build --release -p flowrl-bench --bin bench-load && target/release/bench-load $dir" >&2
  exit 1
}
for f in tokenizer.json tokenizer_config.json; do [ -f "$dir/$f" ] || cp "assets/tiny-qwen2-vl/$f" "$dir/"; done
[ -f "$dir/preprocessor_config.json" ] || cp bench/preprocessor_config.json "$dir/"

/usr/bin/time -v "$flowrl" generate --model "$dir" --precision bf16 --device cpu \
  --prompt "How many shapes are there?" --max-new-tokens 16 --temperature 0 --json \
  > "$out/generate.json" 2> "$out/generate.time"
/usr/bin/time -v "$flowrl" run bench/grpo_3b_lora.toml --set "models.policy.path=\"$dir\"" \
  --out "$out/run" --force > "$out/run.log" 2> "$out/run.time"

python3 - "$out" "$dir" > bench/results/lora_3b.md << 'PY'
import json, os, re, subprocess, sys, datetime
out, ckpt = sys.argv[1], sys.argv[2]
def peak(path):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(path).read())
    return int(m.group(1)) / 2**20
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
gen = json.load(open(f"{out}/generate.json"))
rows = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl")]
last = rows[-1]
size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.endswith(".safetensors")) / 2**30
print("# A Qwen2.5-VL-3B-sized policy on the CPU: generate and one LoRA GRPO step (`bench/lora_3b.sh`)\n")
print(f"{datetime.date.today()}, {os.cpu_count()} cores ({cpu}), CPU backend (Flex), mimalloc. Checkpoint: "
      f"`bench-load`'s random bf16 weights of `bench/gpu/qwen2_5_vl_3b/config.json` (3,754,622,976 parameters), "
      f"{size:.2f} GiB of safetensors; held in bf16 (precision = \"bf16\": Flex multiplies bf16 by converting "
      f"to f32 per matmul). Random weights answer nothing right, so scores and advantages are 0: the "
      f"timings are those of the work, not of learning.\n")
print("| what | seconds | peak RSS (GiB) | notes |\n|---|---:|---:|---|")
print(f"| `flowrl generate`, greedy, {gen['response_length']} new tokens ({gen['prompt_length']}-token prompt) | "
      f"{gen['seconds']:.1f} (+ {gen['load_seconds']:.1f} load) | {peak(out + '/generate.time'):.2f} | "
      f"{gen['tokens_per_second']:.2f} tokens/s |")
t = lambda k: last.get(f"timing_s/{k}", float("nan"))
print(f"| LoRA GRPO step (step {last['step']} of 2): rollout 2 prompts x n 2, 16 new tokens | {t('gen'):.1f} | | |")
print(f"| old log-probs (policy with adapters; beside the reference) | {t('old_log_prob'):.1f} | | |")
print(f"| reference log-probs (same weights, adapters off; beside the old) | {t('ref'):.1f} | | |")
print(f"| PPO update (adapters only: f32 grads + AdamW) | {t('update_actor'):.1f} | | "
      f"kl_loss {last.get('actor/kl_loss', float('nan')):.2g} (bf16 noise between the update's and the log-prob node's batch shapes; 0.0 in f32) |")
print(f"| whole step | {t('step'):.1f} | {peak(out + '/run.time'):.2f} | rank 16, alpha 32, all-linear; one process for both steps |")
print(f"\nRun: `bash bench/lora_3b.sh [DIR]` (after `target/release/bench-load DIR`).")
PY
cat bench/results/lora_3b.md
