#!/usr/bin/env python3
"""Writes docs/malformed-census.md: every spec-error test and the message it asserts.

Reads tests/malformed.rs, tests/featurizer_spec.rs, tests/hostile.rs, tests/hostile_files.rs,
tests/hostile_compact.rs and tests/domain.rs; run it from the
repository root after adding a case.
"""
import re
rows=[]
for f in ['tests/malformed.rs','tests/featurizer_spec.rs','tests/hostile.rs','tests/hostile_files.rs','tests/hostile_compact.rs','tests/domain.rs']:
    s=open(f).read()
    # A test's body runs to the next test (or the end): enough to find its assertions.
    for m in re.finditer(r'#\[test\]\s*fn (\w+)\(\)\s*\{(.*?)(?=#\[test\]|\Z)', s, re.S):
        name, body = m.group(1), m.group(2)
        needles=[]
        for a in re.finditer(r'assert_error\(\s*&?[^;]*?&\[(.*?)\]\s*,?\s*\)', body, re.S):
            parts=re.findall(r'"((?:[^"\\]|\\.)*)"', a.group(1))
            msg=[p for p in parts if not re.match(r'spec\.yaml:\d+', p)]
            if msg: needles.append(' ... '.join(msg))
        for a in re.finditer(r'refused\([^;]*?&\[(.*?)\]\s*,?\s*\)', body, re.S):
            parts=re.findall(r'"((?:[^"\\]|\\.)*)"', a.group(1))
            if parts: needles.append(' ... '.join(parts))
        if needles:
            rows.append((f.split('/')[-1].replace('.rs',''), name, needles[0]))
out=[]
for a,b,c in rows:
    c=c.replace('|','\\|').replace('`',"'").replace('\\"','"')
    out.append('| %s | %s | %s |' % (a, b.replace('_',' '), c))
head = [
    "# Malformed and hostile specs: the census",
    "",
    "Every class of bad spec or hostile input that a test covers, and the message (or",
    "its fragments, joined by ...) the test asserts; each spec error also names its",
    "file:line:col. Written by `scripts/census.py` from the tests themselves.",
    "",
    "%d classes: %s." % (len(rows), ", ".join("%d in `tests/%s.rs`" % (sum(1 for r in rows if r[0] == f), f)
                                         for f in ("malformed", "featurizer_spec", "hostile", "hostile_files", "hostile_compact", "domain"))),
    "",
    "| test file | case | message |",
    "|---|---|---|",
]
tail = [
    "",
    "Covered outside these files, with the message asserted:",
    "",
    "| test | case | message |",
    "|---|---|---|",
    "| `exec/tests/changed_input.rs` | a sample truncated while mapped (SIGBUS) | <file>: it was truncated while it was read |",
    "| `exec/tests/changed_input.rs` | a sample written in place while read | <file>: it was written to while it was read |",
    "| `tests/hostile_files.rs` | `assemble --out` a FIFO, a link or a folder | <out> exists and is not a regular file / is a symbolic link |",
    "| `tests/hostile_files.rs` | SIGTERM or SIGINT during `shard` | exit 128 + the signal, no staging folder left |",
    "| `tests/python/test_blocks.py` | a placed tensor resized, or its storage freed | feature '<name>': its tensor was resized or its storage freed |",
    "| `tests/python/test_blocks.py` | owner counts that wrap, in `place` and `Plan.layout` | feature 'atom_counts_per_token' ... overflow; owner counts sum past |",
    "| `tests/python/test_blocks.py` | a sparse tensor's coordinate past the end or negative (checked before any coalescing) | feature 'token_bonds': element N: coordinate 74 along axis 1 is outside its 73 items |",
    "| `tests/python/test_blocks.py` | a sparse tensor of another size | feature 'token_bonds': given as a sparse tensor of shape [100, 100, 1], but the sample's other features make it [73, 73, 1] |",
    "| `tests/python/test_blocks.py` | a sparse feature given as a tensor and as its elements | feature 'token_bonds': given both as a sparse tensor and as its elements ('token_bonds.indices') |",
    "| `tests/python/test_blocks.py` | `blocks.place` with a 2^31-long feature beside a map given as indices | axis 0 (tokens): 'tokens' length 2147483648 is more than the limit of 134217728 |",
    "| `tests/python/test_blocks.py` | `block_window` off the mesh, `replica_indices` with dp 0, `repad_indices` with stride 0 or shrinking | coord: ...; dp: ...; old: ...; new: ... |",
    "| `tests/python/test_distributed.py` | a rank file missing a feature, holding an unlisted one, or its encoding forged (checksums recomputed), in `PreshardedDataset` and `assemble` | feature 'res_type': in the manifest, not in the rank file; holds 'smuggled', which the manifest does not list; feature 'affinity_token_mask': the rank file holds [10] uint8, the manifest says [73] float32 |",
]
open("docs/malformed-census.md", "w").write("\n".join(head + out + tail) + "\n")
print(len(rows))
