#!/bin/bash
# The probe: does the container have any network besides loopback? Under no-network it must not.
# reward: the work; network: 1 when an interface other than lo exists.
net=0
for i in /sys/class/net/*; do [ "$(basename "$i")" != lo ] && net=1; done
r=0
[ "$(cat /app/probe.txt 2>/dev/null)" = probe ] && r=1
echo "{\"reward\": $r, \"network\": $net}" > /logs/verifier/reward.json
