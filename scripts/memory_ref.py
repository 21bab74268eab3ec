#!/usr/bin/env python3
"""Brute-force reference of the memory store's vector scan (erinfer/memory_search.c), for tests/infer/test_memory.c.

Reads an int8 store's vectors straight out of the SQLite file with Python's sqlite3 module (each blob: the fp32
scale, little-endian, then dim int8 codes), ranks them by the exact dot product of the int8 codes with the query's
codes times both scales (in float64, the store's formula), ties broken by the smaller id, and prints the best k ids,
one per line.

usage: memory_ref.py STORE.db QUERY.json K
QUERY.json: {"codes": [dim ints], "scale": the query's fp32 scale}
"""
import json
import sqlite3
import sys

import numpy as np


def main():
    db, query, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    meta = dict(con.execute("SELECT key, value FROM mem_meta"))
    if meta.get("format") != "erinfer-memory" or meta.get("vec_type") != "int8":
        sys.exit(f"{db}: not an int8 erinfer memory store ({meta})")
    dim = int(meta["dim"])
    rows = con.execute("SELECT id, vec FROM entries WHERE vec IS NOT NULL ORDER BY id").fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    blobs = b"".join(r[1] for r in rows)
    rec = np.frombuffer(blobs, dtype=np.dtype([("scale", "<f4"), ("codes", "i1", (dim,))]))
    with open(query) as f:
        q = json.load(f)
    qcodes = np.array(q["codes"], dtype=np.int64)
    qscale = np.float64(np.float32(q["scale"]))
    dots = rec["codes"].astype(np.int64) @ qcodes
    scores = dots.astype(np.float64) * rec["scale"].astype(np.float64) * qscale
    order = np.lexsort((ids, -scores))[:k]
    for i in order:
        print(int(ids[i]))


if __name__ == "__main__":
    main()
