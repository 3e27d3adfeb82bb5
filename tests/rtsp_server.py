"""A real RTSP server on loopback for the ingest tests (GStreamer's gst-rtsp-server).

Run with Debian's /usr/bin/python3, not the project venv: PyGObject and the GStreamer
introspection data come from the Debian packages
  python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-{base,good,bad,ugly}

    /usr/bin/python3 tests/rtsp_server.py --port 8554 --file sample_videos/pedestrians.mp4

serves the H.264 MP4 at rtsp://127.0.0.1:PORT/stream (no re-encoding, paced by the clock), and
prints `READY rtsp://127.0.0.1:PORT/stream` on stdout once it listens. It stops on SIGTERM/SIGINT.
"""

import argparse
import os
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--file", required=True, help="an H.264 MP4 file")
    ap.add_argument("--mount", default="/stream")
    ap.add_argument("--address", default="127.0.0.1", help="the address to listen on (a test host's own)")
    args = ap.parse_args()
    path = os.path.abspath(args.file)
    if not os.path.isfile(path):
        print(f"rtsp_server: no such file: {path}", file=sys.stderr)
        return 2

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    # Each client gets the file from its start; config-interval=1 repeats SPS/PPS so a client that
    # reconnects can decode at once.
    factory.set_launch(
        f'( filesrc location="{path}" ! qtdemux ! h264parse ! rtph264pay name=pay0 pt=96 config-interval=1 )')
    factory.set_shared(False)
    server.get_mount_points().add_factory(args.mount, factory)
    if server.attach(None) == 0:
        print(f"rtsp_server: cannot listen on {args.address}:{args.port}", file=sys.stderr)
        return 1

    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"READY rtsp://{args.address}:{args.port}{args.mount}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
