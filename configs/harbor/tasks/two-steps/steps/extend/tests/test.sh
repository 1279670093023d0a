#!/bin/bash
if [ "$(cat /app/list.txt 2>/dev/null)" = "$(printf 'one\ntwo')" ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
