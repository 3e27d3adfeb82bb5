"""What ingest and the daemon agree on, torch-free: the pipeline config, the wire format, the letterbox,
requests and result records. Both `streams/` (ingest hosts) and `vlora_va/` (the daemon) import this;
it imports neither.

    config.py    PipelineConfig: the typed schema of pipelines.yaml
    wire.py      the chunk message (header schema + raw frames), encode / decode
    geometry.py  Letterbox: original frame <-> model frame
    requests.py  Request: one task on one received chunk, in the daemon's clock
    results.py   ResultRecord and the typed payloads heads produce; what every sink writes
"""
