#!/usr/bin/python3
"""Prepares a text corpus as token files for `dataset.name: tokens`.

Reads every *.txt file under SOURCE (default: the reStructuredText sources of
Python's documentation, /usr/share/doc/python3.11/html/_sources, about 11 MB
of English from Debian's python3.11-doc), in sorted order, and writes byte-level
tokens (each byte its own id, vocabulary 256) as flat little-endian uint16:

  OUT/train.bin   the first 90% of the bytes
  OUT/val.bin     the last 10%
  OUT/meta.json   where they came from, the counts, the vocabulary

Each file is written beside its name and renamed into place. Then:

  geotrain local --model gpt --set dataset.path=OUT

Usage: prepare-text.py OUT [--source DIR] [--limit BYTES] [--val-fraction F]
"""
import argparse
import json
import os
import sys
from array import array

DEFAULT_SOURCE = "/usr/share/doc/python3.11/html/_sources"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder for train.bin, val.bin and meta.json")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help=f"folder of .txt files read recursively (default: {DEFAULT_SOURCE}, "
                             "Debian's python3.11-doc)")
    parser.add_argument("--limit", type=int, default=0,
                        help="at most this many bytes of text (0: all)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="the share of the text, from its end, kept for validation (0..0.5)")
    args = parser.parse_args()
    if not 0 < args.val_fraction <= 0.5:
        sys.exit(f"prepare-text: --val-fraction {args.val_fraction} is not allowed (allowed: (0, 0.5])")
    if not os.path.isdir(args.source):
        hint = " (apt-get install python3.11-doc)" if args.source == DEFAULT_SOURCE else ""
        sys.exit(f"prepare-text: {args.source}: no such folder{hint}")

    files = sorted(os.path.join(d, f) for d, _, names in os.walk(args.source)
                   for f in names if f.endswith(".txt"))
    if not files:
        sys.exit(f"prepare-text: {args.source}: no .txt files")
    text = bytearray()
    for path in files:
        with open(path, "rb") as f:
            text += f.read()
        text += b"\n"
        if args.limit and len(text) >= args.limit:
            del text[args.limit:]
            break
    cut = int(len(text) * (1 - args.val_fraction))
    if cut < 2 or len(text) - cut < 2:
        sys.exit(f"prepare-text: {len(text)} bytes of text is too little to split")

    os.makedirs(args.out, exist_ok=True)

    def write(name, data):
        tmp = os.path.join(args.out, name + ".partial")
        with open(tmp, "wb") as f:
            data(f)
        os.replace(tmp, os.path.join(args.out, name))

    def tokens(part):
        ids = array("H", iter(part))  # uint16, one id per byte (bytes would be read as raw memory)
        if sys.byteorder != "little":
            ids.byteswap()
        return ids.tofile

    write("train.bin", tokens(text[:cut]))
    write("val.bin", tokens(text[cut:]))
    meta = {"source": args.source, "files": len(files), "tokenizer": "bytes", "vocabulary": 256,
            "tokenBytes": 2, "trainTokens": cut, "valTokens": len(text) - cut}
    write("meta.json", lambda f: f.write((json.dumps(meta, indent=2) + "\n").encode()))
    print(f"prepare-text: {len(files)} files, {cut} training and {len(text) - cut} validation "
          f"tokens (bytes) in {args.out}")


if __name__ == "__main__":
    main()
