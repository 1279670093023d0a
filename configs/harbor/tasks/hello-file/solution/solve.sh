#!/bin/bash
printf '%s\n' "$GREETING" > /app/hello.txt
