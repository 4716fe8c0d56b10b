"""Writes OUT/gpu.md from what bench/gpu/check.sh left in OUT (steps.tsv, env.txt, python.json,
settings.txt, the logs, the run directories' metrics.jsonl and ref.json). Standard library only:
it runs on the GPU machine whatever Python packages are there.

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
    return rows


def steps_tsv(out):
    steps = []
    for line in read(os.path.join(out, "steps.tsv")).splitlines():
        f = line.split("\t")
        if len(f) < 9:
            f += [""] * (9 - len(f))
        steps.append(dict(zip(["id", "title", "status", "rc", "wall", "timeout", "peak", "log", "note"], f)))
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
    lines = ["## 1. Fixture parity on CUDA (`models/tests/cuda.rs`, `--test-threads 1`)", ""]
    if not step:
        return lines + ["not run", ""], "not run"
    summary = result[-1].replace("test result: ", "") if result else "no libtest summary line"
    lines += [f"{summary}", ""]
    if tests:
        lines += ["| test | result |", "|---|---|"] + [f"| `{t}` | {r} |" for t, r in tests] + [""]
    passed = sum(1 for _, r in tests if r == "ok")
    failed = sum(1 for _, r in tests if r == "FAILED")
    short = f"{passed} passed, {failed} failed" if tests else summary
    return lines, short


def default_section(out, step):
    rows = metrics(os.path.join(out, "default_cuda"))
    lines = ["## 2. Default graph on CUDA (`graphs/grpo_vlm.toml --device cuda --steps 20`)", ""]
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

    lines = ["## 3. Benchmark shape on CUDA (`bench/model_config.json`, as `bench/run.sh`)", ""]
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
    the peak memory. Returns the lines and the numbers the short line and step 5 use."""
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
    """Step 4's attempts, run directory, precision and rows."""
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
    lines = ["## 4. One GRPO step of a Qwen2.5-VL-3B-sized random model (`bench/gpu/grpo_3b.toml`)", ""]
    if not res:
        return lines + ["not run", ""], "not run"
    attempts, last, precision, rows = res["attempts"], res["last"], res["precision"], res["rows"]
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
        f"## 5. The same GRPO step with LoRA (rank {rank}, alpha {alpha}, all-linear)"
        + (" and an adapters-off reference" if with_ref else ""),
        "",
    ]
    if not attempts:
        return lines + ["not run", ""], "not run"
    last = attempts[-1]
    rows = metrics(os.path.join(out, "3b_lora"))
    precision = st.get("PREC3L") or "?"
    lines += [
        "Section 4's graph, model, sizes and seed (random weights), with "
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
    # Against section 4 (full fine-tuning), when it finished a step.
    full = qwen3b_result(out, st, steps)
    if full and full["rows"]:
        _, fnums = run3_table(out, st, full["rows"], full["last"], "3b", st.get("STEPS3", "?"))
        fpeak, lpeak = full["last"]["peak"], last["peak"]
        ratio = (
            f"{int(lpeak) / int(fpeak):.2f}×" if fpeak.isdigit() and lpeak.isdigit() and int(fpeak) > 0 else "–"
        )
        lines += [
            f"| peak GPU memory, LoRA / full fine-tuning (section 4, {full['precision']}) | {ratio} ({lpeak or '–'} / {fpeak or '–'} MiB) |",
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
    md += [
        "",
        "## Steps",
        "",
        "| step | status | wall (s) | timeout (s) | peak GPU memory (MiB) | result |",
        "|---|---|---:|---:|---:|---|",
    ]
    for s in steps:
        short = ""
        if s["id"] in sections and s is by_id.get(s["id"]):
            short = sections[s["id"]][1]
        elif s["id"] == "bench_ref" and s["status"] == "ok":
            short = "see section 3"
        result = "; ".join(x for x in [short, s["note"]] if x)
        md.append(
            f"| {s['title']} | {s['status']}{' (rc ' + s['rc'] + ')' if s['status'] not in ('ok', 'SKIPPED') else ''} "
            f"| {s['wall'] or '–'} | {s['timeout'] or '–'} | {s['peak'] or '–'} | {result} |"
        )
    md.append("")
    for key in ["fixtures", "default", "bench_flowrl", "3b", "3b_lora"]:
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
