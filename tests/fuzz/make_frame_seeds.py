#!/usr/bin/env python3
"""Writes the seed corpus of frame_fuzzer.cc into tests/fuzz/corpus/frame/.

Each seed is the fuzzer's 18 control bytes followed by a header frame (layouts
in tests/fuzz/frame_fuzzer.cc and worker/transport/frame.h). Re-run after a
change to either layout: python3 tests/fuzz/make_frame_seeds.py
"""
import pathlib
import struct

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "frame"
MAGIC, VERSION = 0x544F4547, 1
KINDS = {"ping": 1, "pong": 2, "update": 16, "gossip": 17, "gossip-reply": 18, "control": 19,
         "lan-reduce": 20, "lan-broadcast": 21}


def fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


JOB = fnv1a64("fuzz-job")


def header(kind, codec, elements, payload, job=JOB, rnd=3, step=700, sender=1):
    return struct.pack("<IHHQQQIHHQQQ", MAGIC, VERSION, kind, job, rnd, step, sender, codec, 0,
                       elements, payload, 0)


def control(flags=0, world=4, payload=0, max_payload=0):
    return struct.pack("<BBQQ", flags, world, payload, max_payload)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    seeds = {}
    # A valid header for each codec: {codec: (id, elements, payload bytes)}.
    codecs = {"raw": (0, 8, 8), "fp32": (1, 256, 1024), "fp16": (2, 300, 600),
              "bf16": (3, 5, 10), "qsgd": (4, 1000, 520)}
    for name, (codec, elements, payload) in codecs.items():
        seeds[f"valid_{name}"] = control(payload=payload) + header(16, codec, elements, payload)
        # Same header, but the payload size and job hash come from the header
        # itself (flags 1 | 4) and the limit from the control bytes (flag 2).
        seeds[f"valid_{name}_selfref"] = (control(flags=7, world=255, max_payload=1 << 40) +
                                          header(17, codec, elements, payload, job=0x1234))
    for kind_name, kind in KINDS.items():
        seeds[f"valid_kind_{kind_name}"] = control(payload=8) + header(kind, 0, 8, 8)
    seeds["valid_empty_payload"] = control() + header(19, 0, 0, 0)
    full = control(payload=1024) + header(16, 1, 256, 1024)
    for length in (0, 1, 4, 8, 32, 48, 63):
        seeds[f"truncated_{length}"] = full[:18 + length]
    seeds["oversized_65"] = full + b"\0"
    seeds["control_only"] = control(flags=7)
    for name, data in seeds.items():
        (OUT / name).write_bytes(data)


if __name__ == "__main__":
    main()
