#!/bin/bash
# Writes both files: reward.txt always says 0, reward.json says whether the work is done. Harbor reads
# reward.json when both exist, so the reward is the JSON's.
echo 0 > /logs/verifier/reward.txt
if [ -d /app/done ]; then r=1; else r=0; fi
echo "{\"reward\": $r}" > /logs/verifier/reward.json
