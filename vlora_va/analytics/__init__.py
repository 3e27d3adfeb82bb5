"""The analytics layer: what happened on a stream, not only what was in a frame.

    pipeline.py      Analytics, one per daemon: the rows of tracked tasks in chunk order, events, streams offline
    order.py         ChunkOrder: a tracked task's rows leave in chunk order, whatever order batches finish in
    tracked_task.py  TrackedTask: one stream's tracked task, its tracker and its rules, rows -> rows + events
    tracking.py      StreamTracker: Roboflow `trackers` (ByteTrack), confirmed tracks, one box and class per object
    rules.py         SceneRules over lines.py and zones.py (TrackPoint and Hit: rule_parts.py): hits and running counts
    liveness.py      Liveness: which streams deliver frames (ingest's heartbeats)
    snapshots.py     SnapshotStore: the JPEG of an event's frame with its box drawn, within size and age limits

The serving layer (vlora_va/serving/rows.py) writes what comes out as rows. This layer imports only
vlora_va.contracts / vlora_va.common, numpy, OpenCV and the `trackers` package: never torch or the engine.
"""
