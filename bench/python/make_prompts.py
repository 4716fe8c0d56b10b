"""Writes the benchmark's prompts: the first N rows of the embedded shapes task (verl schema),
their images upscaled to SIZE x SIZE (bicubic) so the vision tower does real work
(224 px -> 16x16 patches -> 64 image tokens). Both flowrl and the Python side read this file.

usage: make_prompts.py SRC.parquet OUT.parquet N SIZE
"""

import io
import sys

import pyarrow.parquet as pq
from PIL import Image


def main():
    src, out, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
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


if __name__ == "__main__":
    main()
