#!/usr/bin/env python3
"""reward.length_penalty as an exec node (docs/exec-protocol.md): the same rule as
examples/custom_node/src/length_penalty.rs, score = acc - penalty * max(0, tokens - max_tokens),
acc = 1 when the response contains \\boxed{<ground truth>}."""
import json
import math
import sys

print(json.dumps({"hello": {
    "protocol": 2, "name": "length_penalty", "version": "1.0.0",
    "inputs": [{"name": "rollouts", "type": "Rollouts"}],
    "outputs": [{"name": "scores", "type": "Scores"}],
    "params": [
        {"name": "max_tokens", "type": "int", "default": 12, "min": 1, "doc": "tokens allowed for free"},
        {"name": "penalty", "type": "float", "default": 0.05, "min": 0, "doc": "cost of each extra token"},
    ]}}), flush=True)

for line in sys.stdin:  # one request per step; stdin closes at the end of the run
    request = json.loads(line)
    r, p = request["inputs"]["rollouts"], request["params"]
    acc = [float("\\boxed{%s}" % t.strip() in text) for text, t in zip(r["response"], r["ground_truth"])]
    over = [max(0, n - p["max_tokens"]) for n in r["response_length"]]
    scores = [a - p["penalty"] * o for a, o in zip(acc, over)]
    assert all(math.isfinite(s) for s in scores)  # json.dumps would write NaN, which flowrl refuses
    answer = {"step": request["step"], "outputs": {"scores": {"scores": scores, "components": {"acc": acc}}}}
    print(json.dumps(answer), flush=True)  # exactly one line per request, echoing its step
    print(f"step {request['step']}: {len(scores)} responses", file=sys.stderr, flush=True)  # logs: stderr
