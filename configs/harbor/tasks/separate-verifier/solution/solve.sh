#!/bin/bash
echo 'answer = 42' > /app/answer.txt
# Outside the working directory: a separate verifier's container never sees this.
echo planted > /etc/agent-was-here
