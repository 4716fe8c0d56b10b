"""Row 4 of the comparison: full GRPO steps with TRL's `GRPOTrainer` on the same model, prompts and
thread count as flowrl's `bench/grpo_bench.toml`.

Settings matched to the flowrl graph: `prompts` prompts × `num_generations = n` completions of at
most `max_completion_length` tokens sampled at temperature 1 (top-k/top-p off) with transformers'
`generate` (no vLLM); one optimizer step per generation batch (`per_device_train_batch_size =
micro`, `gradient_accumulation_steps = rows / micro`, so the micro-batching is the same); PPO-clip
ε = 0.2 with DAPO token-mean over the whole batch (= verl/flowrl `token-mean`); `beta = 0` (no KL,
no reference model); AdamW, lr 1e-6 constant, weight decay 0.01, global-norm clipping at 1.0;
group-normalised advantages (`scale_rewards = "group"`, GRPO). Differences that TRL does not
allow to remove: with one optimizer step per generation TRL takes the old log-probs to be the
current ones (on-policy) and skips the separate old-log-prob pass that flowrl's graph runs (so
flowrl's step does more work; the results also show flowrl's step without that pass).

usage: trl_step.py MODEL_DIR PROMPTS.parquet OUT.json --prompts 8 --n 8 --new 128 --micro 32
       --steps 3 --threads 2
"""

import argparse
import re
import time

import torch
from datasets import Dataset
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from common import load_prompts, median, set_threads, write_json


def boxed_reward(completions, ground_truth, **kwargs):
    """1 when the last \\boxed{...} equals the ground truth (the accuracy part of geo3k)."""
    out = []
    for c, gt in zip(completions, ground_truth):
        text = c[0]["content"] if isinstance(c, list) else c
        m = re.findall(r"\\boxed\{([^}]*)\}", text)
        out.append(1.0 if m and m[-1].strip() == gt else 0.0)
    return out


class StepTimes(TrainerCallback):
    """Wall-clock time of each optimizer step (generation + loss + backward + AdamW)."""

    def __init__(self):
        self.times = []
        self.t0 = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.times.append(now - self.t0)
        self.t0 = now


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--prompts", dest="num_prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--micro", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/flowrl-bench-trl")
    args = ap.parse_args()
    set_threads(args.threads)
    rows = args.num_prompts * args.n
    micro = min(args.micro, rows)
    assert rows % micro == 0, "rows must be a multiple of the micro-batch size"

    records = []
    for messages, images, gt in load_prompts(args.prompts, args.num_prompts):
        # TRL puts the `image` column's picture first in the first user message, which is where
        # the shapes prompts have their `<image>`; the text items stay as they are.
        text_only = [
            {"role": m["role"], "content": "".join(p.get("text", "") for p in m["content"])}
            for m in messages
        ]
        records.append({"prompt": text_only, "image": images[0], "ground_truth": gt})
    dataset = Dataset.from_list(records)

    model = Qwen2VLForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(args.model)
    config = GRPOConfig(
        output_dir=args.workdir,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        num_generations=args.n,
        max_completion_length=args.new,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        max_grad_norm=1.0,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        shuffle_dataset=False,
        seed=7,
        log_completions=False,
    )
    timer = StepTimes()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=boxed_reward,
        args=config,
        train_dataset=dataset,
        processing_class=processor,
        callbacks=[timer],
    )
    trainer.train()
    steady = timer.times[1:] if len(timer.times) > 1 else timer.times
    out = {
        "rows": rows,
        "threads": torch.get_num_threads(),
        "step_s": timer.times,
        "median": {"step_s": median(steady)},
        "note": "median over steps after the first (warm-up) when there are several",
    }
    write_json(args.out, out)
    print(out)


if __name__ == "__main__":
    main()
