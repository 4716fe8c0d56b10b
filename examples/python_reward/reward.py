#!/usr/bin/env python3
"""A flowrl reward function in plain Python 3 (standard library only), run as an `exec` node.

It speaks flowrl's exec-node protocol (docs/exec-protocol.md): one JSON object per line on
stdin/stdout. It first prints a handshake declaring its ports and parameters, then answers one
request per training step until stdin closes.

The reward is the geo3k-style "think, then box the answer" reward with an exact-match verifier:

    score = (1 - format_score) * accuracy + format_score * format

* format   = 1 when the whole response matches  <think>.*</think>.*\\boxed{.*}.*  (re.DOTALL,
             as verl's geo3k `format_reward`), else 0;
* accuracy = 1 when the content of the last \\boxed{...} (brace-matched, stripped; the whole
             stripped response when there is no box) equals the stripped ground truth, else 0
             (flowrl's built-in `exact_match` rule).

flowrl records the scores like a built-in reward's metrics (critic/score/mean, ...,
critic/score/acc/mean, critic/score/format/mean); the program adds reward/boxed_fraction, the
share of responses that contain a \\boxed{...}.

Logs go to stderr: stdout is reserved for the protocol.
"""

import json
import re
import sys

NAME = "python_reward"
VERSION = "1.0.0"

FORMAT_RE = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(response):
    return 1.0 if FORMAT_RE.fullmatch(response) else 0.0


def extract_boxed(text):
    """Content of the last \\boxed{...}, brace-matched and stripped; "None" if it never closes."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return "None"
    content = text[start + len("\\boxed{"):]
    depth = 0
    for i, c in enumerate(content):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if depth == -1:
            return content[:i].strip()
    return "None"


def accuracy_reward(response, ground_truth):
    answer = extract_boxed(response) if "\\boxed{" in response else response.strip()
    return 1.0 if answer == ground_truth.strip() else 0.0


def score(response, ground_truth, format_score):
    acc = accuracy_reward(response, ground_truth)
    fmt = format_reward(response)
    return (1.0 - format_score) * acc + format_score * fmt, acc, fmt


def mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


HELLO = {
    "hello": {
        "protocol": 2,
        "name": NAME,
        "version": VERSION,
        "doc": "Think-then-box reward with an exact-match verifier, in Python.",
        "inputs": [
            {"name": "rollouts", "type": "Rollouts", "doc": "the responses to score"},
        ],
        "outputs": [
            {"name": "scores", "type": "Scores", "doc": "one reward per response (+ acc, format)"},
        ],
        "params": [
            {
                "name": "format_score",
                "type": "float",
                "default": 0.1,
                "min": 0.0,
                "max": 1.0,
                "doc": "weight of the format term; accuracy gets 1 - format_score",
            },
        ],
    }
}


def handle(request):
    rollouts = request["inputs"]["rollouts"]
    w = float(request["params"]["format_score"])
    scores, accs, fmts = [], [], []
    for response, truth in zip(rollouts["response"], rollouts["ground_truth"]):
        s, a, f = score(response, truth, w)
        scores.append(s)
        accs.append(a)
        fmts.append(f)
    return {
        "outputs": {"scores": {"scores": scores, "components": {"acc": accs, "format": fmts}}},
        # flowrl logs the scores like a built-in reward's (critic/score/mean|max|min,
        # critic/score/acc/mean, critic/score/format/mean); a program adds its own metrics here.
        "metrics": {
            "reward/boxed_fraction": mean([1.0 if "\\boxed{" in r else 0.0
                                           for r in rollouts["response"]]),
        },
    }


def main():
    print(json.dumps(HELLO), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            answer = handle(request)
        except Exception as e:  # report, keep serving: flowrl decides what a failed step means
            answer = {"error": f"{type(e).__name__}: {e}"}
        # Protocol 2: every answer echoes the step of its request (flowrl checks it).
        answer["step"] = request.get("step")
        print(json.dumps(answer), flush=True)
        print(f"[{NAME}] step {request.get('step')}: scored "
              f"{len(answer.get('outputs', {}).get('scores', {}).get('scores', []))} responses",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
