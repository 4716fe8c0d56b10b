#!/usr/bin/env python3
"""An image judge as a flowrl reward, run as an `exec` node with `images = true`
(docs/exec-protocol.md, "Images"). Plain Python 3, standard library only.

With `images = true` on its node, the request's rollouts carry `images`: per response, the
absolute paths of its prompt's pictures as PNG files (and `tool_images`, the pictures tools
returned in a multi-turn rollout). This program reads them and scores each response

    score = (1 - brightness_weight) * acc + brightness_weight * brightness

* acc        = 1 when the response's last \\boxed{...} holds the ground truth, else 0;
* brightness = the mean brightness (0 to 1) of the prompt's pictures, decoded by the small PNG
               reader below (zlib from the standard library).

The brightness term stands in for a real judge. It is the same for every response to a prompt,
so it leaves GRPO's group-normalised advantages unchanged. To judge for real, replace `judge()`
with a model that looks at the picture; load it on the first request rather than before the
handshake (flowrl waits `start_timeout_s` for the handshake). CLIP (pip install open_clip_torch):

    import open_clip, torch
    from PIL import Image
    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained="openai")
    tokenizer = open_clip.get_tokenizer("ViT-B-32")

    def judge(paths, response, ground_truth, params):
        image = preprocess(Image.open(paths[0])).unsqueeze(0)
        with torch.no_grad():
            sim = torch.cosine_similarity(model.encode_image(image),
                                          model.encode_text(tokenizer([response])))
        return float(sim.clamp(0, 1)), {"clip": float(sim)}

or a vision-language model behind an API (give the node a `timeout_s` that covers the calls):

    import base64, openai
    client = openai.OpenAI()

    def judge(paths, response, ground_truth, params):
        png = base64.b64encode(open(paths[0], "rb").read()).decode()
        question = "Does this answer fit the picture? Reply 1 or 0.\\n" + response
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + png}},
                        {"type": "text", "text": question}]}])
        verdict = float(reply.choices[0].message.content.strip() == "1")
        return verdict, {"verdict": verdict}

The files are flowrl's: read them while answering the request (by default only the latest step's
are kept). Logs go to stderr: stdout is reserved for the protocol.
"""

import json
import struct
import sys
import zlib

NAME = "image_judge"

HELLO = {"hello": {
    "protocol": 2, "name": NAME, "version": "1.0.0",
    "doc": "Exact-match reward plus a term read from the prompt's pictures (images = true).",
    "inputs": [{"name": "rollouts", "type": "Rollouts", "doc": "the responses, with image paths"}],
    "outputs": [{"name": "scores", "type": "Scores",
                 "doc": "one score per response (+ acc, brightness)"}],
    "params": [{"name": "brightness_weight", "type": "float", "default": 0.1,
                "min": 0.0, "max": 1.0,
                "doc": "weight of the pictures' mean brightness; accuracy gets the rest"}],
}}

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type: grey, RGB, grey + alpha, RGBA


def png_rows(path):
    """(channels, rows of bytes) of an 8-bit, non-interlaced PNG file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data[pos + 8:pos + 21])
        elif kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or interlace or colour not in CHANNELS:
        raise ValueError(f"{path}: only 8-bit, non-interlaced grey or RGB(A) PNGs are read here")
    n = CHANNELS[colour]
    raw, stride = zlib.decompress(idat), width * n
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for x in range(stride):  # undo the row's filter, left to right
            a, b = row[x - n] if x >= n else 0, prev[x]
            c = prev[x - n] if x >= n else 0
            if kind == 1:
                row[x] = (row[x] + a) & 255
            elif kind == 2:
                row[x] = (row[x] + b) & 255
            elif kind == 3:
                row[x] = (row[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(row)
        prev = row
    return n, rows


def brightness(path):
    """Mean of the colour channels (alpha left out), from 0 to 1."""
    n, rows = png_rows(path)
    colour = [v for row in rows for i, v in enumerate(row) if n in (1, 3) or i % n != n - 1]
    return sum(colour) / (255.0 * len(colour))


def boxed(text):
    """The content of the last \\boxed{...}, brace-matched and stripped; None without one."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, content = 0, text[start + len("\\boxed{"):]
    for i, ch in enumerate(content):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return content[:i].strip()
    return None


SEEN = {}  # path -> brightness, for one request (the n responses to a prompt share its pictures)


def judge(paths, response, ground_truth, params):
    """One response's score and its components (the same names for every response)."""
    for p in paths:
        if p not in SEEN:
            SEEN[p] = brightness(p)
    light = sum(SEEN[p] for p in paths) / len(paths) if paths else 0.0
    acc = float(boxed(response) == ground_truth.strip())
    w = params["brightness_weight"]
    return (1.0 - w) * acc + w * light, {"acc": acc, "brightness": light}


def handle(request):
    r = request["inputs"]["rollouts"]
    if "images" not in r:
        raise ValueError("the request has no `images`: set `images = true` on this exec node")
    SEEN.clear()
    scores, components = [], {}
    for paths, response, truth in zip(r["images"], r["response"], r["ground_truth"]):
        score, parts = judge(paths, response, truth, request["params"])
        scores.append(score)
        for name, value in parts.items():
            components.setdefault(name, []).append(value)
    return {"outputs": {"scores": {"scores": scores, "components": components}},
            "metrics": {"judge/pictures_read": float(len(SEEN))}}


def main():
    print(json.dumps(HELLO), flush=True)
    for line in sys.stdin:  # one request per step (or per chunk for validation)
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            answer = handle(request)
        except Exception as e:  # the step fails with this message
            answer = {"error": f"{type(e).__name__}: {e}"}
        answer["step"] = request["step"]
        print(json.dumps(answer, allow_nan=False), flush=True)
        print(f"[{NAME}] step {request['step']}: {len(request['inputs']['rollouts']['response'])} "
              f"responses", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
