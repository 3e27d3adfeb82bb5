"""vlora_va.contracts.geometry: the letterbox mapping model = orig * scale + pad, and back (the pixels themselves:
tests/ingest/test_chunker.py)."""

import pytest

from vlora_va.contracts.geometry import Letterbox, letterbox_geometry


@pytest.mark.parametrize("w, h, size, new_wh, scale, pad", [
    (640, 272, 112, (112, 48), 0.175, (0, 32)),  # wide: pad top and bottom
    (768, 576, 224, (224, 168), 224 / 768, (0, 28)),
    (272, 640, 112, (48, 112), 0.175, (32, 0)),  # tall: pad left and right
    (300, 300, 224, (224, 224), 224 / 300, (0, 0)),  # square: no padding
    (56, 28, 224, (224, 112), 4.0, (0, 56)),  # upscaling works the same way
    (100, 47, 28, (28, 13), 0.28, (0, 7)),  # 15 rows of padding: 7 on top, the odd one at the bottom
    (47, 100, 28, (13, 28), 0.28, (7, 0)),  # ... and on the right
    (1, 1, 336, (336, 336), 336.0, (0, 0)),
])
def test_letterbox_geometry(w, h, size, new_wh, scale, pad):
    new_w, new_h, lb = letterbox_geometry(w, h, size)
    assert (new_w, new_h) == new_wh
    assert lb.scale == pytest.approx(scale)
    assert (lb.pad_x, lb.pad_y) == pad and isinstance(lb.pad_x, float) and isinstance(lb.pad_y, float)
    # the resized image lies inside the square, padding split evenly (the odd pixel at the bottom/right)
    assert 0 <= size - new_w - 2 * lb.pad_x <= 1 and 0 <= size - new_h - 2 * lb.pad_y <= 1
    # the image's corners land on the resized area's corners: model = orig * scale + pad
    assert w * lb.scale + lb.pad_x == pytest.approx(pad[0] + new_w, abs=0.5)
    assert h * lb.scale + lb.pad_y == pytest.approx(pad[1] + new_h, abs=0.5)


def test_a_sliver_keeps_at_least_one_row():
    new_w, new_h, lb = letterbox_geometry(10000, 1, 224)
    assert (new_w, new_h) == (224, 1) and (lb.pad_x, lb.pad_y) == (0.0, 111.0)
    assert lb.scale == pytest.approx(0.0224)


@pytest.mark.parametrize("w, h, size", [(0, 10, 224), (10, 0, 224), (-5, 10, 224), (10, 10, 0), (10, 10, -224)])
def test_letterbox_geometry_refuses_empty_sides(w, h, size):
    with pytest.raises(ValueError, match=f"letterbox of a {w}x{h} frame into {size} px: sides must be positive"):
        letterbox_geometry(w, h, size)


def test_to_original_inverts_the_mapping():
    lb = Letterbox(scale=0.5, pad_x=0.0, pad_y=16.0)
    assert lb.to_original(50.0, 66.0) == (100.0, 100.0)
    assert lb.to_original(0.0, 16.0) == (0.0, 0.0)  # the corner of the image, below the padding band
    _, _, lb = letterbox_geometry(768, 576, 224)
    for x, y in [(0, 0), (768, 576), (123.5, 456.25)]:
        assert lb.to_original(x * lb.scale + lb.pad_x, y * lb.scale + lb.pad_y) == pytest.approx((x, y))


def test_box_to_original_maps_a_box_inside_the_image():
    lb = Letterbox(scale=0.5, pad_x=0.0, pad_y=16.0)
    assert lb.box_to_original((10.0, 26.0, 60.0, 116.0), (400, 300)) == [20.0, 20.0, 120.0, 200.0]


@pytest.mark.parametrize("box, expected", [
    ((-5.0, 20.0, 120.0, 90.0), [0.0, 0.0, 640.0, 272.0]),  # reaches into the padding and past the image
    ((0.0, 0.0, 112.0, 112.0), [0.0, 0.0, 640.0, 272.0]),  # the whole model frame is the whole image
    ((-50.0, -50.0, -10.0, -1.0), [0.0, 0.0, 0.0, 0.0]),  # entirely outside: a zero-size box at the corner
    ((56.0, 32.0, 56.0, 80.0), [320.0, 0.0, 320.0, 272.0]),  # band edges map exactly to the image edges
])
def test_box_to_original_clamps_to_the_frame(box, expected):
    _, _, lb = letterbox_geometry(640, 272, 112)  # scale 0.175, pad (0, 32)
    assert lb.box_to_original(box, (640, 272)) == pytest.approx(expected)


def test_resized_letterbox_maps_the_resized_frame_to_the_same_original_pixels():
    _, _, lb = letterbox_geometry(640, 272, 336)  # ingest's frame
    assert lb.resized(1.0) is lb
    f = 224 / 336
    small = lb.resized(f)  # the daemon resized it for a 224-px adapter
    assert small == Letterbox(lb.scale * f, lb.pad_x * f, lb.pad_y * f)
    assert small.scale == pytest.approx(224 / 640) and small.pad_y == pytest.approx(lb.pad_y * 2 / 3)
    for x, y in [(0.0, 0.0), (100.0, 200.0), (335.0, 335.0)]:
        assert small.to_original(x * f, y * f) == pytest.approx(lb.to_original(x, y))


def test_letterbox_is_immutable_and_comparable():
    lb = Letterbox(0.5, 1.0, 2.0)
    assert lb == Letterbox(0.5, 1.0, 2.0) and hash(lb) == hash(Letterbox(0.5, 1.0, 2.0))
    with pytest.raises(AttributeError):
        lb.scale = 1.0
