#!/bin/bash
if [ "$(cat /app/list.txt 2>/dev/null)" = one ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
