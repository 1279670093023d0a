#!/bin/bash
# Two keys: "reward" (the share of the two content checks that pass) and "style" (1 when the file ends with a
# newline).
f=/work/report.md
ok=0
[ "$(sed -n 1p "$f" 2>/dev/null)" = "# Report" ] && ok=$((ok + 1))
grep -qx 'status: ok' "$f" 2>/dev/null && ok=$((ok + 1))
style=0
[ -s "$f" ] && [ "$(tail -c 1 "$f" | od -An -c | tr -d ' ')" = '\n' ] && style=1
python3 -c "import json; print(json.dumps({'reward': $ok / 2, 'style': $style}))" > /logs/verifier/reward.json
