#!/usr/bin/env bash
# System packages the test suite needs beyond Python: a real RTSP server (GStreamer) for the RTSP tests.
# Installs them with apt-get when they are missing (as root, or through sudo). Without apt, the RTSP tests
# skip locally, and fail under CI=true.
set -euo pipefail
PKGS="python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly"
if /usr/bin/python3 -c 'import gi; gi.require_version("GstRtspServer", "1.0"); from gi.repository import GstRtspServer' 2>/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "[setup] no apt-get: install the GStreamer RTSP server packages yourself ($PKGS) or the RTSP tests skip"
  exit 0
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "[setup] installing the GStreamer RTSP server for the tests: $PKGS"
$SUDO apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
