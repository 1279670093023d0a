#!/bin/bash
# A broken task: it rewards every agent, even one that did nothing.
echo 1 > /logs/verifier/reward.txt
