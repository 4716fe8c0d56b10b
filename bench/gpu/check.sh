#!/usr/bin/env bash
# The one-shot GPU check of flowrl (bench/gpu/README.md): run once on a lent GPU machine, with the
# binaries built on a development machine and carried over. Everything it measures goes to $OUT
# (default bench/gpu/out): the table gpu.md (commit it as bench/results/gpu.md), steps.tsv and
# one log per step.
#
#   bash bench/gpu/check.sh            run every step (at most GPU_CHECK_TOTAL_S = 480 s in all)
#   bash bench/gpu/check.sh --dry-run  print the commands with their time budgets, check the files
#
# Steps, cheapest and most important first (budgets in seconds; a step may also use up to half
# its budget again out of the time earlier steps left unused, the last step all of it, never the
# time reserved for the steps after it):
#   setup     15  GPU, CUDA libraries, Python modules, which precision parameter the build has
#   fixtures  60  models/tests/cuda.rs (the models' fixture parity checks on CUDA), --test-threads 1
#   default   70  graphs/grpo_vlm.toml, 20 steps on cuda
#   prep      15  the benchmark's model (bench-make-model) and prompts (make_prompts.py)
#   bench_flowrl 70  bench/grpo_bench.toml on cuda with bench/run.sh's settings
#   bench_ref 60  bench/python/ref_rows.py --device cuda (transformers + torch, same shape)
#   3b       110  bench/gpu/grpo_3b.toml: GRPO steps of a Qwen2.5-VL-3B-sized random model
#   3b_lora   70  the same model and steps with LoRA (rank 16, alpha 32, all-linear, bf16 base)
#                 and a reference `from = "policy"` (the base, adapters off) with a low_var_kl loss
#
# Budgets: 3b_lora (70 s) was added after 3b, and the 470 s of steps + 10 s summary were kept by
# taking 20 s from 3b (130 -> 110) and 5-10 s from each earlier step (setup 20 -> 15, fixtures
# 70 -> 60, default 80 -> 70, prep 20 -> 15, bench_flowrl 80 -> 70, bench_ref 70 -> 60). None of
# these steps has been timed on the GPU yet, so the old budgets were guesses with room to spare,
# and time a step leaves unused goes to the next ones. Drawing the 3.75 B random weights on one
# host thread costs each 3B step about 100 s before its first GRPO step (142 s measured on a
# 2.6 GHz EPYC core), so 3b_lora's 70 s are not enough by themselves. As the last step it also
# gets all the time the earlier steps left unused. 3b (full fine-tuning) comes first because it
# matters more. It can still use up to 165 s (1.5 x 110), which covers the draw and its first
# step.
#
# Settings (environment): GPU_BUDGET_<step> (e.g. GPU_BUDGET_3b=200: one step's budget), OUT, GPU_CHECK_TOTAL_S (480), GPU_CHECK_PRECISION (f32: the precision of
# the default and benchmark runs; bf16 runs both sides in bf16), BENCH_PROMPTS (8), BENCH_N (8),
# BENCH_NEW (128), BENCH_MICRO (32), BENCH_REPS (3), BENCH_THREADS (nproc), GPU_3B_PROMPTS (4),
# GPU_3B_N (4), GPU_3B_NEW (64), GPU_3B_STEPS (2), GPU_3B_LORA_STEPS (GPU_3B_STEPS),
# GPU_3B_LORA_RANK (16), GPU_3B_LORA_ALPHA (32), GPU_3B_LORA_REF (1; 0: no reference model and
# no KL loss), PYTHON (python3), binaries: FLOWRL_BIN,
# FLOWRL_MAKE_MODEL_BIN, FLOWRL_CUDA_TEST_BIN (else bench/gpu/bin/, unpacked from
# bench/gpu/bin.tar.gz, else target/release/).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 1

DRY=0
case "${1:-}" in
  --dry-run|-n) DRY=1 ;;
  "") ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: bash bench/gpu/check.sh [--dry-run]" >&2; exit 2 ;;
esac

OUT="${OUT:-$root/bench/gpu/out}"
case "$OUT" in /*) ;; *) OUT="$root/$OUT" ;; esac
TOTAL=${GPU_CHECK_TOTAL_S:-480}
RESERVE=10 # seconds kept for the summary at the end
PREC=${GPU_CHECK_PRECISION:-f32}
P=${BENCH_PROMPTS:-8}
N=${BENCH_N:-8}
NEW=${BENCH_NEW:-128}
MICRO=${BENCH_MICRO:-32}
REPS=${BENCH_REPS:-3}
THREADS=${BENCH_THREADS:-$(nproc)}
P3=${GPU_3B_PROMPTS:-4}
N3=${GPU_3B_N:-4}
NEW3=${GPU_3B_NEW:-64}
STEPS3=${GPU_3B_STEPS:-2}
MICRO3=${GPU_3B_MICRO:-$((P3 * N3))}
STEPS3L=${GPU_3B_LORA_STEPS:-$STEPS3}
RANK3L=${GPU_3B_LORA_RANK:-16}
ALPHA3L=${GPU_3B_LORA_ALPHA:-32}
REF3L=${GPU_3B_LORA_REF:-1}
work="$root/bench/work"
model3="bench/gpu/qwen2_5_vl_3b"

# The sizes of both 3B steps (after `flowrl run bench/gpu/grpo_3b.toml`).
SIZE3_SET=(--set nodes.data.batch_size="$P3" --set nodes.rollout.n="$N3" --set nodes.rollout.max_new_tokens="$NEW3"
  --set nodes.update.mini_batch_size="$P3" --set nodes.update.micro_batch_size="$MICRO3")
# What 3b_lora adds to them: the LoRA policy (only the adapters train; the base stays frozen in
# the compute precision) and, as graphs/grpo_vlm_lora.toml does, a reference that is the base with
# the adapters off (no copy of the weights), its log-probs and a low_var_kl loss. The learning
# rate is that graph's LoRA rate. With grpo_3b.toml's 1e-6 the adapters would hardly move, and
# the KL of step 2 would be too small to show that the reference differs from the trained policy.
LORA3_SET=(--set "models.policy.lora={rank=$RANK3L, alpha=$ALPHA3L, target_modules=[\"all-linear\"]}" --set nodes.update.lr=3e-3)
if [ "$REF3L" = 1 ]; then
  LORA3_SET+=(--set 'models.reference={from="policy"}'
    --set "nodes.ref={kind=\"logprob\", model=\"reference\", timing=\"ref\", inputs={rollouts=\"rollout.rollouts\"}, micro_batch_size=$MICRO3}"
    --set nodes.update.inputs.ref_log_probs=ref.log_probs --set 'nodes.update.kl={estimator="low_var_kl", coef=0.001}')
fi

ORDER=(setup fixtures default prep bench_flowrl bench_ref 3b 3b_lora)
declare -A BUDGET=([setup]=15 [fixtures]=60 [default]=70 [prep]=15 [bench_flowrl]=70 [bench_ref]=60 [3b]=110 [3b_lora]=70)
declare -A TITLE=(
  [setup]="setup: GPU, CUDA libraries, Python modules, precision parameter"
  [fixtures]="1. fixture parity on CUDA (models/tests/cuda.rs)"
  [default]="2. default graph, 20 steps on cuda"
  [prep]="3. benchmark inputs: model (bench-make-model) and prompts"
  [bench_flowrl]="3. benchmark shape on cuda: flowrl"
  [bench_ref]="3. benchmark shape on cuda: transformers + torch"
  [3b]="4. GRPO step of a Qwen2.5-VL-3B-sized random model"
  [3b_lora]="5. LoRA GRPO step of the 3B-sized model (rank $RANK3L, all-linear)"
)
budget_sum=0
for s in "${ORDER[@]}"; do
  v="GPU_BUDGET_$s" # e.g. GPU_BUDGET_3b=200 changes one step's budget
  [ -n "${!v:-}" ] && BUDGET[$s]=${!v}
  budget_sum=$((budget_sum + BUDGET[$s]))
done

T0=$SECONDS
DRY_T=0 # the dry run's running total of budgets

# Seconds reserved for the steps after $1.
later_budget() {
  local after=0 sum=0 s
  for s in "${ORDER[@]}"; do
    [ "$after" = 1 ] && sum=$((sum + BUDGET[$s]))
    [ "$s" = "$1" ] && after=1
  done
  echo "$sum"
}

# The timeout of step $1 now: its budget plus up to half of it again from earlier steps' unused
# time (the last step: all of it), never eating into the budgets of the steps after it.
step_timeout() {
  local id=$1 b=${BUDGET[$1]} later avail cap
  later=$(later_budget "$id")
  avail=$((TOTAL - RESERVE - (SECONDS - T0) - later))
  if [ "$later" = 0 ]; then cap=$avail; else cap=$((b + b / 2)); fi
  [ "$avail" -lt "$cap" ] && cap=$avail
  echo "$cap"
}

# --- finding the binaries -------------------------------------------------------------------
TAR_LIST=""
[ -f bench/gpu/bin.tar.gz ] && TAR_LIST=$(tar tzf bench/gpu/bin.tar.gz 2> /dev/null)
in_tar() { grep -qx "${1#bench/gpu/}" <<< "$TAR_LIST"; }
unpack_bins() {
  [ -f bench/gpu/bin.tar.gz ] || return 0
  if [ "$DRY" = 1 ]; then
    echo "  bench/gpu/bin.tar.gz holds: $(grep -v '/$' <<< "$TAR_LIST" | tr '\n' ' ')"
    echo "  (a real run unpacks it: tar xzf bench/gpu/bin.tar.gz -C bench/gpu)"
  else
    tar xzf bench/gpu/bin.tar.gz -C bench/gpu || echo "warning: could not unpack bench/gpu/bin.tar.gz"
  fi
}

# pick_bin ENV_VALUE NAME: the env value, else bench/gpu/bin/NAME, else target/release/NAME.
pick_bin() {
  local from_env=$1 name=$2 c
  for c in "$from_env" "bench/gpu/bin/$name" "target/release/$name"; do
    [ -n "$c" ] && [ -f "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    # A dry run does not unpack the tarball: report what the run would take from it.
    [ "$DRY" = 1 ] && [ "$c" = "bench/gpu/bin/$name" ] && in_tar "$c" && { echo "$c"; return 0; }
  done
  echo ""
}

# The test executable of models/tests/cuda.rs: env, bench/gpu/bin/cuda-test, else the newest
# target/release/deps/cuda-<hash>.
pick_test_bin() {
  local c
  c=$(pick_bin "${FLOWRL_CUDA_TEST_BIN:-}" cuda-test)
  if [ -z "$c" ]; then
    c=$(ls -t target/release/deps/cuda-* 2>/dev/null | while read -r f; do
      case "$f" in *.d|*.rlib|*.rmeta|*.o) continue ;; esac
      [ -x "$f" ] && [ -f "$f" ] && { echo "$f"; break; }
    done)
  fi
  echo "$c"
}

# --- one step -------------------------------------------------------------------------------
MEM_PID=""
HAVE_SMI=0
command -v nvidia-smi > /dev/null 2>&1 && HAVE_SMI=1
TIMEBIN=""
[ -x /usr/bin/time ] && TIMEBIN=/usr/bin/time

mem_start() { # sample the GPU's used memory every 0.5 s into $1
  : > "$1"
  MEM_PID=""
  [ "$HAVE_SMI" = 1 ] || return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$1" 2> /dev/null &
  MEM_PID=$!
}
mem_stop() { # prints the peak MiB of file $1 ("" when nothing was sampled)
  if [ -n "$MEM_PID" ]; then
    kill "$MEM_PID" 2> /dev/null
    wait "$MEM_PID" 2> /dev/null
    MEM_PID=""
  fi
  grep -E '^[ 0-9]+$' "$1" 2> /dev/null | tr -d ' ' | sort -n | tail -1
}
trap '[ -n "$MEM_PID" ] && kill "$MEM_PID" 2>/dev/null' EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# record ID STATUS RC WALL TIMEOUT PEAK LOG NOTE: one line of steps.tsv.
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "${TITLE[$1]}" "$2" "$3" "$4" "$5" "$6" "$7" "$8" >> "$OUT/steps.tsv"
}

print_cmd() {
  local a out=""
  for a in "$@"; do
    case "$a" in
      *[!A-Za-z0-9_./:=,+@%-]*|"") out+="'${a//\'/\'\\\'\'}' " ;;
      *) out+="$a " ;;
    esac
  done
  echo "${out% }"
}

# run_step ID LOG NOTE CMD...: runs CMD under its timeout with the memory sampler, records it.
# Sets STEP_RC and STEP_WALL.
run_step() {
  local id=$1 log=$2 note=$3
  shift 3
  if [ "$DRY" = 1 ]; then
    DRY_T=$((DRY_T + BUDGET[$id]))
    echo "  \$ $(print_cmd "$@")"
    echo "    > $log"
    STEP_RC=0
    return 0
  fi
  local to peak t0 t1 status cmd=("$@")
  to=$(step_timeout "$id")
  if [ "$to" -lt 5 ]; then
    echo "== [$id] SKIPPED: no time left (${to}s)"
    record "$id" SKIPPED "" "" "$to" "" "$log" "no time left; $note"
    STEP_RC=999
    return 0
  fi
  [ -n "$TIMEBIN" ] && cmd=("$TIMEBIN" -f '%M %e' -o "$OUT/$id.time" "${cmd[@]}")
  echo "== [$id] ${TITLE[$id]} (timeout ${to}s; elapsed $((SECONDS - T0))s of ${TOTAL}s)"
  echo "   \$ $(print_cmd "$@")"
  { echo "\$ $(print_cmd "$@")"; echo "# timeout ${to}s"; } > "$log"
  mem_start "$OUT/$id.mem"
  t0=$(now)
  timeout -k 5 "$to" "${cmd[@]}" >> "$log" 2>&1 < /dev/null
  STEP_RC=$?
  t1=$(now)
  peak=$(mem_stop "$OUT/$id.mem")
  STEP_WALL=$(secs "$t0" "$t1")
  case "$STEP_RC" in
    0) status=ok ;;
    124|137) status=TIMEOUT ;;
    *) status=FAILED ;;
  esac
  record "$id" "$status" "$STEP_RC" "$STEP_WALL" "$to" "$peak" "$log" "$note"
  echo "   $status (rc $STEP_RC) in ${STEP_WALL}s, peak GPU memory ${peak:-?} MiB; elapsed $((SECONDS - T0))s of ${TOTAL}s"
  [ "$status" = ok ] || tail -n 5 "$log" | sed 's/^/   | /'
  return 0
}

# A step that is not run (its input is missing): recorded, costs nothing.
skip_step() { # ID REASON
  if [ "$DRY" = 1 ]; then
    DRY_T=$((DRY_T + BUDGET[$1]))
    echo "  (skipped: $2)"
    return 0
  fi
  echo "== [$1] SKIPPED: $2"
  record "$1" SKIPPED "" "" "" "" "" "$2"
}

header() { # ID: the dry run's line for a step
  [ "$DRY" = 1 ] || return 0
  local next=$((DRY_T + BUDGET[$1]))
  echo
  echo "[$1] ${TITLE[$1]}: budget ${BUDGET[$1]}s (running total ${next}s of ${TOTAL}s)"
}

# --- files ----------------------------------------------------------------------------------
MISSING=()
need() { # PATH WHAT
  if [ -e "$1" ]; then
    [ "$DRY" = 1 ] && printf '  ok       %s (%s)\n' "$1" "$2"
  elif [ "$DRY" = 1 ] && [ "${1#bench/gpu/}" != "$1" ] && in_tar "$1"; then
    printf '  ok       %s (%s; in bench/gpu/bin.tar.gz)\n' "$1" "$2"
  else
    MISSING+=("$1 ($2)")
    [ "$DRY" = 1 ] && printf '  MISSING  %s (%s)\n' "$1" "${2}"
  fi
  return 0
}

if [ "$DRY" = 1 ]; then
  echo "bench/gpu/check.sh --dry-run: nothing heavy runs; OUT would be $OUT"
  echo "total budget ${budget_sum}s of steps + ${RESERVE}s summary (limit GPU_CHECK_TOTAL_S = ${TOTAL}s)"
  [ $((budget_sum + RESERVE)) -le "$TOTAL" ] || echo "WARNING: the step budgets exceed the total"
  echo
  echo "binaries:"
else
  mkdir -p "$OUT" "$work"
  : > "$OUT/steps.tsv"
fi
unpack_bins
FLOWRL=$(pick_bin "${FLOWRL_BIN:-}" flowrl)
MAKE_MODEL=$(pick_bin "${FLOWRL_MAKE_MODEL_BIN:-}" bench-make-model)
CUDA_TEST=$(pick_test_bin)
need "${FLOWRL:-target/release/flowrl}" "flowrl, built with --features cuda"
need "${MAKE_MODEL:-target/release/bench-make-model}" "bench-make-model, from -p flowrl-bench"
need "${CUDA_TEST:-target/release/deps/cuda-<hash>}" "test executable of models/tests/cuda.rs"
[ "$DRY" = 1 ] && echo "inputs:"
for f in graphs/grpo_vlm.toml bench/grpo_bench.toml bench/gpu/grpo_3b.toml bench/model_config.json \
  "$model3/config.json" bench/preprocessor_config.json assets/tiny-qwen2-vl/config.json \
  assets/tiny-qwen2-vl/model.safetensors assets/tiny-qwen2-vl/tokenizer.json \
  assets/tiny-qwen2-vl/tokenizer_config.json datasets/shapes/train.parquet datasets/shapes/test.parquet \
  tests/fixtures/models/qwen2_vl tests/fixtures/models/qwen2_5_vl tests/fixtures/models/gemma4 \
  bench/python/make_prompts.py bench/python/ref_rows.py bench/python/common.py \
  bench/gpu/prompts.parquet bench/gpu/prompts.json bench/gpu/summarize.py; do
  need "$f" "input"
done

PY=""
for c in ${PYTHON:-} python3 python; do
  command -v "$c" > /dev/null 2>&1 && { PY=$c; break; }
done

# The dry run also checks the graphs the way the run will use them (flowrl validate is cheap).
if [ "$DRY" = 1 ]; then
  echo "tools:"
  for t in timeout nvidia-smi tar awk "${PY:-python3}"; do
    if command -v "$t" > /dev/null 2>&1; then echo "  ok       $t"; else echo "  absent   $t$([ "$t" = nvidia-smi ] && echo ' (expected without a GPU: memory is then not sampled)')"; fi
  done
  if [ -n "$PY" ]; then
    echo "  $PY modules here (the GPU machine's are probed in setup): $("$PY" - << 'EOF' 2>/dev/null
import importlib.util as u
print(", ".join(f"{m} {'yes' if u.find_spec(m) else 'no'}" for m in ["torch", "transformers", "pyarrow", "PIL", "trl"]))
EOF
)"
  fi
  checker=$FLOWRL
  [ -n "$checker" ] && [ -x "$checker" ] || checker=target/release/flowrl
  if [ -x "$checker" ]; then
    echo "graph checks with $checker (flowrl validate, --device cpu; the run uses cuda):"
    for g in "graphs/grpo_vlm.toml" "bench/gpu/grpo_3b.toml --set nodes.data.path=bench/gpu/prompts.parquet"; do
      # shellcheck disable=SC2086
      msg=$("$checker" validate $g --device cpu 2>&1 | tail -n 3 | tr '\n' ' ')
      echo "  ${msg% }"
    done
    # 3b_lora's command line, every --set of the run (its data path is the shipped prompts here).
    if msg=$("$checker" validate bench/gpu/grpo_3b.toml --device cpu "${SIZE3_SET[@]}" "${LORA3_SET[@]}" \
      --set models.policy.precision=bf16 --set nodes.data.path=bench/gpu/prompts.parquet 2>&1); then
      echo "  3b_lora's --set flags (sizes, LoRA$([ "$REF3L" = 1 ] && echo ', reference'), precision bf16): $(tail -n 1 <<< "$msg")"
    else
      echo "  WARNING: 3b_lora's --set flags do not validate:"
      tail -n 12 <<< "$msg" | sed 's/^/    /'
    fi
    cuda_msg=$("$checker" validate graphs/grpo_vlm.toml --device cuda 2>&1)
    if grep -q "built without CUDA" <<< "$cuda_msg"; then
      echo "  WARNING: $checker is built without CUDA (build it with --features cuda, see bench/gpu/README.md)"
    else
      echo "  --device cuda: $(tail -n 3 <<< "$cuda_msg" | tr '\n' ' ')"
    fi
  fi
fi

# --- setup ----------------------------------------------------------------------------------
header setup
PREC_KEY=""   # the model resource's precision parameter: precision, dtype, or none
BF16_OK=0
HAVE_TORCH=0 HAVE_TF=0 HAVE_PYARROW=0 HAVE_PIL=0
if [ "$DRY" = 1 ]; then
  DRY_T=$((DRY_T + BUDGET[setup]))
  echo "  \$ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/env.txt"
  echo "  \$ ${PY:-python3} -c 'import torch, transformers, pyarrow, PIL, trl ...'   (versions, cuda available)"
  echo "  \$ flowrl validate graphs/grpo_vlm.toml --device cuda --set models.policy.{precision,dtype}={bf16,f32}   (which precision parameter the build has)"
  echo "  copy assets/tiny-qwen2-vl/{tokenizer.json,tokenizer_config.json}, chat_template.jinja (from tokenizer_config.json) and bench/preprocessor_config.json into $model3/"
else
  setup_t0=$(now)
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "host: $(uname -srm); cores: $(nproc); memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "== nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv"
    timeout 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "(nvidia-smi failed or absent)"
    echo "== nvcc"
    (command -v nvcc > /dev/null && nvcc --version | tail -n 2) || echo "(no nvcc on PATH)"
  } > "$OUT/env.txt" 2>&1
  # cudarc loads libcuda and NVRTC at run time: add the toolkit's library folders if present.
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  {
    echo "== libraries (ldconfig -p | grep -E 'libcuda.so|libnvrtc')"
    ldconfig -p 2> /dev/null | grep -E 'libcuda\.so|libnvrtc' | head -n 8
    ls /usr/local/cuda*/lib64/libnvrtc.so* 2> /dev/null | head -n 4
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-(unset: balanced)}"
    echo "== binaries"
    for b in "$FLOWRL" "$MAKE_MODEL" "$CUDA_TEST"; do [ -n "$b" ] && ls -l "$b"; done
    [ -f bench/gpu/bin/BUILD_INFO ] && { echo "== bench/gpu/bin/BUILD_INFO"; cat bench/gpu/bin/BUILD_INFO; }
  } >> "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
  if [ -n "$PY" ]; then
    timeout 30 "$PY" - > "$OUT/python.json" 2> "$OUT/python.log" << 'EOF'
import importlib, importlib.util, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
for m in ["torch", "transformers", "pyarrow", "PIL", "torchvision", "trl"]:
    if importlib.util.find_spec(m) is None:
        out[m] = None
        continue
    try:
        out[m] = getattr(importlib.import_module(m), "__version__", "yes")
    except Exception as e:  # noqa: BLE001
        out[m] = None
        out[m + "_error"] = repr(e)[:200]
if out.get("torch"):
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        out["torch_device"] = torch.cuda.get_device_name(0)
print(json.dumps(out))
EOF
    echo "python: $(cat "$OUT/python.json" 2> /dev/null)"
    grep -q '"torch": "' "$OUT/python.json" 2> /dev/null && HAVE_TORCH=1
    grep -q '"transformers": "' "$OUT/python.json" 2> /dev/null && HAVE_TF=1
    grep -q '"pyarrow": "' "$OUT/python.json" 2> /dev/null && HAVE_PYARROW=1
    grep -q '"PIL": "' "$OUT/python.json" 2> /dev/null && HAVE_PIL=1
  else
    echo '{"python": null}' > "$OUT/python.json"
  fi
  # Which precision parameter the model resource has (validation only: exit 78 on an unknown key).
  if [ -n "$FLOWRL" ]; then
    for try in "precision bf16" "precision f32" "dtype bf16" "dtype f32"; do
      # shellcheck disable=SC2086 # two words: the key and the value
      set -- $try
      if timeout 15 "$FLOWRL" validate graphs/grpo_vlm.toml --device cuda --set "models.policy.$1=$2" >> "$OUT/precision_probe.log" 2>&1; then
        PREC_KEY=$1
        [ "$2" = bf16 ] && BF16_OK=1
        break
      fi
    done
    echo "precision parameter: ${PREC_KEY:-none} (bf16 accepted: $BF16_OK)"
  fi
  # The 3B model's folder: config.json is kept in the repository, the tokenizer is the tiny one.
  cp assets/tiny-qwen2-vl/tokenizer.json assets/tiny-qwen2-vl/tokenizer_config.json "$model3/"
  cp bench/preprocessor_config.json "$model3/preprocessor_config.json"
  # (flowrl reads the template from tokenizer_config.json; the .jinja file is transformers' copy)
  if [ -n "$PY" ]; then
    "$PY" -c 'import json, sys; open(sys.argv[2], "w").write(json.load(open(sys.argv[1]))["chat_template"])' \
      assets/tiny-qwen2-vl/tokenizer_config.json "$model3/chat_template.jinja"
  fi
  record setup ok 0 "$(secs "$setup_t0" "$(now)")" "${BUDGET[setup]}" "" "$OUT/env.txt" \
    "precision parameter ${PREC_KEY:-none}, bf16 ${BF16_OK}"
fi

# The --set of the default and benchmark runs' precision, and the matching torch dtype.
PREC_SET=()
if [ -n "$PREC_KEY" ]; then
  if [ "$PREC" = bf16 ] && [ "$BF16_OK" = 0 ]; then PREC=f32; fi
  PREC_SET=(--set "models.policy.$PREC_KEY=$PREC")
  PREC_NOTE="precision $PREC (models.policy.$PREC_KEY)"
else
  PREC_NOTE="the build's default precision (no precision parameter found)"
  [ "$DRY" = 1 ] && PREC_SET=(--set "models.policy.precision=$PREC") && PREC_NOTE="precision $PREC (parameter name probed in setup)"
fi
case "$PREC" in bf16) TORCH_DTYPE=bfloat16 ;; *) TORCH_DTYPE=float32 ;; esac

# --- 1. fixture parity ------------------------------------------------------------------------
header fixtures
if [ -n "$CUDA_TEST" ] || [ "$DRY" = 1 ]; then
  run_step fixtures "$OUT/fixtures.log" "f32 (and bf16 where present) parity against transformers" \
    env FLOWRL_MODEL_FIXTURES="$root/tests/fixtures/models" RUST_BACKTRACE=1 \
    "${CUDA_TEST:-target/release/deps/cuda-HASH}" --test-threads 1
else
  skip_step fixtures "no test executable of models/tests/cuda.rs (FLOWRL_CUDA_TEST_BIN, bench/gpu/bin/cuda-test, target/release/deps/cuda-*)"
fi

# --- 2. default graph -----------------------------------------------------------------------
header default
if [ -n "$FLOWRL" ] || [ "$DRY" = 1 ]; then
  run_step default "$OUT/default_cuda.log" "$PREC_NOTE" \
    env RAYON_NUM_THREADS="$THREADS" "${FLOWRL:-target/release/flowrl}" run graphs/grpo_vlm.toml \
    --device cuda --steps 20 --out "$OUT/default_cuda" --force "${PREC_SET[@]}"
else
  skip_step default "no flowrl binary"
fi

# --- 3. benchmark shape -----------------------------------------------------------------------
header prep
max_p=$P
[ "$P3" -gt "$max_p" ] && max_p=$P3
REF_PROMPTS="$work/prompts.parquet"
if [ "$DRY" = 1 ]; then
  DRY_T=$((DRY_T + BUDGET[prep]))
  echo "  \$ ${MAKE_MODEL:-target/release/bench-make-model} bench/model_config.json $work/model 0   (unless $work/model/model.safetensors exists)"
  echo "    then copy the tokenizer files, chat_template.jinja and bench/preprocessor_config.json next to it"
  echo "    (bench-make-model copies them from its build tree's path, absent when the repository moved)"
  echo "  \$ ${PY:-python3} bench/python/make_prompts.py datasets/shapes/train.parquet $work/prompts.parquet $max_p 224"
  echo "    (needs pyarrow + PIL; without them: cp bench/gpu/prompts.parquet $work/prompts.parquet, same 8 rows made here,"
  echo "     and the transformers side reads bench/gpu/prompts.json)"
else
  prep_t0=$(now)
  prep_note=""
  prep_status=ok
  {
    if [ ! -f "$work/model/model.safetensors" ]; then
      if [ -n "$MAKE_MODEL" ]; then
        echo "\$ $MAKE_MODEL bench/model_config.json $work/model 0"
        timeout "$(step_timeout prep)" "$MAKE_MODEL" bench/model_config.json "$work/model" 0
        echo "(rc $?)"
      else
        echo "no bench-make-model binary"
      fi
    fi
    if [ -f "$work/model/model.safetensors" ]; then
      cp assets/tiny-qwen2-vl/tokenizer.json assets/tiny-qwen2-vl/tokenizer_config.json "$work/model/"
      cp bench/preprocessor_config.json "$work/model/preprocessor_config.json"
      [ -n "$PY" ] && "$PY" -c 'import json, sys; open(sys.argv[2], "w").write(json.load(open(sys.argv[1]))["chat_template"])' \
        assets/tiny-qwen2-vl/tokenizer_config.json "$work/model/chat_template.jinja"
      ls -l "$work/model"
    fi
    if [ "$HAVE_PYARROW" = 1 ] && [ "$HAVE_PIL" = 1 ] &&
      timeout 60 "$PY" bench/python/make_prompts.py datasets/shapes/train.parquet "$work/prompts.parquet" "$max_p" 224; then
      echo "prompts: make_prompts.py"
    else
      echo "prompts: make_prompts.py not run or failed (pyarrow $HAVE_PYARROW, PIL $HAVE_PIL): using bench/gpu/prompts.parquet"
      cp bench/gpu/prompts.parquet "$work/prompts.parquet"
    fi
  } > "$OUT/prep.log" 2>&1
  grep -q "using bench/gpu/prompts.parquet" "$OUT/prep.log" && prep_note="prompts: the shipped bench/gpu/prompts.parquet (8 rows)"
  [ "$HAVE_PYARROW" = 1 ] || REF_PROMPTS="$root/bench/gpu/prompts.json"
  if [ ! -f "$work/model/model.safetensors" ]; then
    prep_status=FAILED
    prep_note="no benchmark model: $(tail -n 2 "$OUT/prep.log" | tr '\n' ' ')"
  fi
  record prep "$prep_status" "" "$(secs "$prep_t0" "$(now)")" "${BUDGET[prep]}" "" "$OUT/prep.log" "$prep_note"
  echo "== [prep] $prep_status ${prep_note}"
  # Time this bookkeeping step did not use goes to the next steps.
fi

header bench_flowrl
rows=$((P * N))
m=$MICRO
[ "$m" -gt "$rows" ] && m=$rows
BENCH_SIZES="$P prompts x n $N, $NEW new tokens, micro-batches of $m, $((REPS + 1)) steps (first = warm-up)"
if { [ -n "$FLOWRL" ] && [ -f "$work/model/model.safetensors" ]; } || [ "$DRY" = 1 ]; then
  old_micro=()
  grep -q '^\[nodes\.old\]' bench/grpo_bench.toml && old_micro=(--set nodes.old.micro_batch_size="$m")
  run_step bench_flowrl "$OUT/bench_flowrl.log" "$BENCH_SIZES; $PREC_NOTE" \
    env RAYON_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" "${FLOWRL:-target/release/flowrl}" run bench/grpo_bench.toml \
    --device cuda --out "$OUT/bench_flowrl" --force --steps $((REPS + 1)) \
    --set nodes.data.batch_size="$P" --set nodes.rollout.n="$N" \
    --set nodes.rollout.max_new_tokens="$NEW" "${old_micro[@]}" \
    --set nodes.update.mini_batch_size="$P" --set nodes.update.micro_batch_size="$m" "${PREC_SET[@]}"
else
  skip_step bench_flowrl "no flowrl binary or no benchmark model (see prep)"
fi

header bench_ref
if [ "$DRY" = 1 ] || { [ "$HAVE_TORCH" = 1 ] && [ "$HAVE_TF" = 1 ] && [ "$HAVE_PIL" = 1 ] && [ -f "$work/model/model.safetensors" ]; }; then
  [ "$DRY" = 1 ] || mkdir -p "$OUT/bench_ref"
  run_step bench_ref "$OUT/bench_ref.log" "$BENCH_SIZES; torch $TORCH_DTYPE; TRL not run (not installed there)" \
    env OMP_NUM_THREADS="$THREADS" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "${PY:-python3}" bench/python/ref_rows.py "$work/model" "$REF_PROMPTS" \
    "$OUT/bench_ref/ref.json" --prompts "$P" --n "$N" --new "$NEW" --micro "$MICRO" \
    --reps $((REPS + 1)) --threads "$THREADS" --device cuda --dtype "$TORCH_DTYPE"
  [ "$DRY" = 1 ] && echo "    (without pyarrow the prompts argument is bench/gpu/prompts.json; TRL's row 4 is not run: TRL is not installed there)"
else
  skip_step bench_ref "needs torch, transformers and PIL (torch $HAVE_TORCH, transformers $HAVE_TF, PIL $HAVE_PIL) and the benchmark model"
fi

# --- 4. Qwen2.5-VL-3B-sized random model -------------------------------------------------------
header 3b
SIZES3="$P3 prompts x n $N3, $NEW3 new tokens, micro-batch $MICRO3, $STEPS3 steps"
data3=()
[ -f "$work/prompts.parquet" ] || [ "$DRY" = 1 ] || data3=(--set nodes.data.path=bench/gpu/prompts.parquet)
run3() { # STEP_ID STEPS OUT_DIR LOG NOTE SET...: flowrl run bench/gpu/grpo_3b.toml at SIZE3_SET
  local id=$1 steps=$2 dir=$3 log=$4 note=$5
  shift 5
  run_step "$id" "$log" "$note" \
    env RAYON_NUM_THREADS="$THREADS" "${FLOWRL:-target/release/flowrl}" run bench/gpu/grpo_3b.toml \
    --device cuda --out "$dir" --force --steps "$steps" "${SIZE3_SET[@]}" "${data3[@]}" "$@"
}
retry=0
if [ -n "$FLOWRL" ] || [ "$DRY" = 1 ]; then
  key=${PREC_KEY:-precision}
  run3 3b "$STEPS3" "$OUT/3b" "$OUT/3b.log" "$SIZES3; bf16 (models.policy.$key=bf16)" --set "models.policy.$key=bf16"
  # A configuration error (exit 78: no bf16 on this build), or a quick failure that names the
  # precision: rerun in f32.
  if [ "$DRY" = 0 ] && [ "$STEP_RC" != 0 ] && [ "$STEP_RC" != 124 ] && [ "$STEP_RC" != 137 ] && [ "$STEP_RC" != 999 ]; then
    [ "$STEP_RC" = 78 ] && retry=1
    # (the log's first two lines are the command and its timeout)
    awk -v w="$STEP_WALL" 'BEGIN { exit !(w < 60) }' && tail -n +3 "$OUT/3b.log" | grep -qiE 'bf16|precision|dtype' && retry=1
  fi
  if [ "$DRY" = 1 ]; then
    echo "    if it exits 78 (no bf16 on this build), or fails quickly naming the precision, rerun in f32:"
    DRY_T=$((DRY_T - BUDGET[3b]))
  fi
  if [ "$retry" = 1 ]; then
    # The bf16 attempt's line of steps.tsv: a refusal, not the step's result.
    awk -F'\t' -v OFS='\t' -v n="$(wc -l < "$OUT/steps.tsv")" 'NR == n { $3 = "bf16 refused" } { print }' \
      "$OUT/steps.tsv" > "$OUT/steps.tsv.new" && mv "$OUT/steps.tsv.new" "$OUT/steps.tsv"
    echo "   bf16 refused (rc $STEP_RC): rerun in f32"
  fi
  if [ "$retry" = 1 ] || [ "$DRY" = 1 ]; then
    if [ -n "$PREC_KEY" ]; then f32set=(--set "models.policy.$PREC_KEY=f32"); else f32set=(); fi
    [ "$DRY" = 1 ] && f32set=(--set "models.policy.precision=f32")
    run3 3b "$STEPS3" "$OUT/3b_f32" "$OUT/3b_f32.log" "$SIZES3; f32 (bf16 attempt exited $STEP_RC)" "${f32set[@]}"
  fi
else
  skip_step 3b "no flowrl binary"
fi

# --- 5. the 3B model with LoRA and an adapters-off reference ----------------------------------
# The same graph, sizes and seed (random weights) as step 4, plus LORA3_SET. The base
# weights are frozen in bf16, so only the adapters have gradients and AdamW moments. The
# reference `from = "policy"` runs the policy's modules with the adapters off.
header 3b_lora
SIZES3L="$P3 prompts x n $N3, $NEW3 new tokens, micro-batch $MICRO3, $STEPS3L steps"
if [ "$REF3L" = 1 ]; then
  LORA3_NOTE="LoRA rank $RANK3L alpha $ALPHA3L all-linear, lr 3e-3; reference from policy (adapters off), low_var_kl 0.001"
else
  LORA3_NOTE="LoRA rank $RANK3L alpha $ALPHA3L all-linear, lr 3e-3; no reference (GPU_3B_LORA_REF=0)"
fi
if [ -n "$FLOWRL" ] || [ "$DRY" = 1 ]; then
  # bf16, unless setup found no bf16 or step 4's bf16 attempt was refused (then f32, as step 4).
  PREC3L=bf16
  prec3l_set=(--set "models.policy.${PREC_KEY:-precision}=bf16")
  if [ "$DRY" = 0 ] && [ -z "$PREC_KEY" ]; then
    PREC3L="the build's default precision"
    prec3l_set=()
  elif [ "$DRY" = 0 ] && { [ "$BF16_OK" = 0 ] || [ "$retry" = 1 ]; }; then
    PREC3L=f32
    prec3l_set=(--set "models.policy.$PREC_KEY=f32")
  fi
  run3 3b_lora "$STEPS3L" "$OUT/3b_lora" "$OUT/3b_lora.log" "$SIZES3L; $PREC3L; $LORA3_NOTE" \
    "${LORA3_SET[@]}" "${prec3l_set[@]}"
  [ "$DRY" = 1 ] && echo "    (bf16 unless setup or step 4 found none; reported like step 4, plus timing_s/ref and actor/kl_loss)"
else
  skip_step 3b_lora "no flowrl binary"
fi

# --- the table ------------------------------------------------------------------------------
if [ "$DRY" = 1 ]; then
  echo
  echo "[summary] \$ ${PY:-python3} bench/gpu/summarize.py $OUT   -> $OUT/gpu.md (commit as bench/results/gpu.md)"
  echo
  echo "running total of the step budgets: ${DRY_T}s + ${RESERVE}s summary = $((DRY_T + RESERVE))s of ${TOTAL}s"
  if [ "${#MISSING[@]}" -gt 0 ]; then
    echo "missing (${#MISSING[@]}):"
    printf '  %s\n' "${MISSING[@]}"
    echo "build and pack them as bench/gpu/README.md says (bash bench/gpu/pack.sh)"
  else
    echo "nothing missing"
  fi
  exit 0
fi

{
  echo "P=$P"; echo "N=$N"; echo "NEW=$NEW"; echo "MICRO=$MICRO"; echo "MICRO_USED=$m"; echo "REPS=$REPS"
  echo "THREADS=$THREADS"; echo "PREC=$PREC"; echo "PREC_KEY=$PREC_KEY"; echo "BF16_OK=$BF16_OK"
  echo "TORCH_DTYPE=$TORCH_DTYPE"; echo "P3=$P3"; echo "N3=$N3"; echo "NEW3=$NEW3"; echo "STEPS3=$STEPS3"
  echo "MICRO3=$MICRO3"; echo "STEPS3L=$STEPS3L"; echo "RANK3L=$RANK3L"; echo "ALPHA3L=$ALPHA3L"; echo "REF3L=$REF3L"
  echo "PREC3L=${PREC3L:-}"; echo "TOTAL=$TOTAL"; echo "ELAPSED=$((SECONDS - T0))"; echo "REF_PROMPTS=$REF_PROMPTS"
} > "$OUT/settings.txt"
if [ -n "$PY" ] && timeout 30 "$PY" bench/gpu/summarize.py "$OUT" > "$OUT/summarize.log" 2>&1; then
  echo "== wrote $OUT/gpu.md"
else
  # Without Python the table is the steps alone.
  {
    echo "# flowrl GPU check (bench/gpu/check.sh)"
    echo
    echo "summarize.py did not run: $(tail -n 3 "$OUT/summarize.log" 2> /dev/null | tr '\n' ' ')"
    echo
    echo '```'
    cat "$OUT/env.txt"
    echo '```'
    echo
    echo "| step | status | rc | wall (s) | timeout (s) | peak GPU MiB | note |"
    echo "|---|---|---:|---:|---:|---:|---|"
    while IFS=$'\t' read -r id title status rc wall to peak log note; do
      echo "| $title | $status | $rc | $wall | $to | $peak | $note |"
    done < "$OUT/steps.tsv"
  } > "$OUT/gpu.md"
  echo "== wrote $OUT/gpu.md (steps only)"
fi
cat "$OUT/gpu.md"
echo "== done in $((SECONDS - T0))s of ${TOTAL}s"
