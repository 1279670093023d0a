#!/bin/bash
echo two >> /app/list.txt
