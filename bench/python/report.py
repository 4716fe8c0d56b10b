"""Reads the raw measurements of bench/run.sh (WORK_DIR) and writes RESULTS_DIR/results.md and
results.json: the side-by-side table with ratios, the per-phase profile, the scaling table and
the machine (CPU model, cores, load, versions, date).

usage: report.py WORK_DIR RESULTS_DIR --prompts P --n N --new T --micro M --reps R --threads K
"""

import argparse
import datetime
import json
import os
import platform
import subprocess

from common import median, write_json


def read_time(path):
    """`/usr/bin/time -f "%M %e"`: (peak RSS in MiB, wall seconds)."""
    with open(path) as f:
        last = [line for line in f.read().splitlines() if line.strip()][-1]
    kb, wall = last.split()
    return int(kb) / 1024.0, float(wall)


def flowrl_steps(run_dir):
    """The training steps' metrics (step 0, the evaluation before training, left out)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("step") != 0]


def steady(xs):
    return xs[1:] if len(xs) > 1 else xs


def flowrl_medians(run_dir):
    steps = steady(flowrl_steps(run_dir))
    keys = sorted({k for s in steps for k in s if k.startswith("timing_s/")})
    med = {k[len("timing_s/") :]: median([s[k] for s in steps if k in s]) for k in keys}
    med["step_without_old"] = median(
        [s["timing_s/step"] - s.get("timing_s/old_log_prob", 0.0) for s in steps]
    )
    med["response_length"] = median([s["response_length/mean"] for s in steps])
    med["prompt_length"] = median([s["prompt_length/mean"] for s in steps])
    med["steps_used"] = len(steps)
    return med


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def machine():
    import torch
    import transformers
    import trl

    cpu = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
    burn = sh("grep -A1 '^name = \"burn\"$' Cargo.lock | sed -n 's/^version = //p' | tr -d '\"'")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rustc": sh("rustc --version"),
        "burn": burn,
        "flowrl": sh("git rev-parse --short HEAD"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
    }


def ratio(ref, ours):
    return ref / ours if ours > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("results")
    for k in ["prompts", "n", "new", "micro", "reps", "threads"]:
        ap.add_argument(f"--{k}", type=int, required=True)
    a = ap.parse_args()
    w = a.work
    fl = flowrl_medians(os.path.join(w, "flowrl"))
    with open(os.path.join(w, "ref.json")) as f:
        ref = json.load(f)
    with open(os.path.join(w, "trl.json")) as f:
        trl = json.load(f)
    fl_rss, _ = read_time(os.path.join(w, "flowrl.time"))
    ref_rss, _ = read_time(os.path.join(w, "ref.time"))
    trl_rss, _ = read_time(os.path.join(w, "trl.time"))
    load = {}
    for k in ["before", "after"]:
        p = os.path.join(w, f"loadavg_{k}")
        load[k] = open(p).read().split()[:3] if os.path.exists(p) else []
    m = machine()
    rows = a.prompts * a.n

    # A graph without the `old` node (on-policy, `old_log_probs` unwired) has no row (2) time.
    table = [
        ("(1) rollout: prefill + decode", "transformers `generate`", fl["gen"], ref["median"]["rollout_s"]),
        ("(2) log-prob pass", "transformers forward, no grad", fl.get("old_log_prob", float("nan")), ref["median"]["logprob_s"]),
        ("(3) one PPO update step", "torch forward/backward + AdamW", fl["update_actor"], ref["median"]["update_s"]),
        ("(4) full GRPO step", "TRL `GRPOTrainer` step", fl["step"], trl["median"]["step_s"]),
        ("(4') GRPO step without the old-log-prob pass", "TRL `GRPOTrainer` step (on-policy, no such pass)", fl["step_without_old"], trl["median"]["step_s"]),
    ]
    # The main run is the largest point of both scaling directions.
    scale = [{"run": "main", "metrics": flowrl_steps(os.path.join(w, "flowrl"))[-1]}]
    for name in sorted(os.listdir(w)):
        if name.startswith("scale_") and os.path.isdir(os.path.join(w, name)):
            s = flowrl_steps(os.path.join(w, name))[-1]
            scale.append({"run": name, "metrics": s})

    out = []
    out.append("# flowrl vs transformers / TRL: side-by-side benchmark\n")
    out.append(f"Written by `bench/run.sh` on {m['date']}. Raw numbers: `results.json`.\n")
    out.append("## Machine and versions\n")
    out.append(f"- CPU: {m['cpu']}, {m['cores']} cores; both sides use {a.threads} threads "
               f"(`RAYON_NUM_THREADS` for flowrl's Flex backend, `torch.set_num_threads` for torch)")
    out.append(f"- load average (1/5/15 min) before: {' '.join(load['before'])}, after: {' '.join(load['after'])}")
    out.append(f"- flowrl {m['flowrl']} ({m['rustc']}, burn {m['burn']}, Flex CPU backend, f32)")
    out.append(f"- Python {m['python']}, torch {m['torch']} (CPU, f32), transformers {m['transformers']}, trl {m['trl']}\n")
    out.append("## Workload\n")
    out.append(f"- model: random Qwen2-VL architecture (`bench/model_config.json`: text hidden 512, 8 layers, "
               f"8 heads / 4 KV heads, MLP 1408, vocab 32000; vision tower of 4 blocks, width 256), "
               f"written once by flowrl's saver to `bench/work/model`, loaded by both sides")
    out.append(f"- {a.prompts} prompts of the shapes task with one 224×224 image each (64 image tokens; "
               f"prompt ≈ {fl['prompt_length']:.0f} tokens) × n = {a.n} samples = {rows} sequences, "
               f"{a.new} new tokens (temperature 1, no top-k/top-p; mean response length "
               f"{fl['response_length']:.1f} on flowrl's side)")
    out.append(f"- log-prob and update micro-batches of {min(a.micro, rows)} sequences; one optimizer step "
               f"(AdamW, clipping at 1.0) per batch")
    out.append(f"- medians of {a.reps} measured repetitions after one warm-up repetition")
    out.append("")
    out.append("## Side by side\n")
    out.append("| row | reference | flowrl (s) | reference (s) | reference / flowrl |")
    out.append("|---|---|---:|---:|---:|")
    for name, refname, ours, theirs in table:
        out.append(f"| {name} | {refname} | {ours:.2f} | {theirs:.2f} | {ratio(theirs, ours):.2f}× |")
    out.append("")
    out.append("| (5) peak RSS | flowrl (MiB) | reference (MiB) | reference / flowrl |")
    out.append("|---|---:|---:|---:|")
    out.append(f"| full GRPO run (flowrl `run` vs TRL `GRPOTrainer`) | {fl_rss:.0f} | {trl_rss:.0f} | {ratio(trl_rss, fl_rss):.2f}× |")
    out.append(f"| rows 1-3 (flowrl `run` vs transformers + torch script) | {fl_rss:.0f} | {ref_rss:.0f} | {ratio(ref_rss, fl_rss):.2f}× |")
    out.append("")
    out.append("## Where the time goes (per phase, medians)\n")
    out.append("| phase | flowrl (s) | reference (s) |")
    out.append("|---|---:|---:|")
    out.append(f"| prefill (vision tower + prompt) | inside rollout | {ref['median']['prefill_s']:.2f} (one forward over the {rows} prompts) |")
    for k in ["data", "gen", "old_log_prob", "reward", "adv", "update_actor", "step"]:
        if k in fl:
            out.append(f"| flowrl node `{k}` | {fl[k]:.2f} | |")
    out.append("")
    if len(scale) > 1:
        out.append("## Scaling (flowrl, one GRPO step after a warm-up step)\n")
        out.append("| run | sequences | new tokens | rollout (s) | log-prob (s) | update (s) | step (s) | step / sequence-token (ms) |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for s in scale:
            mt = s["metrics"]
            name = s["run"]
            seqs = (int(name[len("scale_p"):]) if name.startswith("scale_p") else a.prompts) * a.n
            new = int(name[len("scale_t"):]) if name.startswith("scale_t") else a.new
            per = 1000.0 * mt["timing_s/step"] / (seqs * mt["response_length/mean"])
            out.append(f"| {name} | {seqs} | {new} | {mt['timing_s/gen']:.2f} | {mt.get('timing_s/old_log_prob', float('nan')):.2f} | "
                       f"{mt['timing_s/update_actor']:.2f} | {mt['timing_s/step']:.2f} | {per:.3f} |")
        out.append("")
    os.makedirs(a.results, exist_ok=True)
    with open(os.path.join(a.results, "results.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    write_json(
        os.path.join(a.results, "results.json"),
        {
            "machine": m,
            "load": load,
            "settings": vars(a),
            "flowrl": fl,
            "reference_rows": ref,
            "trl": trl,
            "peak_rss_mib": {"flowrl": fl_rss, "reference_rows": ref_rss, "trl": trl_rss},
            "scaling": [{"run": s["run"], **{k: v for k, v in s["metrics"].items() if k.startswith("timing_s/") or "length" in k}} for s in scale],
        },
    )
    print("\n".join(out))


if __name__ == "__main__":
    main()
