#!/usr/bin/env bash
# The plans of verl's geo3k recipe (graphs/real/geo3k_qwen2_5_vl_3b.toml) with the 3B and 7B
# configs of bench/gpu/ (shape only) on one and eight H100 / H200, as the markdown table of
# docs/plan.md ("The real recipes on GPUs"). Usage: bash bench/plan/real_recipes.sh [FLOWRL]
set -euo pipefail
cd "$(dirname "$0")/../.."
flowrl=${1:-target/release/flowrl}
graph=$(mktemp --suffix .toml)
trap 'rm -f "$graph"' EXIT
grep -v '^device' graphs/real/geo3k_qwen2_5_vl_3b.toml >"$graph"
# One row of the table from a plan's JSON on stdin.
row=$(cat <<'PY'
import json, sys
j = json.load(sys.stdin)
model, label, n, gpu = sys.argv[1:5]
gb = lambda b: "%.0f GB" % (b / 1e9)
d0 = j["devices"]["cuda:0"]
at = " + ".join(p["node"] + "/" + p["phase"] for p in d0["peak_at"])
rest = [v["peak_bytes"] for d, v in j["devices"].items() if d != "cuda:0"]
others = gb(max(rest)) if rest else "—"
fits = "yes" if all(v["fits"] for v in j["devices"].values()) else "**no**"
print("| %s | %s | %s × %s | %s (%s) | %s | %s | %s | %.0f s |" % (
    model.upper(), label, n, gpu.upper(), gb(d0["peak_bytes"]), at, others,
    gb(j["host"]["peak_bytes"]), fits, j["step_seconds_estimate"]))
PY
)
eight='run.devices=["cuda:0","cuda:1","cuda:2","cuda:3","cuda:4","cuda:5","cuda:6","cuda:7"]'
echo "| model | update | GPUs | cuda:0 peak (at) | cuda:1–7 peak | host peak | fits the GPUs | step (estimate) |"
echo "|---|---|---|---|---|---|---|---|"
for model in 3b 7b; do
    for update in plain checkpointing lora zero1 zero2; do
        case $update in
            plain) label='as converted (no checkpointing)'; sets=() ;;
            checkpointing) label='`gradient_checkpointing = true`'
                sets=(--set nodes.update.gradient_checkpointing=true) ;;
            lora) label='checkpointing + `lora = { rank = 64 }`'
                sets=(--set nodes.update.gradient_checkpointing=true --set 'models.policy.lora={ rank = 64 }') ;;
            zero*) label="checkpointing + \`zero_stage = ${update#zero}\`"
                sets=(--set nodes.update.gradient_checkpointing=true --set "nodes.update.zero_stage=${update#zero}") ;;
        esac
        for gpu in h100 h200; do
            for n in 1 8; do
                # ZeRO shards over replicas: one GPU has nothing to shard.
                if [[ $update == zero* && $n == 1 ]]; then continue; fi
                devices=()
                if [[ $n == 8 ]]; then devices=(--set "$eight"); fi
                "$flowrl" plan "$graph" --json --gpu "$gpu" --gpus "$n" "${devices[@]}" "${sets[@]}" \
                    --set "models.policy.path=bench/gpu/qwen2_5_vl_${model}" --set models.policy.init=random \
                    --set nodes.data.path=bench/gpu/prompts.parquet \
                    --set nodes.data.val_path=bench/gpu/prompts.parquet |
                    python3 -c "$row" "$model" "$label" "$n" "$gpu"
            done
        done
    done
done
