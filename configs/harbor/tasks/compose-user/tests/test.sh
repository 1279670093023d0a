#!/bin/bash
# The agent runs as "agent" (task.toml), the tests as root: "root" is 1 when the tests ran as root.
r=0
[ "$(cat /home/agent/work/whoami.txt 2>/dev/null)" = agent ] && r=1
root=0
[ "$(id -u)" = 0 ] && root=1
echo "{\"reward\": $r, \"root\": $root}" > /logs/verifier/reward.json
