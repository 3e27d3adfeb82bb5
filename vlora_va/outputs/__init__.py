"""Outputs: where rows go and how people see them.

    sinks/      the Sink interface and the built-in sinks (jsonl, stdout, webhook, mqtt, ZeroMQ PUB)
    dashboard/  the daemon's HTTP server: live page (boxes, tracks, lines, zones, events), /metrics, /healthz, /readyz
    attach.py   a daemon with its configured sinks and HTTP server attached
    draw.py     `vlora-va draw`: a result frame's detections, track ids, events, lines and zones on the video frame
"""
