#!/usr/bin/env bash
# Regenerates the measured results in docs/benchmarks.md on this machine:
#   docs/bench/results.json  + docs/img/bench.png   (default placement, sizes $SIZES)
#   docs/bench/aliasing.json                         ((dst - src) mod 4096 cycling over the 'mixed' set)
#   docs/bench/ucx.txt                               (ucx_info-style block for the automatic choice)
# and splices the text tables between the <!-- results:... --> markers of docs/benchmarks.md.
# Usage: tools/regen_benchmarks.sh        (after tools/dev_build.sh, or with fastcopy installed)
#        SIZES=64:256M:x4 REPEATS=7 tools/regen_benchmarks.sh
# Takes a few minutes; run it on a quiet machine (the header records the load average).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
SIZES=${SIZES:-64:256M:x4}
REPEATS=${REPEATS:-5}
ALIAS_SIZES=${ALIAS_SIZES:-1K:1M:x4}
mkdir -p docs/bench docs/img

python -m fastcopy bench --sizes "$SIZES" --repeats "$REPEATS" \
  --json docs/bench/results.json --plot docs/img/bench.png | tee docs/bench/results.txt
python -m fastcopy bench --sizes "$ALIAS_SIZES" --repeats "$REPEATS" --offsets mixed \
  --variants fastcopy,kernels,copyto --json docs/bench/aliasing.json | tee docs/bench/aliasing.txt
python -m fastcopy bench --format ucx --sizes 4K:64M:x4 --repeats 3 | tee docs/bench/ucx.txt

python - <<'EOF'
import re
doc = open("docs/benchmarks.md").read()
for name in ("results", "aliasing", "ucx"):
    body = open(f"docs/bench/{name}.txt").read().rstrip("\n")
    body = re.sub(r"\n\nsaved \d+ results.*|\nplot written to .*", "", body)
    block = f"<!-- {name}:begin -->\n```text\n{body}\n```\n<!-- {name}:end -->"
    doc, n = re.subn(rf"<!-- {name}:begin -->.*?<!-- {name}:end -->", lambda m: block, doc, flags=re.S)
    if n != 1:
        raise SystemExit(f"docs/benchmarks.md: markers for {name} not found")
open("docs/benchmarks.md", "w").write(doc)
print("docs/benchmarks.md updated")
EOF
