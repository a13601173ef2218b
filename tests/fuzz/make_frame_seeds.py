#!/usr/bin/env python3
"""Writes the seed corpora of the transport's fuzz targets.

tests/fuzz/corpus/frame/ (frame_fuzzer.cc): each seed is the fuzzer's 18
control bytes followed by a header frame (layouts in tests/fuzz/frame_fuzzer.cc
and worker/transport/frame.h).
tests/fuzz/corpus/assembler/ (assembler_fuzzer.cc): each seed is a script of
6-byte chunk descriptions (layout in tests/fuzz/assembler_fuzzer.cc).
Re-run after a change to any of these layouts:
python3 tests/fuzz/make_frame_seeds.py
"""
import pathlib
import struct

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "frame"
ASSEMBLER_OUT = OUT.parent / "assembler"
MAGIC, VERSION = 0x544F4547, 2
KINDS = {"ping": 1, "pong": 2, "update": 16, "gossip": 17, "gossip-reply": 18, "control": 19,
         "lan-reduce": 20, "lan-broadcast": 21}


def fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


JOB = fnv1a64("fuzz-job")


def header(kind, codec, elements, payload, job=JOB, rnd=3, step=700, sender=1, offset=0,
           version=VERSION):
    return struct.pack("<IHHQQQIHHQQQ", MAGIC, version, kind, job, rnd, step, sender, codec, 0,
                       elements, payload, offset)


def control(flags=0, world=4, payload=0, max_payload=0):
    return struct.pack("<BBQQ", flags, world, payload, max_payload)


def chunk(sender, rnd, payload, offset_256ths, size_256ths):
    return struct.pack("<BBHBB", sender, rnd, payload, offset_256ths, size_256ths)


def assembler_seeds():
    """Chunk scripts: in order, interleaved, restarted, with a gap, repeated."""
    quarters = [chunk(1, 0, 1024, 64 * i, 64 if i < 3 else 255) for i in range(4)]
    other = [chunk(2, 1, 4096, 128 * i, 128 if i == 0 else 255) for i in range(2)]
    return {
        "whole": chunk(0, 0, 1000, 0, 255),
        "empty": chunk(0, 0, 0, 0, 0),
        "in_order": b"".join(quarters),
        "interleaved": b"".join(q + o for q, o in zip(quarters, other + other)),
        "restarted": quarters[0] + quarters[1] + b"".join(quarters),
        "gap": quarters[0] + quarters[2] + quarters[3],
        "repeated": quarters[0] + quarters[1] + quarters[1] + quarters[2] + quarters[3],
        "other_round": quarters[0] + chunk(1, 2, 1024, 64, 64) + b"".join(quarters[1:]),
    }


def main():
    ASSEMBLER_OUT.mkdir(parents=True, exist_ok=True)
    for old in ASSEMBLER_OUT.iterdir():
        old.unlink()
    for name, data in assembler_seeds().items():
        (ASSEMBLER_OUT / name).write_bytes(data)

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
    # Chunks of a payload of 3 chunks: the first, a middle one, the last one
    # (short), one that does not fit, and the same with a chunk size taken
    # from the header (flag 1: payloadBytes - payloadOffset).
    big = 3 * (1 << 22) - 100
    for name, offset, chunk in (("first", 0, 1 << 22), ("middle", 1 << 22, 1 << 22),
                                ("last", 2 << 22, (1 << 22) - 100),
                                ("past_end", 2 << 22, 1 << 22)):
        seeds[f"chunk_{name}"] = control(payload=chunk) + header(16, 0, big, big, offset=offset)
    seeds["chunk_selfref"] = control(flags=5) + header(16, 1, 1000, 4000, offset=1000)
    seeds["chunk_empty"] = control(payload=0) + header(16, 0, 8, 8, offset=8)
    seeds["version_1"] = control(payload=8) + header(16, 0, 8, 8, version=1)
    full = control(payload=1024) + header(16, 1, 256, 1024)
    for length in (0, 1, 4, 8, 32, 48, 63):
        seeds[f"truncated_{length}"] = full[:18 + length]
    seeds["oversized_65"] = full + b"\0"
    seeds["control_only"] = control(flags=7)
    for name, data in seeds.items():
        (OUT / name).write_bytes(data)


if __name__ == "__main__":
    main()
