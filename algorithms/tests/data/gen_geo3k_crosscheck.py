"""Regenerates geo3k_grader_crosscheck.json (before trimming) from the real grader.

Needs `pip install --target /tmp/pyref mathruler==0.1.0 sympy==1.14.0 pylatexenc==2.11` and a
stub `tqdm` module (mathruler imports it) in /tmp/gen/stub. Usage: python3 gen_geo3k_crosscheck.py OUT.json [PAIRS_MODULE]
"""
import sys, json, re, signal
sys.path.insert(0, '/tmp/pyref')
sys.path.insert(0, __import__('os').path.dirname(__file__)); sys.path.insert(0, '/tmp/gen/stub')
from mathruler.grader import extract_boxed_content, grade_answer
import importlib
answers, truths = (lambda m: (m.answers, m.truths))(importlib.import_module(sys.argv[2] if len(sys.argv) > 2 else 'geo3k_crosscheck_pairs'))
def format_reward(s):
    return 1.0 if re.fullmatch(re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL), s) else 0.0
class TO(Exception): pass
def h(*a): raise TO()
signal.signal(signal.SIGALRM, h)
cases=[]
import random
random.seed(7)
templates = ["<think>r</think> The answer is \\boxed{%s}", "\\boxed{%s}", "<think>r</think> \\boxed{%s} done"]
n=0
for t in truths:
    for a in answers:
        resp = random.choice(templates) % a
        signal.alarm(5)
        try:
            ex = extract_boxed_content(resp)
            acc = 1.0 if grade_answer(ex, t) else 0.0
            signal.alarm(0)
        except TO:
            continue
        fmt = format_reward(resp)
        cases.append({"name": f"pair_{n}", "description": f"{a!r} vs {t!r}", "response": resp, "ground_truth": t, "extracted": ex, "format": fmt, "acc": acc, "score": (1.0-0.1)*acc + 0.1*fmt})
        n+=1
print(len(cases), sum(c['acc'] for c in cases), file=sys.stderr)
doc = {"format_version": 1, "provenance": {"reference": "mathruler 0.1.0 grader.extract_boxed_content + grade_answer (the grader verl's geo3k reward calls), geo3k's format regex and score formula", "mathruler_version": "0.1.0", "sympy_version": "1.14.0", "pylatexenc_version": "2.11", "generator": "flowrl algorithms: cross product of answer forms x ground truths"}, "notes": ["Same fields as geo3k_reward.json; acc from mathruler.grader.grade_answer(extract_boxed_content(response), ground_truth); format from re.fullmatch(r'<think>.*</think>.*\\\\boxed\\{.*\\}.*', DOTALL); score = 0.9*acc + 0.1*format."], "cases": cases}
json.dump(doc, open(sys.argv[1], 'w'), indent=0, ensure_ascii=False)
