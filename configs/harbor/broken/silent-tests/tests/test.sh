#!/bin/bash
# A broken task: the tests run and write no reward file. A verifier failure, never a 0.
echo "checked nothing"
exit 0
