"""Rows 1-3 of the comparison with plain transformers + torch (the reference for flowrl's
`rollout`, `logprob` and `update.ppo` nodes), on the same model, prompts and thread count.

(1) rollout: `generate` on prompts × n rows (each prompt repeated n times, left padded), sampling
    at temperature 1 (top-k/top-p off), `max_new_tokens` new tokens;
(2) log-prob pass: no-grad forward over prompt + response in micro-batches, log-softmax gathered
    at the response tokens (flowrl's `logprob`);
(3) one PPO update step: the clipped surrogate (verl `compute_policy_loss_vanilla`, token-mean over
    the whole mini-batch), gradients accumulated over micro-batches, global-norm clipping, AdamW
    (flowrl's `update.ppo` with one mini-batch).

usage: ref_rows.py MODEL_DIR PROMPTS.parquet OUT.json --prompts 8 --n 8 --new 128 --micro 32
       --reps 3 --threads 2 [--device cpu|cuda[:N]] [--dtype float32|bfloat16|float16]
       [--gradient-checkpointing]

`--gradient-checkpointing` recomputes the decoder layers in row (3)'s backward, as flowrl's
`update.ppo` does with `gradient_checkpointing = true` (bench/run.sh passes it when
bench/grpo_bench.toml sets it).

`--device cuda` runs the same three phases on a GPU (timers synchronise the device; OUT.json then
also holds `device`, `dtype` and `peak_cuda_mib`, torch's peak allocated memory); the defaults
(cpu, float32) are the CPU comparison of bench/run.sh, unchanged.
"""

import argparse

import torch
from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

from common import Timer, load_prompts, median, set_threads, write_json


def steady(times):
    """The repetitions after the first (warm-up), when there are several."""
    return times[1:] if len(times) > 1 else times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--prompts", dest="num_prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--micro", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda[:N]")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute the decoder layers in row (3)'s backward (transformers' "
        "gradient_checkpointing_enable, TRL's default), as flowrl's gradient_checkpointing",
    )
    args = ap.parse_args()
    set_threads(args.threads)
    torch.manual_seed(7)
    device = torch.device(args.device)
    on_cpu = device.type == "cpu"
    # GPU kernels run asynchronously: every timed block waits for them at both ends.
    sync = None if on_cpu else (lambda: torch.cuda.synchronize(device))

    model = Qwen2VLForConditionalGeneration.from_pretrained(args.model, dtype=getattr(torch, args.dtype))
    if not on_cpu:
        model.to(device)
        torch.cuda.reset_peak_memory_stats(device)
    processor = AutoProcessor.from_pretrained(args.model)
    processor.tokenizer.padding_side = "left"
    prompts = load_prompts(args.prompts, args.num_prompts)
    texts, images = [], []
    for messages, imgs, _ in prompts:
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        for _ in range(args.n):
            texts.append(text)
            images.append(imgs)
    batch = processor(text=texts, images=images, padding=True, return_tensors="pt")
    if not on_cpu:
        batch = batch.to(device)
    rows, plen = batch["input_ids"].shape
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = processor.tokenizer.pad_token_id if processor.tokenizer.pad_token_id is not None else eos

    # (1) rollout
    model.eval()
    gen_times, prefill_times = [], []
    seqs = None
    for _ in range(args.reps):
        with torch.no_grad(), Timer(sync) as t:
            # Prefill alone (vision tower + prompt), for the per-phase profile.
            model(**batch, use_cache=True)
        prefill_times.append(t.s)
        with torch.no_grad(), Timer(sync) as t:
            seqs = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.new,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        gen_times.append(t.s)
    response = seqs[:, plen:]
    # Response mask: tokens up to and including the first EOS.
    is_eos = response == eos
    after = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    resp_mask = (after == 0).float()
    full_mask = torch.cat([batch["attention_mask"], resp_mask.long()], dim=1)
    resp_len = response.shape[1]

    # Per-row image slices of pixel_values (each row holds one image here).
    grid = batch["image_grid_thw"]
    patches = (grid[:, 0] * grid[:, 1] * grid[:, 2]).tolist()
    offsets = [0]
    for p in patches:
        offsets.append(offsets[-1] + p)

    extra = {}
    if "mm_token_type_ids" in batch:
        # transformers 5: which tokens are image tokens (M-RoPE); response tokens are text.
        mm = batch["mm_token_type_ids"]
        extra["mm_token_type_ids"] = torch.cat([mm, torch.zeros_like(response, dtype=mm.dtype)], dim=1)

    def micro_inputs(lo, hi):
        return dict(
            **{k: v[lo:hi] for k, v in extra.items()},
            input_ids=seqs[lo:hi],
            attention_mask=full_mask[lo:hi],
            pixel_values=batch["pixel_values"][offsets[lo] : offsets[hi]],
            image_grid_thw=grid[lo:hi],
        )

    def response_logprobs(inputs):
        logits = model(**inputs, use_cache=False).logits[:, plen - 1 : -1, :].float()
        return torch.gather(
            torch.log_softmax(logits, dim=-1), 2, inputs["input_ids"][:, plen:].unsqueeze(-1)
        ).squeeze(-1)

    # (2) log-prob pass
    lp_times = []
    old = None
    for _ in range(args.reps):
        with torch.no_grad(), Timer(sync) as t:
            old = torch.cat(
                [
                    response_logprobs(micro_inputs(lo, min(lo + args.micro, rows)))
                    for lo in range(0, rows, args.micro)
                ]
            )
        lp_times.append(t.s)

    # (3) one PPO update step (one mini-batch = the whole batch)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    scores = torch.rand(args.num_prompts, args.n)
    adv_rows = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).reshape(-1)
    adv = adv_rows[:, None].expand(rows, resp_len)
    if not on_cpu:
        adv = adv.to(device)
    tokens = resp_mask.sum()
    upd_times = []
    for _ in range(args.reps):
        with Timer(sync) as t:
            for lo in range(0, rows, args.micro):
                hi = min(lo + args.micro, rows)
                lp = response_logprobs(micro_inputs(lo, hi))
                ratio = torch.exp(lp - old[lo:hi])
                pg = torch.maximum(-adv[lo:hi] * ratio, -adv[lo:hi] * torch.clamp(ratio, 0.8, 1.2))
                loss = (pg * resp_mask[lo:hi]).sum() / tokens
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        upd_times.append(t.s)

    out = {
        "rows": rows,
        "prompt_len": plen,
        "response_len": resp_len,
        "response_tokens": int(resp_mask.sum().item()),
        "threads": torch.get_num_threads(),
        "gradient_checkpointing": args.gradient_checkpointing,
        "rollout_s": gen_times,
        "prefill_s": prefill_times,
        "logprob_s": lp_times,
        "update_s": upd_times,
        "median": {
            "rollout_s": median(steady(gen_times)),
            "prefill_s": median(steady(prefill_times)),
            "logprob_s": median(steady(lp_times)),
            "update_s": median(steady(upd_times)),
        },
        "note": "medians over the repetitions after the first (warm-up) when there are several",
    }
    if not on_cpu or args.dtype != "float32":
        out["device"] = str(device)
        out["dtype"] = args.dtype
    if not on_cpu:
        out["peak_cuda_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    write_json(args.out, out)
    print(out["median"], "rows", rows, "prompt", plen, "response", resp_len)


if __name__ == "__main__":
    main()
