"""Writes OUT/gpu.md from what bench/gpu/check.sh left in OUT (steps.tsv, env.txt, python.json,
settings.txt, micro.jsonl, autotune/, the logs, the run directories' metrics.jsonl and ref.json).
Standard library only: it runs on the GPU machine whatever Python packages are there.

usage: summarize.py OUT_DIR
"""

import json
import os
import re
import statistics
import sys

TAIL = 30  # log lines shown for a step that did not succeed


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def metrics(run_dir):
    rows = []
    for line in read(os.path.join(run_dir, "metrics.jsonl")).splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a timeout
    # The training steps: step 0 is the evaluation before training.
    return [r for r in rows if r.get("step") != 0]


def steps_tsv(out):
    steps = []
    for line in read(os.path.join(out, "steps.tsv")).splitlines():
        f = line.split("\t")
        if len(f) < 10:
            f += [""] * (10 - len(f))
        steps.append(dict(zip(["id", "title", "status", "rc", "wall", "timeout", "peak", "log", "note", "cache"], f)))
    return steps


def settings(out):
    s = {}
    for line in read(os.path.join(out, "settings.txt")).splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            s[k] = v
    return s


def peak_rss_mib(out, step_id):
    """`/usr/bin/time -f "%M %e"` of a step, when the machine has it."""
    lines = [ln for ln in read(os.path.join(out, f"{step_id}.time")).splitlines() if ln.strip()]
    if not lines:
        return ""
    try:
        return f"{int(lines[-1].split()[0]) / 1024:.0f}"
    except (ValueError, IndexError):
        return ""


def mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and x != x):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def series(rows, key):
    return [r[key] for r in rows if key in r]


def tail(path, n=TAIL):
    lines = read(path).splitlines()
    return "\n".join(lines[-n:]) if lines else "(empty log)"


def steady(rows):
    """The steps after the first (warm-up: kernel compilation, autotuning), when there are several."""
    return rows[1:] if len(rows) > 1 else rows


def fixture_section(out, step):
    log = read(os.path.join(out, "fixtures.log"))
    tests = re.findall(r"^test (\S+) \.\.\. (ok|FAILED|ignored)", log, re.M)
    result = re.findall(r"^test result: .*$", log, re.M)
    lines = ["## 3. Fixture parity and kernel checks on CUDA (`models/tests/cuda.rs`, `--test-threads 1`)", ""]
    if not step:
        return lines + ["not run", ""], "not run"
    summary = result[-1].replace("test result: ", "") if result else "no libtest summary line"
    lines += [
        "f32 parity at TF32 tolerances (cubek runs f32 matmuls as TF32 on tensor cores): forward tensors within "
        "1e-2 of max(1, max |e|), gradients within 2e-2 of max |e|, Gemma 4's case tolerances widened to the same "
        "rule, greedy tokens exact; flowrl's kernels at kernel_checks.rs's f32 tolerances. Tests run in name order, "
        "so a timeout cuts the last ones (`qwen_*`).",
        "",
        f"{summary}",
        "",
    ]
    if tests:
        lines += ["| test | result |", "|---|---|"] + [f"| `{t}` | {r} |" for t, r in tests] + [""]
    passed = sum(1 for _, r in tests if r == "ok")
    failed = sum(1 for _, r in tests if r == "FAILED")
    short = f"{passed} passed, {failed} failed" if tests else summary
    return lines, short


# The performance model's assumptions (shared/research/gpu_path.md) the micro-benchmarks test.
ASSUMED_TFLOPS = (150.0, 350.0)  # large bf16 GEMMs through burn/cubecl (§1.6)
ASSUMED_LAUNCH_US = (5.0, 10.0)  # the 11-22 ms launch floor of ~2,200 launches per decode step (§1.7)
ASSUMED_EW_GBS = (2500.0, 3500.0)  # unfused elementwise kernels (§ Hardware)


def against(x, band):
    lo, hi = band
    if x != x:
        return ""
    return "below" if x < lo else "above" if x > hi else "within"


def micro_records(out):
    recs = []
    for line in read(os.path.join(out, "micro.jsonl")).splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return recs


def matmul_key(key):
    """`m×n×k dtype, lhs / rhs layout, kind` of a MatmulAutotuneKey (JSON as the cache holds it)."""
    d = key.get("definition") if isinstance(key, dict) else None
    if not isinstance(d, dict):
        return json.dumps(key, separators=(",", ":"))[:160]

    def elem(e):
        while isinstance(e, dict) and len(e) == 1:
            e = next(iter(e.values()))
        return str(e).lower()

    def layout(x):
        if isinstance(x, dict):
            name, v = next(iter(x.items()))
            return f"{name}{'ᵀ' if isinstance(v, dict) and v.get('transposed') else ''}"
        return str(x)

    kind = key.get("analysis", {}).get("kind", "")
    return (
        f"{d.get('m')}×{d.get('n')}×{d.get('k')} {elem(d.get('elem_lhs'))}/{elem(d.get('elem_out'))}, "
        f"{layout(d.get('matrix_layout_lhs'))} · {layout(d.get('matrix_layout_rhs'))}{', ' + kind if kind else ''}"
    )


def autotune_picks(out, limit=40):
    """The matmul autotune results check.sh copied from the cache (OUT/autotune/<device>/...): per key,
    the kernel autotune picked and its median time."""
    rows = []
    base = os.path.join(out, "autotune")
    for dirpath, _, files in sorted(os.walk(base)):
        for name in sorted(files):
            if "matmul" not in name or not name.endswith(".json.log"):
                continue
            for line in read(os.path.join(dirpath, name)).splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                value = entry.get("value", {})
                fastest = value.get("fastest_index")
                pick, median, n = "?", float("nan"), 0
                for res in value.get("results", []):
                    ok = res.get("outcome", {}).get("Ok")
                    if not ok:
                        continue
                    n += 1
                    if ok.get("index") == fastest:
                        pick = ok.get("name", "?")
                        med = ok.get("computation", {}).get("median", {})
                        median = med.get("secs", 0) + med.get("nanos", 0) / 1e9
                k = entry.get("key", {}).get("key", {})
                d = k.get("definition", {}) if isinstance(k, dict) else {}
                size = 1
                for dim in ("m", "n", "k"):
                    size *= d.get(dim, 1) if isinstance(d.get(dim), int) else 1
                rows.append((size, matmul_key(k), pick, median, n))
    rows.sort(key=lambda r: -r[0])  # the largest products first
    return [r[1:] for r in rows[:limit]], len(rows)


def micro_section(out, step):
    recs = micro_records(out)
    lines = ["## 1. Micro-benchmarks (`bench-gpu-micro`, bench/src/gpu_micro.rs)", ""]
    if not step:
        return lines + ["not run", ""], "not run"
    if not recs:
        return lines + ["no records (see the step's log below)", ""], "no records"
    info = next((r for r in recs if r.get("bench") == "info"), {})
    lines += [
        f"{step['note']}. Device init {fmt(info.get('device_init_s'))} s; autotune level {info.get('autotune_level', '?')}; "
        f"compilation cache {info.get('compilation_cache', '?')}; autotune cache {info.get('autotune_cache', '?')}.",
        "",
    ]
    gemms = [r for r in recs if r.get("bench") == "gemm"]
    if gemms:
        lines += [
            f"GEMMs `x · Wᵀ` (`W` `[N, K]`, as `layers::Linear`), {gemms[0].get('dtype')} in and out. The performance model "
            f"assumes {ASSUMED_TFLOPS[0]:.0f}–{ASSUMED_TFLOPS[1]:.0f} TFLOP/s on large bf16 GEMMs (gpu_path.md §1.6). "
            "First call: kernel compilation and autotune of a new key (less when the caches or an earlier shape had them).",
            "",
            "| M | N × K | layer | TFLOP/s | steady ms | reps | first call (s) | vs assumed |",
            "|---:|---|---|---:|---:|---:|---:|---|",
        ]
        for r in gemms:
            t = r.get("tflops", float("nan"))
            lines.append(
                f"| {r.get('m')} | {r.get('n')} × {r.get('k')} | {r.get('what', '')} | {fmt(t, 1)} | {fmt(r.get('ms'), 3)} "
                f"| {r.get('reps')} | {fmt(r.get('first_s'), 2)} | {against(t, ASSUMED_TFLOPS)} |"
            )
        lines.append("")
    other = ["| measurement | value | assumed |", "|---|---:|---|"]
    for r in recs:
        b = r.get("bench")
        if b == "launch":
            us = r.get("us_per_launch", float("nan"))
            other.append(
                f"| µs per kernel launch ({r.get('n')} `add_scalar`s, synced; host issue alone {fmt(r.get('issue_us_per_launch'), 2)} µs) "
                f"| {fmt(us, 2)} | {ASSUMED_LAUNCH_US[0]:.0f}–{ASSUMED_LAUNCH_US[1]:.0f} µs: {against(us, ASSUMED_LAUNCH_US)} |"
            )
        elif b == "read":
            other.append(
                f"| device → host read, {r.get('label')} ({r.get('mb')} MB; ms {r.get('ms')}): GB/s | {fmt(r.get('gb_s'), 2)} | |"
            )
        elif b == "elementwise":
            g = r.get("gb_s", float("nan"))
            other.append(
                f"| elementwise add, {r.get('kind')} ({r.get('mb')} MB tensors, {fmt(r.get('us'), 1)} µs): GB/s | {fmt(g, 0)} "
                f"| {ASSUMED_EW_GBS[0]:.0f}–{ASSUMED_EW_GBS[1]:.0f} GB/s: {against(g, ASSUMED_EW_GBS)} |"
            )
        elif b == "first_pass" and r.get("phase") == "error":
            other.append(f"| first pass | error: {str(r.get('error'))[:300]} | |")
        elif b == "first_pass" and r.get("phase") == "build":
            other.append(
                f"| first pass of {r.get('model')} ({r.get('params')} params, {r.get('precision')}, {r.get('rows')} rows, "
                f"{r.get('tokens')} tokens): build with random weights (s) | {fmt(r.get('s'), 2)} | |"
            )
        elif b == "first_pass":
            other.append(f"| … {r.get('phase')} under autodiff (s) | {fmt(r.get('s'), 2)} | |")
        elif b == "skipped":
            other.append(f"| {r.get('what')} | skipped: {r.get('reason')} | |")
    phase = {r.get("phase"): r.get("s") for r in recs if r.get("bench") == "first_pass"}
    for what, first, second in [("forward", "forward 1", "forward 2"), ("forward + backward", "forward+backward 1", "forward+backward 2")]:
        if phase.get(first) is not None and phase.get(second) is not None:
            other.append(
                f"| … {what}: compile + autotune ≈ first − second (s) | {fmt(phase[first] - phase[second], 2)} | "
                "cold only on a run that started with an empty cache |"
            )
    if len(other) > 2:
        lines += other + [""]
    picks, total = autotune_picks(out)
    if picks:
        lines += [
            f"Autotune's matmul picks (the {len(picks)} largest of {total} keys in the cache after the run, all steps; "
            "`OUT/autotune/`):",
            "",
            "| key (m×n×k, dtypes, layouts) | pick | median | candidates |",
            "|---|---|---:|---:|",
        ]
        for key, pick, med, n in picks:
            lines.append(f"| {key} | {pick} | {fmt(med * 1e3, 3)} ms | {n} |")
        lines.append("")
    best = max((r.get("tflops", 0) for r in gemms), default=None)
    launch = next((r for r in recs if r.get("bench") == "launch"), None)
    short = ", ".join(
        x
        for x in [
            f"GEMM up to {fmt(best, 0)} TFLOP/s ({len(gemms)} shapes)" if gemms else "",
            f"{fmt(launch.get('us_per_launch'), 1)} µs/launch" if launch else "",
            f"{sum(1 for r in recs if r.get('bench') == 'skipped')} skipped" if any(r.get("bench") == "skipped" for r in recs) else "",
        ]
        if x
    )
    return lines, short or "no measurement finished"


def default_section(out, step):
    rows = metrics(os.path.join(out, "default_cuda"))
    lines = ["## 4. Default graph on CUDA (`graphs/grpo_vlm.toml --device cuda --steps 20`)", ""]
    if not rows:
        return lines + ["no metrics (see the step's log below)", ""], "no metrics"
    timed = [r for r in rows if r.get("step", 0) >= 2]
    score = series(rows, "critic/score/mean")
    acc = series(rows, "critic/score/acc/mean")
    s_per_step = mean(series(timed, "timing_s/step"))
    lines += [
        f"{step['note'] if step else ''}; CPU reference (README): 100 steps in 47 s on 2 CPU cores, "
        "`critic/score/mean` 0.288 over the first 20 steps, 0.381 over the last 20.",
        "",
        "| metric | value |",
        "|---|---:|",
        f"| steps finished | {len(rows)} of 20 |",
        f"| s/step, mean over steps 2..{rows[-1].get('step', len(rows))} (`timing_s/step`) | {fmt(s_per_step)} |",
    ]
    for key in ["gen", "old_log_prob", "ref", "update_actor", "eval"]:
        xs = series(timed, f"timing_s/{key}")
        if xs:
            lines.append(f"| `timing_s/{key}`, mean over steps 2.. | {fmt(mean(xs))} |")
    lines += [
        f"| `critic/score/mean`, first 5 steps | {fmt(mean(score[:5]))} |",
        f"| `critic/score/mean`, last 5 steps | {fmt(mean(score[-5:]))} |",
        f"| `critic/score/acc/mean`, first 5 / last 5 steps | {fmt(mean(acc[:5]))} / {fmt(mean(acc[-5:]))} |",
    ]
    for r in rows:
        if "val/score" in r:
            lines.append(f"| `val/score` at step {r.get('step')} | {fmt(r['val/score'], 4)} |")
    lines.append("")
    short = f"{len(rows)} steps, {fmt(s_per_step)} s/step, score {fmt(mean(score[:5]))} → {fmt(mean(score[-5:]))}"
    return lines, short


def bench_section(out, st, flowrl_step, ref_step):
    rows = metrics(os.path.join(out, "bench_flowrl"))
    ref = {}
    try:
        ref = json.loads(read(os.path.join(out, "bench_ref", "ref.json"), "{}"))
    except json.JSONDecodeError:
        pass
    med = ref.get("median", {})
    used = steady(rows)

    def fl(key):
        return median(series(used, f"timing_s/{key}"))

    lines = ["## 5. Benchmark shape on CUDA (`bench/model_config.json`, as `bench/run.sh`)", ""]
    p, n, new = st.get("P", "?"), st.get("N", "?"), st.get("NEW", "?")
    rows_n = int(p) * int(n) if p.isdigit() and n.isdigit() else "?"
    lines += [
        f"- workload: {p} prompts × n = {n} ({rows_n} sequences), {new} new tokens, "
        f"micro-batches of {st.get('MICRO_USED', '?')}; prompt ≈ {fmt(median(series(used, 'prompt_length/mean')), 1)} "
        f"tokens, mean response length {fmt(median(series(used, 'response_length/mean')), 1)} (flowrl)",
        f"- flowrl: {len(rows)} steps finished, medians over the {len(used)} after the first; "
        f"{flowrl_step['note'] if flowrl_step else 'not run'}",
        f"- transformers + torch (`bench/python/ref_rows.py --device cuda --dtype {st.get('TORCH_DTYPE', '?')}`): "
        + (f"medians of {len(ref.get('rollout_s', [])) - 1 or 1} repetitions after a warm-up" if ref else "no result"),
        "- row 4's reference, TRL's `GRPOTrainer`, is not run: TRL is not installed on the GPU machine",
        "",
        "| row | flowrl (s) | transformers + torch (s) | transformers / flowrl |",
        "|---|---:|---:|---:|",
    ]

    def row(name, ours, theirs):
        ratio = theirs / ours if (ours == ours and theirs == theirs and ours > 0) else float("nan")
        return f"| {name} | {fmt(ours, 2)} | {fmt(theirs, 2)} | {fmt(ratio, 2)}{'×' if ratio == ratio else ''} |"

    nan = float("nan")
    lines += [
        row("(1) rollout: prefill + decode (`timing_s/gen` / `generate`)", fl("gen"), med.get("rollout_s", nan)),
        row("(2) log-prob pass (`timing_s/old_log_prob` / no-grad forward)", fl("old_log_prob"), med.get("logprob_s", nan)),
        row("(3) one PPO update step (`timing_s/update_actor` / forward+backward+AdamW)", fl("update_actor"), med.get("update_s", nan)),
        f"| (4) full GRPO step (`timing_s/step`) | {fmt(fl('step'), 2)} | TRL not installed: not run | |",
        "",
    ]
    peaks = (flowrl_step or {}).get("peak", ""), (ref_step or {}).get("peak", "")
    lines += [
        "| peak memory | flowrl | transformers + torch |",
        "|---|---:|---:|",
        f"| GPU memory used, sampled by nvidia-smi every 0.5 s (MiB) | {peaks[0] or '–'} | {peaks[1] or '–'} |",
        f"| torch peak allocated (MiB) | | {fmt(ref.get('peak_cuda_mib'), 0)} |",
        f"| host RSS (MiB) | {peak_rss_mib(out, 'bench_flowrl') or '–'} | {peak_rss_mib(out, 'bench_ref') or '–'} |",
        "",
    ]
    short = f"flowrl step {fmt(fl('step'), 2)} s" + (
        f"; rollout {fmt(fl('gen'), 2)} vs {fmt(med.get('rollout_s', nan), 2)} s (transformers)" if ref else ""
    )
    return lines, short


def rate(tokens, secs):
    return tokens / secs if secs and secs == secs and secs > 0 else float("nan")


def run3_table(out, st, rows, last, step_id, steps_run):
    """The table of a 3B run (steps 4 and 5): its last finished step's rates, the wall time and
    the peak memory. Returns the lines and the numbers the short line and step 6 use."""
    r = rows[-1]
    n_rows = int(st.get("P3", 0) or 0) * int(st.get("N3", 0) or 0)
    resp = r.get("response_length/mean", float("nan"))
    prompt = r.get("prompt_length/mean", float("nan"))
    gen = r.get("timing_s/gen", float("nan"))
    upd = r.get("timing_s/update_actor", float("nan"))
    gen_tokens = n_rows * resp
    total_steps = sum(series(rows, "timing_s/step"))
    wall = float(last["wall"]) if last["wall"] else float("nan")
    lines = [
        "| metric | value |",
        "|---|---:|",
        f"| step reported | {r.get('step')} of {steps_run} run ({'the first: includes kernel compilation and autotuning' if r.get('step') == 1 else 'after a warm-up step'}) |",
        f"| sequences | {n_rows} (prompt {fmt(prompt, 1)} tokens, response {fmt(resp, 1)} tokens, means) |",
        f"| rollout `timing_s/gen` (s) | {fmt(gen, 2)} |",
        f"| generated tokens/s (sequences × mean response length / gen) | {fmt(rate(gen_tokens, gen), 1)} |",
    ]
    if "timing_s/ref" in r:
        lines.append(f"| reference log-probs `timing_s/ref` (s) | {fmt(r['timing_s/ref'], 2)} |")
    lines += [
        f"| update `timing_s/update_actor` (s) | {fmt(upd, 2)} |",
        f"| trained tokens/s: response (loss) tokens / update | {fmt(rate(gen_tokens, upd), 1)} |",
        f"| trained tokens/s: prompt + response tokens / update | {fmt(rate(n_rows * (prompt + resp), upd), 1)} |",
        f"| `timing_s/step` (s) | {fmt(r.get('timing_s/step'), 2)} |",
        f"| process wall time (s), incl. drawing the weights on the host and moving them | {fmt(wall, 1)} (steps: {fmt(total_steps, 1)}) |",
        f"| peak GPU memory used (MiB, nvidia-smi every 0.5 s) | {last['peak'] or '–'} |",
        f"| peak host RSS (MiB) | {peak_rss_mib(out, step_id) or '–'} |",
    ]
    nums = {"gen_rate": rate(gen_tokens, gen), "upd_rate": rate(gen_tokens, upd), "upd": upd, "gen": gen}
    return lines, nums


def qwen3b_result(out, st, steps):
    """Step 2's attempts, run directory, precision and rows."""
    attempts = [s for s in steps if s["id"] == "3b"]
    if not attempts:
        return None
    precision = "bf16" if len(attempts) == 1 else "f32"
    if not st.get("PREC_KEY") and len(attempts) > 1:
        precision = "the build's default precision (no precision parameter)"
    run_dir = os.path.join(out, "3b_f32" if len(attempts) > 1 else "3b")
    return {"attempts": attempts, "last": attempts[-1], "precision": precision, "rows": metrics(run_dir)}


def qwen3b_section(out, st, steps):
    res = qwen3b_result(out, st, steps)
    lines = ["## 2. GRPO steps of a Qwen2.5-VL-3B-sized random model (`bench/gpu/grpo_3b.toml`)", ""]
    if not res:
        return lines + ["not run", ""], "not run"
    attempts, last, precision, rows = res["attempts"], res["last"], res["precision"], res["rows"]
    if last["status"] == "SKIPPED" and not rows:
        return lines + [f"not run: {last['note']}", ""], "not run"
    why = ""
    if len(attempts) > 1:
        said = [ln for ln in read(attempts[0]["log"]).splitlines()[2:] if ln.strip()]
        why = f" (the bf16 attempt exited {attempts[0]['rc']}: `{said[0].strip() if said else 'no output'}`)"
    lines += [
        "Qwen2.5-VL-3B-Instruct's architecture (`bench/gpu/qwen2_5_vl_3b/config.json`: text 36 layers, hidden 2048, "
        "MLP 11008, 16 heads / 2 KV heads, vocab 151936, tied embeddings; vision 32 blocks, width 1280, window "
        "attention with full attention in blocks 7/15/23/31): 3.75 B parameters (text 3.09 B, vision 0.67 B), "
        "weights drawn from config.json (`init = \"random\"`), the tiny tokenizer. No old-log-prob node, no reference "
        "model / KL loss.",
        "",
        f"- precision measured: **{precision}**{why}",
        f"- {last['note']}",
        "",
    ]
    if not rows:
        return lines + ["no step finished (see the step's log below)", ""], f"no step finished ({last['status']})"
    table, nums = run3_table(out, st, rows, last, "3b", st.get("STEPS3", "?"))
    lines += table + [""]
    short = f"{precision}: {fmt(nums['gen_rate'], 1)} gen tok/s, {fmt(nums['upd_rate'], 1)} trained tok/s"
    return lines, short


def lora3b_section(out, st, steps):
    attempts = [s for s in steps if s["id"] == "3b_lora"]
    rank, alpha = st.get("RANK3L", "?"), st.get("ALPHA3L", "?")
    with_ref = st.get("REF3L", "1") == "1"
    lines = [
        f"## 6. The same GRPO step with LoRA (rank {rank}, alpha {alpha}, all-linear)"
        + (" and an adapters-off reference" if with_ref else ""),
        "",
    ]
    if not attempts:
        return lines + ["not run", ""], "not run"
    last = attempts[-1]
    rows = metrics(os.path.join(out, "3b_lora"))
    if last["status"] == "SKIPPED" and not rows:
        return lines + [f"not run: {last['note']}", ""], "not run"
    precision = st.get("PREC3L") or "?"
    lines += [
        "Section 2's graph, model, sizes, prompts and seed (random weights), with "
        f"`models.policy.lora = {{ rank = {rank}, alpha = {alpha}, target_modules = [\"all-linear\"] }}`. The base "
        "weights stay frozen in the compute precision, and only the adapters (f32) have gradients and AdamW moments. "
        "The vision tower is not adapted. The learning rate is 3e-3, the LoRA rate of `graphs/grpo_vlm_lora.toml`."
        + (
            " A reference `[models.reference] from = \"policy\"` is the base with the adapters switched off (no copy "
            "of the weights). A `logprob` node on it (`timing_s/ref`) feeds the update's `ref_log_probs`, and the "
            "update adds a low_var_kl loss (coef 0.001)."
            if with_ref
            else " No reference model and no KL loss (`GPU_3B_LORA_REF=0`)."
        ),
        "",
        f"- precision measured: **{precision}**",
        f"- {last['note']}",
        "",
    ]
    if not rows:
        return lines + ["no step finished (see the step's log below)", ""], f"no step finished ({last['status']})"
    table, nums = run3_table(out, st, rows, last, "3b_lora", st.get("STEPS3L", "?"))
    lines += table
    kl = [(r.get("step"), r["actor/kl_loss"]) for r in rows if "actor/kl_loss" in r]
    if kl:
        lines.append(
            "| `actor/kl_loss` per step (step 1: the adapters are still zero, so the policy is the base and the KL "
            "should be ≈ 0; after an update it should be > 0) | "
            + ", ".join(f"step {s}: {v:.3g}" for s, v in kl)
            + " |"
        )
    # Against section 2 (full fine-tuning), when it finished a step.
    full = qwen3b_result(out, st, steps)
    if full and full["rows"]:
        _, fnums = run3_table(out, st, full["rows"], full["last"], "3b", st.get("STEPS3", "?"))
        fpeak, lpeak = full["last"]["peak"], last["peak"]
        ratio = (
            f"{int(lpeak) / int(fpeak):.2f}×" if fpeak.isdigit() and lpeak.isdigit() and int(fpeak) > 0 else "–"
        )
        lines += [
            f"| peak GPU memory, LoRA / full fine-tuning (section 2, {full['precision']}) | {ratio} ({lpeak or '–'} / {fpeak or '–'} MiB) |",
            f"| update time, LoRA / full fine-tuning | {fmt(nums['upd'] / fnums['upd'] if fnums['upd'] == fnums['upd'] and fnums['upd'] > 0 else float('nan'), 2)} |",
        ]
    lines.append("")
    short = f"{precision}: {fmt(nums['gen_rate'], 1)} gen tok/s, {fmt(nums['upd_rate'], 1)} trained tok/s"
    if kl:
        short += f"; kl_loss {', '.join(f'{v:.2g}' for _, v in kl)}"
    return lines, short


def main():
    out = sys.argv[1]
    steps = steps_tsv(out)
    st = settings(out)
    by_id = {}
    for s in steps:
        by_id[s["id"]] = s  # the last attempt of a step
    env = read(os.path.join(out, "env.txt"))
    try:
        py = json.loads(read(os.path.join(out, "python.json"), "{}") or "{}")
    except json.JSONDecodeError:
        py = {}

    sections = {}
    sections["micro"] = micro_section(out, by_id.get("micro"))
    sections["fixtures"] = fixture_section(out, by_id.get("fixtures"))
    sections["default"] = default_section(out, by_id.get("default"))
    bench_lines, bench_short = bench_section(out, st, by_id.get("bench_flowrl"), by_id.get("bench_ref"))
    sections["bench_flowrl"] = (bench_lines, bench_short)
    sections["3b"] = qwen3b_section(out, st, steps)
    sections["3b_lora"] = lora3b_section(out, st, steps)

    date = re.search(r"^date: (.*)$", env, re.M)
    gpu = []
    m = re.search(r"^== nvidia-smi[^\n]*\n(.*?)(?=^== )", env, re.M | re.S)
    if m:
        gpu = [ln for ln in m.group(1).splitlines() if ln.strip()]
    md = [
        "# flowrl on one GPU: `bench/gpu/check.sh`",
        "",
        f"Written by `bench/gpu/check.sh` on {date.group(1) if date else '?'} in {st.get('ELAPSED', '?')} s "
        f"(limit {st.get('TOTAL', '?')} s). Raw logs: `steps.tsv`, `env.txt` and one log per step in the output folder.",
        "",
        "## Machine",
        "",
        "```",
        *gpu,
        "```",
        "",
    ]
    for key in ["host", "cpu"]:
        mm = re.search(rf"^{key}: (.*)$", env, re.M)
        if mm:
            md.append(f"- {key}: {mm.group(1)}")
    nvcc = re.search(r"^== nvcc\n(.*?)(?=^== )", env, re.M | re.S)
    if nvcc:
        md.append("- nvcc: " + " ".join(nvcc.group(1).split()))
    if py:
        mods = ", ".join(f"{k} {py.get(k) or 'absent'}" for k in ["torch", "transformers", "pyarrow", "PIL", "torchvision", "trl"])
        md.append(
            f"- Python {py.get('python')}: {mods}; torch CUDA {py.get('torch_cuda')}, available: {py.get('cuda_available')}"
        )
    build = re.search(r"^== bench/gpu/bin/BUILD_INFO\n(.*?)(?=^== |\Z)", env, re.M | re.S)
    if build:
        md.append("- flowrl build: " + "; ".join(ln for ln in build.group(1).splitlines() if ln.strip()))
    md.append(
        f"- model precision parameter: `{st.get('PREC_KEY') or 'none found'}` (bf16 accepted: {'yes' if st.get('BF16_OK') == '1' else 'no'}); "
        f"autotune: {re.search(r'^CUBECL_AUTOTUNE_LEVEL=(.*)$', env, re.M).group(1) if 'CUBECL_AUTOTUNE_LEVEL=' in env else '?'}"
    )
    for pat in [r"^== driver: (.*)$", r"^== nvidia-smi: (CUDA Version.*)$", r"^== CUDA toolkit for NVRTC: (.*)$",
                r"^  cuda/ptx: (.*)$", r"^pip nvidia/nccl: (.*)$", r"^== cubecl caches: (.*)$"]:
        mm = re.search(pat, env, re.M)
        if mm and mm.group(1).strip():
            md.append("- " + pat.split("(")[0].strip("^=: ").replace("== ", "") + ": " + mm.group(1).strip())
    nccl = re.search(r"^== libraries[^\n]*\n(.*?)(?=^LD_LIBRARY_PATH|^pip |^== )", env, re.M | re.S)
    if nccl:
        found = [ln.strip() for ln in nccl.group(1).splitlines() if "nccl" in ln.lower()]
        md.append("- NCCL (ldconfig -p): " + ("; ".join(found) if found else "none"))
    notes = re.search(r"^== setup notes\n(.*?)(?=^== |\Z)", env, re.M | re.S)
    for ln in (notes.group(1).splitlines() if notes else []):
        if ln.strip():
            md.append(f"- **setup:** {ln.strip()}")
    if st.get("CUDA_SKIP"):
        md.append(f"- **CUDA steps skipped:** {st['CUDA_SKIP']}")
    md.append(
        f"- kernel cache after the run: {st.get('CACHE_KERNELS', '?')} compiled kernels, {st.get('CACHE_AUTOTUNE', '?')} autotune "
        f"results; {st.get('CACHE_NOTE') or 'no archive'}"
    )
    md += [
        "",
        "## Steps",
        "",
        "| step | status | wall (s) | timeout (s) | peak GPU memory (MiB) | result | kernel cache (bench/gpu/cache) |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for s in steps:
        short = ""
        if s["id"] in sections and s is by_id.get(s["id"]):
            short = sections[s["id"]][1]
        elif s["id"] == "bench_ref" and s["status"] == "ok":
            short = "see section 5"
        result = "; ".join(x for x in [short, s["note"]] if x)
        md.append(
            f"| {s['title']} | {s['status']}{' (rc ' + s['rc'] + ')' if s['status'] not in ('ok', 'SKIPPED') else ''} "
            f"| {s['wall'] or '–'} | {s['timeout'] or '–'} | {s['peak'] or '–'} | {result} | {s['cache'] or '–'} |"
        )
    md.append("")
    for key in ["micro", "3b", "fixtures", "default", "bench_flowrl", "3b_lora"]:
        md += sections[key][0]
    bad = [s for s in steps if s["status"] not in ("ok", "SKIPPED") and s["log"]]
    if bad:
        md += ["## Steps that did not succeed: the last lines of their logs", ""]
        for s in bad:
            md += [f"### {s['title']}: {s['status']} (rc {s['rc']})", "", "```", tail(s["log"]), "```", ""]
    with open(os.path.join(out, "gpu.md"), "w") as f:
        f.write("\n".join(md))
    print(f"wrote {os.path.join(out, 'gpu.md')}")


if __name__ == "__main__":
    main()
