#!/bin/bash
id -un > /home/agent/work/whoami.txt
