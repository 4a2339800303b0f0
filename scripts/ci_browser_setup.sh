#!/usr/bin/env bash
# Set up a fresh Debian CI machine for rlkit's browser tier (tests/test_browser.py: JupyterLab in a headless
# Chromium) and for the static PNGs beside plotly figures (rlkit.viz.static, kaleido): Debian's own Chromium
# and chromedriver, from apt. Nothing is downloaded from anywhere else (selenium is given the driver's path, so
# selenium-manager never runs; kaleido uses this Chromium). Debian only: Ubuntu's "chromium" is a snap stub.
# The Python side (selenium) comes with the dev extra: pip install -e '.[dev]'.
# Then: python -m pytest -m browser tests/test_browser.py -p no:cacheprovider
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y chromium chromium-driver

test -x /usr/bin/chromium && test -x /usr/bin/chromedriver
/usr/bin/chromium --version 2>/dev/null || true
/usr/bin/chromedriver --version
