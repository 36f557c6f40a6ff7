"""Writes the small token files that tests/lua/test_token_shards.lua reads
(tests/ref/tokens_*), with NumPy, in llm.c's .bin layout (a 256 x int32
header: magic 20240520, version 1 = uint16 / 2 = uint32 tokens, count;
then the tokens) and as .npy. Token i of each file is (i * 7919) % M.
Run: /usr/bin/python3 scripts/gen_token_ref.py"""
import os
import numpy as np

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref")


def tokens(n, modulus, dtype):
    return ((np.arange(n, dtype=np.int64) * 7919) % modulus).astype(dtype)


def write_bin(name, toks, version):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, version, len(toks)
    with open(os.path.join(here, name), "wb") as f:
        f.write(header.tobytes())
        f.write(toks.tobytes())


write_bin("tokens_u16.bin", tokens(1000, 50257, "<u2"), 1)
write_bin("tokens_u32.bin", tokens(777, 100003, "<u4"), 2)
np.save(os.path.join(here, "tokens_u2.npy"), tokens(500, 50257, "<u2"))
np.save(os.path.join(here, "tokens_i8.npy"), tokens(300, 100003, "<i8"))
