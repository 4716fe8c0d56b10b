"""Writes the benchmark's prompts: the first N rows of the embedded shapes task (verl schema),
their images upscaled to SIZE x SIZE (bicubic) so the vision tower does real work
(224 px -> 16x16 patches -> 64 image tokens). Both flowrl and the Python side read this file.

usage: make_prompts.py SRC.parquet OUT.parquet N SIZE [--json OUT.json]

`--json` also writes the same rows as JSON (image bytes in base64), which common.load_prompts reads
on a machine without pyarrow (bench/gpu/check.sh ships such a copy).
"""

import base64
import io
import json
import sys

import pyarrow.parquet as pq
from PIL import Image


def main():
    args = sys.argv[1:]
    json_out = None
    if "--json" in args:
        i = args.index("--json")
        json_out = args[i + 1]
        del args[i : i + 2]
    src, out, n, size = args[0], args[1], int(args[2]), int(args[3])
    table = pq.read_table(src).slice(0, n)
    rows = table.to_pylist()
    for row in rows:
        for img in row["images"]:
            im = Image.open(io.BytesIO(img["bytes"])).convert("RGB")
            im = im.resize((size, size), Image.BICUBIC)
            buf = io.BytesIO()
            im.save(buf, format="PNG")
            img["bytes"] = buf.getvalue()
    pq.write_table(type(table).from_pylist(rows, schema=table.schema), out)
    print(f"wrote {out}: {len(rows)} prompts, {size}x{size} images")
    if json_out:
        for row in rows:
            for img in row["images"]:
                img["bytes"] = base64.b64encode(img["bytes"]).decode("ascii")
        with open(json_out, "w") as f:
            json.dump(rows, f)
        print(f"wrote {json_out}: the same rows as JSON")


if __name__ == "__main__":
    main()
