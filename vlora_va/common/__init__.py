"""What every layer may use: logging set-up and its throttle (logs.py), strict JSON formatting (jsonfmt.py)."""
