#!/usr/bin/env python3
"""Writes the seed corpus of the codec fuzz target.

tests/fuzz/corpus/codec/ (codec_fuzzer.cc): each seed is the fuzzer's 3
control bytes (codec, model layout, QSGD bucket) followed by a payload or an
XOR mask over an honest encoding (layout in tests/fuzz/codec_fuzzer.cc).
Re-run after a change to that layout:
python3 tests/fuzz/make_codec_seeds.py
"""
import pathlib
import struct

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "codec"
CODECS = {"identity": 0, "fp16": 1, "bf16": 2, "qsgd2": 3, "qsgd4": 4, "qsgd8": 5}
HONEST, L2 = 16, 8
NAN = struct.pack("<f", float("nan"))
INF = struct.pack("<f", float("inf"))
NEG = struct.pack("<f", -1.0)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    seeds = {}
    for name, c in CODECS.items():
        for layout in (0, 3, 0x13):
            # An honest encoding, untouched: must be accepted.
            seeds[f"{name}_honest_l{layout:x}"] = bytes([c | HONEST, layout, 63])
            # The same with the first four bytes (a QSGD scale, or a raw
            # float) XORed with the bit patterns of NaN, infinity and -1.
            for what, v in (("nan", NAN), ("inf", INF), ("neg", NEG)):
                seeds[f"{name}_{what}_l{layout:x}"] = bytes([c | HONEST, layout, 63]) + v
            # Raw bytes: too short, and all ones.
            seeds[f"{name}_raw_short_l{layout:x}"] = bytes([c, layout, 63]) + b"\x00" * 7
        if name.startswith("qsgd"):
            seeds[f"{name}_l2_honest"] = bytes([c | HONEST | L2, 3, 0])
            seeds[f"{name}_bucket1_honest"] = bytes([c | HONEST, 3, 0])
            seeds[f"{name}_bucket256_flip"] = bytes([c | HONEST, 3, 255]) + b"\x00" * 9 + b"\xff"
    for name, data in seeds.items():
        (OUT / name).write_bytes(data)


if __name__ == "__main__":
    main()
