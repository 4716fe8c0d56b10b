#!/usr/bin/env bash
# The one-shot GPU check of flowrl (bench/gpu/README.md): run on a lent GPU machine, with the
# binaries built on a development machine and carried over. Everything it measures goes to $OUT
# (default bench/gpu/out): the table gpu.md (commit it as bench/results/gpu.md), steps.tsv,
# micro.jsonl and one log per step.
#
#   bash bench/gpu/check.sh            run every step (at most GPU_CHECK_TOTAL_S = 420 s in all)
#   bash bench/gpu/check.sh --dry-run  print the commands with their time budgets, check the files
#
# The lent machine has 15 minutes in all, start-up included, and at most 600 s per command: 420 s
# leave room for a second run in the same slot. Steps, the measurements that settle the GPU
# performance model first (shared/research/gpu_path.md §4, §6), budgets in seconds; a step may
# also use up to half its budget again out of the time earlier steps left unused (the last step
# all of it), never the time reserved for the steps after it:
#   setup      10  GPU, driver (R580+ for CUDA 13 PTX), toolkit headers (CUDA_PATH), NVRTC,
#                  NCCL, the kernel caches, which precision parameter the build has
#   micro      60  bench-gpu-micro: NCCL loaded by its soname and a one-rank all-reduce on the
#                  GPU, µs per launch, device -> host read bandwidth, the first forward/backward's
#                  compile + autotune time, bf16 GEMM TFLOP/s at the 3B's shapes
#   3b        240  bench/gpu/grpo_3b.toml: GRPO steps of a Qwen2.5-VL-3B-sized random model
#   then whatever is left, in this order:
#   fixtures   30  models/tests/cuda.rs (fixture parity, flowrl's kernels), --test-threads 1
#   default    20  graphs/grpo_vlm.toml, 20 steps on cuda (metrics per step: a cut run reports
#                  the steps it finished)
#   prep        5  the benchmark's model (bench-make-model) and prompts (make_prompts.py)
#   bench_flowrl 15  bench/grpo_bench.toml on cuda with bench/run.sh's settings
#   bench_ref  15  bench/python/ref_rows.py --device cuda (transformers + torch, same shape)
#   3b_lora    15  the 3B model and steps with LoRA (rank 16, alpha 32, all-linear, bf16 base)
#                  and a reference `from = "policy"` (the base, adapters off) with a low_var_kl
#                  loss; as the last step it also gets all the time left
#
# Kernel and autotune caches: setup copies bench/gpu/cubecl.toml to the repository root for the
# run (removed at exit), so every process (all started in the root) compiles kernels into and
# reads them from bench/gpu/cache (PTX, cubecl.toml's [compilation] cache) and shares autotune
# results there ([autotune] cache). The compiled kernels are wiped when the binaries change
# (bench/gpu/cache/BUILD); pack.sh carries a cache in bin.tar.gz, and the run leaves
# cubecl-cache.tar.gz in $OUT for the next one. Each step's row counts the kernels it compiled.
#
# The 3.75 B random weights are drawn on all cores (models/src/weights.rs `RandomInit`: parallel
# chunks of one ChaCha stream), so on 16 cores a 3B step should start after seconds to tens of
# seconds (not timed yet), not the ~100 s of the old one-thread draw; the bf16 rounding and the
# upload stay serial.
#
# Settings (environment): GPU_BUDGET_<step> (e.g. GPU_BUDGET_3b=300: one step's budget), OUT,
# GPU_CHECK_TOTAL_S (420), GPU_CHECK_PRECISION (f32: the precision of the default and benchmark
# runs; bf16 runs both sides in bf16), GPU_MICRO_ARGS (more bench-gpu-micro arguments),
# BENCH_PROMPTS (8), BENCH_N (8), BENCH_NEW (128), BENCH_MICRO (32), BENCH_REPS (3),
# BENCH_THREADS (nproc), GPU_3B_PROMPTS (4), GPU_3B_N (4), GPU_3B_NEW (64), GPU_3B_STEPS (2),
# GPU_3B_LORA_STEPS (GPU_3B_STEPS), GPU_3B_LORA_RANK (16), GPU_3B_LORA_ALPHA (32),
# GPU_3B_LORA_REF (1; 0: no reference model and no KL loss), PYTHON (python3), CUDA_PATH (else
# the first toolkit with include/cuda_bf16.h), binaries: FLOWRL_BIN, FLOWRL_MAKE_MODEL_BIN,
# FLOWRL_CUDA_TEST_BIN, FLOWRL_MICRO_BIN (else bench/gpu/bin/, unpacked from
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
TOTAL=${GPU_CHECK_TOTAL_S:-420}
RESERVE=10 # seconds kept for the summary and the cache archive at the end
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
read -r -a MICRO_ARGS <<< "${GPU_MICRO_ARGS:-}"
work="$root/bench/work"
model3="bench/gpu/qwen2_5_vl_3b"
CACHE=bench/gpu/cache # cubecl's compiled kernels and autotune results (bench/gpu/cubecl.toml)

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

ORDER=(setup micro 3b fixtures default prep bench_flowrl bench_ref 3b_lora)
declare -A BUDGET=([setup]=10 [micro]=60 [3b]=240 [fixtures]=30 [default]=20 [prep]=5 [bench_flowrl]=15 [bench_ref]=15 [3b_lora]=15)
declare -A TITLE=(
  [setup]="setup: GPU, driver, CUDA toolkit, caches, Python modules, precision parameter"
  [micro]="1. micro-benchmarks (bench-gpu-micro): NCCL, launch, read, first pass, GEMMs"
  [3b]="2. GRPO step of a Qwen2.5-VL-3B-sized random model"
  [fixtures]="3. fixture parity and kernel checks on CUDA (models/tests/cuda.rs)"
  [default]="4. default graph, 20 steps on cuda"
  [prep]="5. benchmark inputs: model (bench-make-model) and prompts"
  [bench_flowrl]="5. benchmark shape on cuda: flowrl"
  [bench_ref]="5. benchmark shape on cuda: transformers + torch"
  [3b_lora]="6. LoRA GRPO step of the 3B-sized model (rank $RANK3L, all-linear)"
)
budget_sum=0
for s in "${ORDER[@]}"; do
  v="GPU_BUDGET_$s" # e.g. GPU_BUDGET_3b=300 changes one step's budget
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
  local has_cache=0
  grep -q '^cache/' <<< "$TAR_LIST" && has_cache=1
  if [ "$DRY" = 1 ]; then
    echo "  bench/gpu/bin.tar.gz holds: $(grep -v '/$' <<< "$TAR_LIST" | grep -v '^cache/' | tr '\n' ' ')"
    [ "$has_cache" = 1 ] && echo "  and a kernel/autotune cache: $(grep -c '^cache/.*[^/]$' <<< "$TAR_LIST") files under cache/"
    echo "  (a real run unpacks it: tar xzf bench/gpu/bin.tar.gz -C bench/gpu; its cache/ only where bench/gpu/cache does not exist)"
  else
    tar xzf bench/gpu/bin.tar.gz -C bench/gpu --exclude='cache' --exclude='cache/*' || echo "warning: could not unpack bench/gpu/bin.tar.gz"
    # The archive's cache seeds an absent one; a cache already here (an earlier run on this
    # machine) is newer than the archive's copy and is kept.
    if [ "$has_cache" = 1 ] && [ ! -d "$CACHE" ]; then
      tar xzf bench/gpu/bin.tar.gz -C bench/gpu cache || echo "warning: could not unpack the cache of bench/gpu/bin.tar.gz"
    fi
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

# --- the kernel and autotune caches -----------------------------------------------------------
# Entries: compiled kernels (lines of the PTX / SPIR-V tables of contents) and autotune results.
cache_counts() {
  local k=0 a=0 f
  for f in "$CACHE"/cuda/*/ptx/toc.json.log "$CACHE"/vulkan/*/spirv/toc.json.log; do
    [ -f "$f" ] && k=$((k + $(wc -l < "$f")))
  done
  for f in "$CACHE"/autotune/*/*/*.json.log; do
    [ -f "$f" ] && a=$((a + $(wc -l < "$f")))
  done
  echo "$k $a"
}
# The binaries' fingerprint: compiled kernels are only valid for the build that compiled them
# (cubecl keys them by kernel type name, not source).
build_stamp() {
  local b
  for b in "$FLOWRL" "$CUDA_TEST" "$MICRO_BIN"; do
    [ -n "$b" ] && [ -f "$b" ] && sha256sum "$b"
  done | awk '{print $1}' | sha256sum | cut -c1-16
}
CUBECL_TOML_OURS=0
cleanup() {
  [ -n "${MEM_PID:-}" ] && kill "$MEM_PID" 2> /dev/null
  [ -n "${PY_PID:-}" ] && kill "$PY_PID" 2> /dev/null
  if [ "$CUBECL_TOML_OURS" = 1 ] && cmp -s "$root/cubecl.toml" "$root/bench/gpu/cubecl.toml"; then
    rm -f "$root/cubecl.toml"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- one step -------------------------------------------------------------------------------
MEM_PID=""
PY_PID=""
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

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# record ID STATUS RC WALL TIMEOUT PEAK LOG NOTE [CACHE]: one line of steps.tsv.
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "${TITLE[$1]}" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "${9:-}" >> "$OUT/steps.tsv"
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

# run_step ID LOG NOTE CMD...: runs CMD under its timeout with the memory sampler, records it
# with the kernels it compiled into the cache. Sets STEP_RC and STEP_WALL.
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
  local to peak t0 t1 status c0 c1 cache_note cmd=("$@")
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
  read -r -a c0 <<< "$(cache_counts)"
  mem_start "$OUT/$id.mem"
  t0=$(now)
  timeout -k 5 "$to" "${cmd[@]}" >> "$log" 2>&1 < /dev/null
  STEP_RC=$?
  t1=$(now)
  peak=$(mem_stop "$OUT/$id.mem")
  STEP_WALL=$(secs "$t0" "$t1")
  # A process killed while it held a cache file's lock leaves the lock behind, and the next
  # process would wait up to 30 s for it (cubecl-common 0.10.0 src/cache_file.rs).
  find "$CACHE" -name '*.lock' -type f -delete 2> /dev/null
  read -r -a c1 <<< "$(cache_counts)"
  cache_note="+$((c1[0] - c0[0])) kernels compiled (${c1[0]} cached), +$((c1[1] - c0[1])) autotune keys (${c1[1]})"
  case "$STEP_RC" in
    0) status=ok ;;
    124|137) status=TIMEOUT ;;
    *) status=FAILED ;;
  esac
  record "$id" "$status" "$STEP_RC" "$STEP_WALL" "$to" "$peak" "$log" "$note" "$cache_note"
  echo "   $status (rc $STEP_RC) in ${STEP_WALL}s, peak GPU memory ${peak:-?} MiB; $cache_note; elapsed $((SECONDS - T0))s of ${TOTAL}s"
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

# A CUDA step is skipped when the micro step failed on a machine that cannot run this build's
# kernels (driver older than R580 or no toolkit headers; setup says which).
CUDA_SKIP=""
cuda_ok() { # ID: 0 when the step may run
  [ -z "$CUDA_SKIP" ] && return 0
  skip_step "$1" "$CUDA_SKIP"
  return 1
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
  : > "$OUT/micro.jsonl"
fi
unpack_bins
FLOWRL=$(pick_bin "${FLOWRL_BIN:-}" flowrl)
MAKE_MODEL=$(pick_bin "${FLOWRL_MAKE_MODEL_BIN:-}" bench-make-model)
CUDA_TEST=$(pick_test_bin)
MICRO_BIN=$(pick_bin "${FLOWRL_MICRO_BIN:-}" bench-gpu-micro)
need "${FLOWRL:-target/release/flowrl}" "flowrl, built with --features cuda"
need "${MAKE_MODEL:-target/release/bench-make-model}" "bench-make-model, from -p flowrl-bench"
need "${CUDA_TEST:-target/release/deps/cuda-<hash>}" "test executable of models/tests/cuda.rs"
need "${MICRO_BIN:-target/release/bench-gpu-micro}" "bench-gpu-micro, from -p flowrl-bench --features cuda,vulkan"
[ "$DRY" = 1 ] && echo "inputs:"
for f in graphs/grpo_vlm.toml bench/grpo_bench.toml bench/gpu/grpo_3b.toml bench/model_config.json \
  "$model3/config.json" bench/preprocessor_config.json assets/tiny-qwen2-vl/config.json \
  assets/tiny-qwen2-vl/model.safetensors assets/tiny-qwen2-vl/tokenizer.json \
  assets/tiny-qwen2-vl/tokenizer_config.json datasets/shapes/train.parquet datasets/shapes/test.parquet \
  tests/fixtures/models/qwen2_vl tests/fixtures/models/qwen2_5_vl tests/fixtures/models/gemma4 \
  bench/python/make_prompts.py bench/python/ref_rows.py bench/python/common.py \
  bench/gpu/prompts.parquet bench/gpu/prompts.json bench/gpu/summarize.py bench/gpu/cubecl.toml; do
  need "$f" "input"
done

PY=""
for c in ${PYTHON:-} python3 python; do
  command -v "$c" > /dev/null 2>&1 && { PY=$c; break; }
done

# The dry run also checks the graphs the way the run will use them (flowrl validate is cheap),
# and the cubecl configuration and caches.
if [ "$DRY" = 1 ]; then
  echo "tools:"
  for t in timeout nvidia-smi tar awk sha256sum "${PY:-python3}"; do
    if command -v "$t" > /dev/null 2>&1; then echo "  ok       $t"; else echo "  absent   $t$([ "$t" = nvidia-smi ] && echo ' (expected without a GPU: memory is then not sampled)')"; fi
  done
  if [ -n "$PY" ]; then
    echo "  $PY modules here (the GPU machine's are probed in setup): $("$PY" - << 'PYEOF' 2>/dev/null
import importlib.util as u
print(", ".join(f"{m} {'yes' if u.find_spec(m) else 'no'}" for m in ["torch", "transformers", "pyarrow", "PIL", "trl"]))
PYEOF
)"
  fi
  echo "cubecl configuration and caches:"
  if [ -n "$PY" ] && msg=$("$PY" - bench/gpu/cubecl.toml << 'PYEOF' 2>&1
import sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb"))
comp, tune = c["compilation"]["cache"], c["autotune"]["cache"]
assert comp == {"file": "bench/gpu/cache"} and tune == {"file": "bench/gpu/cache"}, (comp, tune)
print(f"[compilation] cache = {comp}, [autotune] cache = {tune}")
PYEOF
  ); then
    echo "  ok       bench/gpu/cubecl.toml: $msg"
  else
    echo "  WARNING  bench/gpu/cubecl.toml does not parse or has other caches: $msg"
  fi
  if [ -e cubecl.toml ] && ! cmp -s cubecl.toml bench/gpu/cubecl.toml; then
    echo "  WARNING  ./cubecl.toml exists and differs from bench/gpu/cubecl.toml: the run would use it as it is"
  else
    echo "  the run copies it to ./cubecl.toml (removed at exit): every process it starts, in the root, uses $CACHE"
  fi
  read -r -a cc <<< "$(cache_counts)"
  if [ -d "$CACHE" ]; then
    echo "  $CACHE here: ${cc[0]} compiled kernels, ${cc[1]} autotune results; stamp $(cat "$CACHE/BUILD" 2> /dev/null || echo none)"
    if [ -f "${FLOWRL:-/nonexistent}" ] || [ -f "${MICRO_BIN:-/nonexistent}" ]; then
      echo "  (the run wipes the compiled kernels unless the stamp is that of the binaries it runs: $(build_stamp))"
    else
      echo "  (the run wipes the compiled kernels unless the stamp is that of the binaries it runs, once unpacked)"
    fi
  else
    echo "  no $CACHE here: the run starts it (pack.sh carries one in bin.tar.gz when bench/gpu/cache holds CUDA entries)"
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
  if [ -n "$MICRO_BIN" ] && [ -x "$MICRO_BIN" ]; then
    if msg=$("$MICRO_BIN" --help 2>&1) && grep -q "built with: cuda" <<< "$msg"; then
      echo "  $MICRO_BIN: $(tail -n 1 <<< "$msg")"
    else
      echo "  WARNING: $MICRO_BIN is built without CUDA ($(tail -n 1 <<< "$msg"); build it with --features cuda,vulkan)"
    fi
  fi
fi

# --- setup ----------------------------------------------------------------------------------
header setup
PREC_KEY=""   # the model resource's precision parameter: precision, dtype, or none
BF16_OK=0
HAVE_TORCH=0 HAVE_TF=0 HAVE_PYARROW=0 HAVE_PIL=0
DRIVER_OLD=0  # the driver is older than R580: CUDA 13's PTX does not load
HEADERS_OK=1  # $CUDA_PATH/include has cuda_bf16.h (cubecl-cuda's NVRTC include path)
SETUP_NOTES=()
if [ "$DRY" = 1 ]; then
  DRY_T=$((DRY_T + BUDGET[setup]))
  echo "  \$ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/env.txt"
  echo "    driver R580+ for CUDA 13 PTX: older, and the CUDA steps are skipped if the micro step then fails"
  echo "  CUDA_PATH: \$CUDA_PATH, /usr/local/cuda, /opt/cuda or /usr (nvcc) as cubecl-cuda looks for it; exported as the"
  echo "    first /usr/local/cuda-13*, /usr/local/cuda-12* with include/cuda_bf16.h when those lack it; checks"
  echo "    include/cuda_bf16.h and include/cuda/ptx (or include/cccl/cuda/ptx); libcuda, NVRTC, NCCL (ldconfig -p, pip nvidia/nccl)"
  echo "  cp bench/gpu/cubecl.toml cubecl.toml; $CACHE/BUILD = sha256 of the binaries (a different one wipes the compiled kernels)"
  echo "  \$ flowrl validate graphs/grpo_vlm.toml --device cuda --set models.policy.{precision,dtype}={bf16,f32}   (which precision parameter the build has)"
  echo "  copy assets/tiny-qwen2-vl/{tokenizer.json,tokenizer_config.json}, chat_template.jinja (from tokenizer_config.json) and bench/preprocessor_config.json into $model3/"
  echo "  (after the micro step, in the background: ${PY:-python3} -c 'import torch, transformers, pyarrow, PIL, trl ...', versions)"
else
  setup_t0=$(now)
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "host: $(uname -srm); cores: $(nproc); memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "== nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv"
    timeout 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "(nvidia-smi failed or absent)"
    echo "== nvidia-smi: $(timeout 10 nvidia-smi 2> /dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
    echo "== nvcc"
    (command -v nvcc > /dev/null && nvcc --version | tail -n 2) || echo "(no nvcc on PATH)"
  } > "$OUT/env.txt" 2>&1
  # CUDA 13's NVRTC emits PTX that drivers before R580 cannot load (cuModuleLoadData fails).
  drv=$(timeout 10 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -1 | tr -d ' ')
  drv_major=${drv%%.*}
  if [[ "$drv_major" =~ ^[0-9]+$ ]] && [ "$drv_major" -lt 580 ]; then
    DRIVER_OLD=1
    SETUP_NOTES+=("driver $drv < R580: CUDA 13 PTX will not load (the CUDA steps are skipped if the micro step fails)")
  fi
  # cubecl-cuda's NVRTC include path: CUDA_PATH, else /usr/local/cuda, /opt/cuda, /usr (with
  # /usr/bin/nvcc); it panics when none exists (cubecl-cuda 0.10.0 src/lib.rs). A toolkit only at
  # /usr/local/cuda-13.0 needs CUDA_PATH.
  cubecl_cuda_path() {
    if [ -n "${CUDA_PATH:-}" ]; then echo "$CUDA_PATH"
    elif [ -e /usr/local/cuda ]; then echo /usr/local/cuda
    elif [ -e /opt/cuda ]; then echo /opt/cuda
    elif [ -e /usr/bin/nvcc ]; then echo /usr
    fi
  }
  cuda_path=$(cubecl_cuda_path)
  if [ -z "$cuda_path" ] || [ ! -f "$cuda_path/include/cuda_bf16.h" ]; then
    for c in /usr/local/cuda-13.0 /usr/local/cuda-13* /usr/local/cuda-12* /opt/cuda-*; do
      if [ -f "$c/include/cuda_bf16.h" ]; then
        export CUDA_PATH=$c
        SETUP_NOTES+=("CUDA_PATH=$c exported (cubecl would have used ${cuda_path:-nothing})")
        cuda_path=$c
        break
      fi
    done
  fi
  ptx_header=""
  for c in "$cuda_path/include/cuda/ptx" "$cuda_path/include/cccl/cuda/ptx"; do
    [ -n "$cuda_path" ] && [ -f "$c" ] && { ptx_header=$c; break; }
  done
  if [ -z "$cuda_path" ] || [ ! -f "$cuda_path/include/cuda_bf16.h" ]; then
    HEADERS_OK=0
    SETUP_NOTES+=("no CUDA toolkit headers (cuda_bf16.h) under ${cuda_path:-any CUDA_PATH}: cubecl cannot compile kernels")
  elif [ -z "$ptx_header" ]; then
    SETUP_NOTES+=("no cuda/ptx header under $cuda_path/include (TMA and pipelined matmul kernels need it)")
  fi
  # cudarc loads libcuda and NVRTC at run time: add the toolkit's library folders if present.
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/targets/x86_64-linux/lib ${cuda_path:+"$cuda_path/lib64"}; do
    [ -d "$d" ] && case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
  done
  # The kernel and autotune caches: bench/gpu/cubecl.toml at the root for this run.
  if [ -e cubecl.toml ] && ! cmp -s cubecl.toml bench/gpu/cubecl.toml; then
    SETUP_NOTES+=("./cubecl.toml differs from bench/gpu/cubecl.toml and is used as it is: the caches are where it says")
  else
    cp bench/gpu/cubecl.toml cubecl.toml && CUBECL_TOML_OURS=1
  fi
  stamp=$(build_stamp)
  read -r -a cc <<< "$(cache_counts)"
  if [ "$(cat "$CACHE/BUILD" 2> /dev/null)" != "$stamp" ] && [ "${cc[0]}" -gt 0 ]; then
    rm -rf "$CACHE/cuda" "$CACHE/vulkan"
    cache_state="${cc[0]} compiled kernels wiped (other binaries: stamp $(cat "$CACHE/BUILD" 2> /dev/null || echo none), now $stamp); ${cc[1]} autotune results kept"
  else
    cache_state="${cc[0]} compiled kernels and ${cc[1]} autotune results at start (stamp $stamp)"
  fi
  mkdir -p "$CACHE" && echo "$stamp" > "$CACHE/BUILD"
  find "$CACHE" -name '*.lock' -type f -delete 2> /dev/null
  {
    echo "== driver: ${drv:-?} (R580+ needed for CUDA 13 PTX: $(if [ -z "$drv" ]; then echo unknown; elif [ "$DRIVER_OLD" = 1 ]; then echo NO; else echo yes; fi))"
    echo "== CUDA toolkit for NVRTC: CUDA_PATH=${CUDA_PATH:-(unset)}; cubecl uses ${cuda_path:-(none: it panics)}"
    for h in cuda_bf16.h cuda_fp16.h cuda_runtime.h; do
      [ -n "$cuda_path" ] && [ -f "$cuda_path/include/$h" ] && echo "  $cuda_path/include/$h" || echo "  (no $h)"
    done
    echo "  cuda/ptx: ${ptx_header:-(absent)}"
    ls -d /usr/local/cuda* 2> /dev/null | tr '\n' ' '; echo
    echo "== libraries (ldconfig -p | grep -E 'libcuda.so|libnvrtc|nccl')"
    ldconfig -p 2> /dev/null | grep -E 'libcuda\.so|libnvrtc|nccl' | head -n 12
    ls /usr/local/cuda*/lib64/libnvrtc.so* 2> /dev/null | head -n 4
    if [ -n "$PY" ]; then
      echo "pip nvidia/nccl: $(timeout 10 "$PY" -c 'import glob, importlib.util as u; s = u.find_spec("nvidia.nccl"); ds = list(s.submodule_search_locations) if s else []; print(" ".join(ds + sorted(f for d in ds for f in glob.glob(d + "/lib/libnccl*"))) or "(no nvidia.nccl)")' 2>&1 | tail -n 1)"
    fi
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-(unset: balanced)}"
    echo "== cubecl caches: ./cubecl.toml ($([ "$CUBECL_TOML_OURS" = 1 ] && echo "bench/gpu/cubecl.toml, for this run" || echo "not bench/gpu/cubecl.toml: used as it is")) -> $CACHE: $cache_state"
    echo "== binaries"
    for b in "$FLOWRL" "$MAKE_MODEL" "$CUDA_TEST" "$MICRO_BIN"; do [ -n "$b" ] && ls -l "$b"; done
    [ -f bench/gpu/bin/BUILD_INFO ] && { echo "== bench/gpu/bin/BUILD_INFO"; cat bench/gpu/bin/BUILD_INFO; }
    echo "== setup notes"
    printf '%s\n' "${SETUP_NOTES[@]}"
  } >> "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
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
  setup_note="precision parameter ${PREC_KEY:-none}, bf16 ${BF16_OK}; driver ${drv:-?}; CUDA_PATH ${cuda_path:-none}"
  [ "${#SETUP_NOTES[@]}" -gt 0 ] && setup_note+="; $(printf '%s; ' "${SETUP_NOTES[@]}")"
  record setup ok 0 "$(secs "$setup_t0" "$(now)")" "${BUDGET[setup]}" "" "$OUT/env.txt" "${setup_note%; }" "$cache_state"
fi

# The Python probe (versions of torch, transformers, ...; importing torch takes seconds) runs in
# the background from after the micro step; py_wait collects it before the first step that
# needs it.
py_start() {
  [ "$DRY" = 0 ] || return 0
  if [ -z "$PY" ]; then
    echo '{"python": null}' > "$OUT/python.json"
    return 0
  fi
  timeout 60 "$PY" - > "$OUT/python.json" 2> "$OUT/python.log" << 'PYEOF' &
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
    # (no device query: it would create a CUDA context next to the running step)
    out["cuda_available"] = torch.cuda.is_available()
print(json.dumps(out))
PYEOF
  PY_PID=$!
}
py_wait() {
  [ "$DRY" = 0 ] || return 0
  if [ -n "$PY_PID" ]; then
    wait "$PY_PID" 2> /dev/null
    PY_PID=""
  fi
  echo "python: $(cat "$OUT/python.json" 2> /dev/null)"
  grep -q '"torch": "' "$OUT/python.json" 2> /dev/null && HAVE_TORCH=1
  grep -q '"transformers": "' "$OUT/python.json" 2> /dev/null && HAVE_TF=1
  grep -q '"pyarrow": "' "$OUT/python.json" 2> /dev/null && HAVE_PYARROW=1
  grep -q '"PIL": "' "$OUT/python.json" 2> /dev/null && HAVE_PIL=1
  return 0
}

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

# --- 1. micro-benchmarks ----------------------------------------------------------------------
header micro
if [ -n "$MICRO_BIN" ] || [ "$DRY" = 1 ]; then
  micro_to=$(step_timeout micro)
  [ "$DRY" = 1 ] && micro_to=${BUDGET[micro]}
  # bench-gpu-micro starts no new measurement after this; a quarter of the timeout is left for
  # the one in flight (a new autotune key of a large GEMM can take seconds).
  MICRO_BUDGET=$((micro_to * 3 / 4))
  run_step micro "$OUT/micro.log" "launch, read, elementwise, first pass of a 2-layer slice of the 3B, bf16 GEMMs at the 3B's shapes (M 4096, 512, 26624); measurements started within ${MICRO_BUDGET}s" \
    env RAYON_NUM_THREADS="$THREADS" "${MICRO_BIN:-target/release/bench-gpu-micro}" --device cuda \
    --budget-s "$MICRO_BUDGET" --jsonl "$OUT/micro.jsonl" "${MICRO_ARGS[@]}"
  # A failure (not a timeout) on a machine whose driver or toolkit setup flagged: the CUDA steps
  # would all fail the same way, so they are skipped and the time is left to the rest.
  if [ "$DRY" = 0 ] && [ "$STEP_RC" != 0 ] && [ "$STEP_RC" != 124 ] && [ "$STEP_RC" != 137 ] &&
    [ "$STEP_RC" != 999 ] && { [ "$DRIVER_OLD" = 1 ] || [ "$HEADERS_OK" = 0 ]; }; then
    if [ "$DRIVER_OLD" = 1 ]; then
      CUDA_SKIP="the micro step failed (rc $STEP_RC) and the driver ($drv) is older than R580, which CUDA 13 PTX needs (a build with CUDARC_CUDA_VERSION=12080 may run)"
    else
      CUDA_SKIP="the micro step failed (rc $STEP_RC) and no CUDA toolkit headers were found (set CUDA_PATH)"
    fi
    echo "   $CUDA_SKIP: the other CUDA steps are skipped"
  fi
  [ "$DRY" = 1 ] && echo "    (bench-gpu-micro --budget-s is 3/4 of the step's timeout; records go to micro.jsonl as they are measured)"
else
  skip_step micro "no bench-gpu-micro binary (FLOWRL_MICRO_BIN, bench/gpu/bin/bench-gpu-micro, target/release/bench-gpu-micro)"
fi
py_start

# --- 2. Qwen2.5-VL-3B-sized random model -------------------------------------------------------
header 3b
SIZES3="$P3 prompts x n $N3, $NEW3 new tokens, micro-batch $MICRO3, $STEPS3 steps"
# Both 3B steps read the same prompts: the shipped 8 rows of bench/gpu/prompts.parquet (the
# benchmark's first 8, made with make_prompts.py ... 8 224), or for more than 8 prompts
# bench/work/prompts.parquet, which prep makes (so only on a second run).
data3=(--set nodes.data.path=bench/gpu/prompts.parquet)
[ "$P3" -gt 8 ] && data3=(--set "nodes.data.path=$work/prompts.parquet")
run3() { # STEP_ID STEPS OUT_DIR LOG NOTE SET...: flowrl run bench/gpu/grpo_3b.toml at SIZE3_SET
  local id=$1 steps=$2 dir=$3 log=$4 note=$5
  shift 5
  run_step "$id" "$log" "$note" \
    env RAYON_NUM_THREADS="$THREADS" "${FLOWRL:-target/release/flowrl}" run bench/gpu/grpo_3b.toml \
    --device cuda --out "$dir" --force --steps "$steps" "${SIZE3_SET[@]}" "${data3[@]}" "$@"
}
retry=0
if { [ -n "$FLOWRL" ] || [ "$DRY" = 1 ]; } && cuda_ok 3b; then
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
elif [ -z "$FLOWRL" ]; then
  skip_step 3b "no flowrl binary"
fi

# --- 3. fixture parity and kernel checks ------------------------------------------------------
header fixtures
if [ -n "$CUDA_TEST" ] || [ "$DRY" = 1 ]; then
  cuda_ok fixtures && run_step fixtures "$OUT/fixtures.log" "f32 parity against transformers at TF32 tolerances; flowrl's kernels against their composites" \
    env FLOWRL_MODEL_FIXTURES="$root/tests/fixtures/models" RUST_BACKTRACE=1 \
    "${CUDA_TEST:-target/release/deps/cuda-HASH}" --test-threads 1
else
  skip_step fixtures "no test executable of models/tests/cuda.rs (FLOWRL_CUDA_TEST_BIN, bench/gpu/bin/cuda-test, target/release/deps/cuda-*)"
fi

# --- 4. default graph -----------------------------------------------------------------------
header default
if [ -n "$FLOWRL" ] || [ "$DRY" = 1 ]; then
  cuda_ok default && run_step default "$OUT/default_cuda.log" "$PREC_NOTE" \
    env RAYON_NUM_THREADS="$THREADS" "${FLOWRL:-target/release/flowrl}" run graphs/grpo_vlm.toml \
    --device cuda --steps 20 --out "$OUT/default_cuda" --force "${PREC_SET[@]}"
else
  skip_step default "no flowrl binary"
fi

# --- 5. benchmark shape -----------------------------------------------------------------------
header prep
py_wait
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
  prep_to() { local t; t=$(step_timeout prep); [ "$t" -lt 5 ] && t=5; echo "$t"; }
  {
    if [ ! -f "$work/model/model.safetensors" ]; then
      if [ -n "$MAKE_MODEL" ]; then
        echo "\$ $MAKE_MODEL bench/model_config.json $work/model 0"
        timeout "$(prep_to)" "$MAKE_MODEL" bench/model_config.json "$work/model" 0
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
      timeout "$(prep_to)" "$PY" bench/python/make_prompts.py datasets/shapes/train.parquet "$work/prompts.parquet" "$max_p" 224; then
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
  cuda_ok bench_flowrl && run_step bench_flowrl "$OUT/bench_flowrl.log" "$BENCH_SIZES; $PREC_NOTE" \
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

# --- 6. the 3B model with LoRA and an adapters-off reference ----------------------------------
# The same graph, sizes, prompts and seed (random weights) as step 2, plus LORA3_SET. The base
# weights are frozen in bf16, so only the adapters have gradients and AdamW moments. The
# reference `from = "policy"` runs the policy's modules with the adapters off. As the last step
# it gets all the time left.
header 3b_lora
SIZES3L="$P3 prompts x n $N3, $NEW3 new tokens, micro-batch $MICRO3, $STEPS3L steps"
if [ "$REF3L" = 1 ]; then
  LORA3_NOTE="LoRA rank $RANK3L alpha $ALPHA3L all-linear, lr 3e-3; reference from policy (adapters off), low_var_kl 0.001"
else
  LORA3_NOTE="LoRA rank $RANK3L alpha $ALPHA3L all-linear, lr 3e-3; no reference (GPU_3B_LORA_REF=0)"
fi
if { [ -n "$FLOWRL" ] || [ "$DRY" = 1 ]; } && cuda_ok 3b_lora; then
  # bf16, unless setup found no bf16 or step 2's bf16 attempt was refused (then f32, as step 2).
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
  [ "$DRY" = 1 ] && echo "    (bf16 unless setup or step 2 found none; reported like step 2, plus timing_s/ref and actor/kl_loss)"
elif [ -z "$FLOWRL" ]; then
  skip_step 3b_lora "no flowrl binary"
fi

# --- the table and the caches -----------------------------------------------------------------
if [ "$DRY" = 1 ]; then
  echo
  echo "[summary] \$ ${PY:-python3} bench/gpu/summarize.py $OUT   -> $OUT/gpu.md (commit as bench/results/gpu.md)"
  echo "          and $CACHE -> $OUT/cubecl-cache.tar.gz, its CUDA autotune results -> $OUT/autotune/"
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

# The caches come back with $OUT: the CUDA autotune results as they are (summarize.py lists the
# matmul picks), and the whole cache as an archive for the next run (pack.sh carries it).
CACHE_NOTE=""
if [ -d "$CACHE" ]; then
  mkdir -p "$OUT/autotune"
  for d in "$CACHE"/autotune/*/device-*cuda*; do
    [ -d "$d" ] && cp -r "$d" "$OUT/autotune/"
  done
  tar -cf - -C bench/gpu cache 2> /dev/null | gzip -1 > "$OUT/cubecl-cache.tar.gz"
  size=$(stat -c %s "$OUT/cubecl-cache.tar.gz" 2> /dev/null || echo 0)
  if [ "$size" -gt $((100 * 1048576)) ]; then
    rm -f "$OUT/cubecl-cache.tar.gz"
    CACHE_NOTE="cache archive over 100 MiB ($((size / 1048576)) MiB): not kept"
  else
    CACHE_NOTE="cubecl-cache.tar.gz: $((size / 1048576)) MiB"
  fi
fi
read -r -a cc <<< "$(cache_counts)"
{
  echo "P=$P"; echo "N=$N"; echo "NEW=$NEW"; echo "MICRO=$MICRO"; echo "MICRO_USED=$m"; echo "REPS=$REPS"
  echo "THREADS=$THREADS"; echo "PREC=$PREC"; echo "PREC_KEY=$PREC_KEY"; echo "BF16_OK=$BF16_OK"
  echo "TORCH_DTYPE=$TORCH_DTYPE"; echo "P3=$P3"; echo "N3=$N3"; echo "NEW3=$NEW3"; echo "STEPS3=$STEPS3"
  echo "MICRO3=$MICRO3"; echo "STEPS3L=$STEPS3L"; echo "RANK3L=$RANK3L"; echo "ALPHA3L=$ALPHA3L"; echo "REF3L=$REF3L"
  echo "PREC3L=${PREC3L:-}"; echo "TOTAL=$TOTAL"; echo "ELAPSED=$((SECONDS - T0))"; echo "REF_PROMPTS=$REF_PROMPTS"
  echo "MICRO_BUDGET=${MICRO_BUDGET:-}"; echo "CUDA_SKIP=$CUDA_SKIP"; echo "DRIVER_OLD=$DRIVER_OLD"; echo "HEADERS_OK=$HEADERS_OK"
  echo "CACHE_KERNELS=${cc[0]}"; echo "CACHE_AUTOTUNE=${cc[1]}"; echo "CACHE_NOTE=$CACHE_NOTE"
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
    echo "| step | status | rc | wall (s) | timeout (s) | peak GPU MiB | note | kernel cache |"
    echo "|---|---|---:|---:|---:|---:|---|---|"
    while IFS=$'\t' read -r id title status rc wall to peak log note cache; do
      echo "| $title | $status | $rc | $wall | $to | $peak | $note | $cache |"
    done < "$OUT/steps.tsv"
    echo
    echo '```'
    cat "$OUT/micro.jsonl" 2> /dev/null
    echo '```'
  } > "$OUT/gpu.md"
  echo "== wrote $OUT/gpu.md (steps only)"
fi
cat "$OUT/gpu.md"
echo "== done in $((SECONDS - T0))s of ${TOTAL}s"
