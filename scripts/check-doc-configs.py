#!/usr/bin/env python3
"""The whole configs the manual shows are valid.

Usage: check-doc-configs.py ONCEPROXY_BINARY DOC.md...

Every ```yaml block of the given documents that is a whole config (it has top-level
`upstreams:` and `routes:` or `egress:` lines) is written to a file and checked with `onceproxy --check-config`. Exit 1
with onceproxy's errors when one does not load, 0 otherwise.
"""
import pathlib
import re
import subprocess
import sys
import tempfile

binary, docs = sys.argv[1], sys.argv[2:]
checked = 0
failed = False
with tempfile.TemporaryDirectory() as tmp:
    for doc in docs:
        text = pathlib.Path(doc).read_text()
        for n, block in enumerate(re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)):
            if not (re.search(r"^upstreams:", block, re.M)
                    and re.search(r"^(routes|egress):", block, re.M)):
                continue
            path = pathlib.Path(tmp) / f"{pathlib.Path(doc).stem}-{n}.yaml"
            path.write_text(block)
            r = subprocess.run([binary, "--check-config", str(path)], capture_output=True,
                               text=True, timeout=20)
            checked += 1
            if r.returncode != 0:
                failed = True
                print(f"{doc}: yaml block {n + 1} does not load:\n{r.stdout}{r.stderr}")
if checked == 0:
    sys.exit("no whole config found in " + ", ".join(docs))
if failed:
    sys.exit(1)
print(f"{checked} configs in the docs load")
