"""Writes the small .npy files that tests/lua/test_readers.lua loads
(tests/ref/npy_*.npy), with NumPy itself, so the reader is checked against
the real format. Run: /usr/bin/python3 scripts/gen_npy_ref.py"""
import os
import numpy as np

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref")
np.save(os.path.join(here, "npy_f32.npy"), (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 4)
np.save(os.path.join(here, "npy_i64.npy"), np.array([[1, -2], [3, 2**40]], dtype=np.int64))
np.save(os.path.join(here, "npy_bool.npy"), np.array([True, False, True]))
np.save(os.path.join(here, "npy_u8_0d.npy"), np.array(7, dtype=np.uint8))
np.save(os.path.join(here, "npy_f64_empty.npy"), np.zeros((0, 3), dtype=np.float64))
np.save(os.path.join(here, "npy_fortran.npy"), np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
np.save(os.path.join(here, "npy_big_endian.npy"), np.ones(3, dtype=">f4"))
