#!/bin/bash
mkdir -p /app/done
