"""Shared pieces of the Python reference side: the prompts (read from the same parquet file as
flowrl, verl schema) and the model/processor (the same Hugging Face directory flowrl loads)."""

import base64
import io
import json
import os
import time

import torch
from PIL import Image


def set_threads(threads: int):
    """Intra-op and inter-op threads of torch, to the Rust side's thread count."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def verl_messages_to_hf(messages):
    """verl's `<image>` placeholders in a message's text become `{"type": "image"}` content
    items in order (what verl's and flowrl's prompt encoders do)."""
    out = []
    for m in messages:
        parts = m["content"].split("<image>")
        content = []
        for i, text in enumerate(parts):
            if i > 0:
                content.append({"type": "image"})
            if text:
                content.append({"type": "text", "text": text})
        out.append({"role": m["role"], "content": content})
    return out


def load_prompts(path, count):
    """The first `count` rows: (hf_messages, [PIL images], ground_truth). `path` is a parquet
    file, or the JSON copy `make_prompts.py --json` writes (image bytes in base64; for machines
    without pyarrow)."""
    if path.endswith(".json"):
        with open(path) as f:
            rows = json.load(f)[:count]
        for r in rows:
            for i in r["images"]:
                i["bytes"] = base64.b64decode(i["bytes"])
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).slice(0, count).to_pylist()
    out = []
    for r in rows:
        images = [Image.open(io.BytesIO(i["bytes"])).convert("RGB") for i in r["images"]]
        out.append((verl_messages_to_hf(r["prompt"]), images, r["reward_model"]["ground_truth"]))
    return out


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


class Timer:
    """Wall seconds of a `with` block (`.s`). `sync` (e.g. `torch.cuda.synchronize`) is called
    at both ends, so that work queued on an asynchronous device is inside the measurement."""

    def __init__(self, sync=None):
        self.sync = sync

    def __enter__(self):
        if self.sync is not None:
            self.sync()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.sync is not None:
            self.sync()
        self.s = time.perf_counter() - self.t0


def write_json(path, value):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
