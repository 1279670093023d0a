#!/bin/bash
# pytest from outside /app, with the task's own test file; reward 1 when it passes.
cd /tests
if python3 -m pytest -q -p no:cacheprovider /tests/test_fizzbuzz.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
