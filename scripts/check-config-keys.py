#!/usr/bin/env python3
"""Every key the config reader accepts is documented.

The reader names the keys of each YAML mapping once, in `w_.mapping(field, {...})` calls of
src/config/config_reader.cpp. Each of those keys must appear in conf/example.yaml (as `key:`)
or in docs/configuration.md (as `key`), so a new setting cannot ship undocumented. Exit 1 with
the missing keys listed, 0 otherwise.
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
reader = (root / "src/config/config_reader.cpp").read_text()
example = (root / "conf/example.yaml").read_text()
reference = (root / "docs/configuration.md").read_text()

keys = set()
for call in re.finditer(r"mapping\(\s*[\w.]+\s*,\s*\{([^}]*)\}", reader, re.S):
    keys.update(re.findall(r'"([a-z_0-9]+)"', call.group(1)))
if len(keys) < 50:
    sys.exit(f"found only {len(keys)} keys in config_reader.cpp: the pattern no longer matches")

missing = sorted(
    k for k in keys
    if not re.search(rf"(^|[\s{{,#])(- )?{k}:", example, re.M)
    and not re.search(rf"`([\w.\[\]]*\.)?{k}`", reference)
)
if missing:
    print("config keys accepted by src/config/config_reader.cpp but documented neither in "
          "conf/example.yaml nor in docs/configuration.md:")
    for k in missing:
        print("  " + k)
    sys.exit(1)
print(f"{len(keys)} config keys, each in conf/example.yaml or docs/configuration.md")
