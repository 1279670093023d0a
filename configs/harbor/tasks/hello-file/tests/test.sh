#!/bin/bash
# Reward 1 when /app/hello.txt holds exactly the greeting.
echo "greeting: $GREETING"
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "$GREETING" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
