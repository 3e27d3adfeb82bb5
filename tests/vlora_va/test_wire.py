import json

import numpy as np
import pytest

from vlora_va.wire import ChunkHeader, Letterbox, TaskRequest, WireError, decode_chunk, encode_chunk


def make_header(n_frames=3, side=28, **kw):
    fields = dict(stream="cam", seq=7, fps=10.0, frame_ts=tuple(0.1 * i for i in range(n_frames)),
                  frame_shape=(side, side, 3), orig_size=(640, 480), letterbox=Letterbox(side / 640, 0.0, 3.5),
                  tasks=(TaskRequest("detect", "detect", (0, 2), 123.5), TaskRequest("act", "actions", (0, 1, 2), 124.0)),
                  ready_wall=100.0, sent_wall=100.1, dropped_before=2)
    fields.update(kw)
    return ChunkHeader(**fields)


def frames(n=3, side=28):
    rng = np.random.default_rng(0)
    return [rng.integers(0, 255, (side, side, 3), dtype=np.uint8) for _ in range(n)]


def test_round_trip_keeps_every_field_and_pixel():
    h, fs = make_header(), frames()
    chunk = decode_chunk([bytes(memoryview(p)) for p in encode_chunk(h, fs)])
    assert chunk.header == h
    assert all(np.array_equal(a, b) for a, b in zip(chunk.frames, fs))


def test_encode_rejects_frames_that_do_not_match_the_header():
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        encode_chunk(make_header(), [f.astype(np.float32) for f in frames()])
    with pytest.raises(ValueError, match="2 frames but 3 timestamps"):
        encode_chunk(make_header(), frames(2))


def _parts(header_dict=None, frame_parts=None):
    h = make_header()
    d = json.loads(h.to_json()) if header_dict is None else header_dict
    return [json.dumps(d).encode(), *(frame_parts if frame_parts is not None else [f.tobytes() for f in frames()])]


def _mutated(**changes):
    d = json.loads(make_header().to_json())
    for k, v in changes.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return d


@pytest.mark.parametrize("parts, message", [
    ([], "empty message"),
    ([b"\xff\xfe not json"], "not valid UTF-8 JSON"),
    ([b"[1, 2]"], "not a JSON object"),
    (_parts(_mutated(v=2)), "unsupported protocol version 2"),
    (_parts(_mutated(stream=None)), "missing field 'stream'"),
    (_parts(_mutated(seq=-1)), "header.seq: must be >= 0"),
    (_parts(_mutated(frame_shape=[28, 28, 4])), "header.frame_shape"),
    (_parts(_mutated(tasks=[{"name": "d", "adapter": "d", "frames": [5], "deadline_wall": 1.0}])),
     r"header.tasks\[0\].frames: expected indices into the 3 frames"),
    (_parts(_mutated(ready_wall="soon")), "header.ready_wall: expected"),
    (_parts(frame_parts=[f.tobytes() for f in frames(2)]), "announces 3 frames but the message carries 2"),
    (_parts(frame_parts=[f.tobytes()[:-10] for f in frames()]), "frame 0: 2342 bytes, expected 28x28x3 = 2352"),
])
def test_malformed_messages_are_rejected_with_a_clear_reason(parts, message):
    with pytest.raises(WireError, match=message):
        decode_chunk(parts)


def test_letterbox_maps_model_pixels_back_to_original():
    lb = Letterbox(scale=0.5, pad_x=0.0, pad_y=16.0)
    assert lb.to_original(50.0, 66.0) == (100.0, 100.0)
