#!/bin/bash
echo probe > /app/probe.txt
