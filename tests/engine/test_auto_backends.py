"""`daemon.backend: auto` enumerates the registered backbone backends: one a plug-in registers competes with the
torch engine's precisions without precision_choice.py naming it (issue 46)."""

from __future__ import annotations

import pytest

from vlora_va.contracts.plugins import BACKBONE_BACKENDS
from vlora_va.engine import precision as P
from vlora_va.engine import precision_choice as A
from vlora_va.engine.backbones import load_backbone
from vlora_va.engine.backends.torch_eager import TorchBackbone
from vlora_va.testing.tiny import TINY_IMAGE

CPU = P.Capabilities("cpu", "AVX512", True, True, True)
OPEN = {"bf16": None, "int8": None}


class EagerTwin(TorchBackbone):
    """The eager torch backend under another name, competing in auto in fp32: what a plug-in adds."""

    auto_precisions = ("fp32",)

    @classmethod
    def auto_key(cls) -> dict:
        return {"twin": "1"}

    @classmethod
    def gate_variants(cls, caps) -> list[str]:
        return ["twin-fp32"]

    @classmethod
    def plain(cls, backbone, precision, parts=None):
        return P.precision_copy(backbone, precision)


@pytest.fixture()
def twin():
    BACKBONE_BACKENDS.register("twin", EagerTwin)
    yield "twin"
    BACKBONE_BACKENDS.unregister("twin")


def test_a_registered_backend_competes_in_auto(twin, tiny_backbone_dir):
    usable, _ = A.candidates(CPU, OPEN, auto_backend=True)
    assert "twin-fp32" in usable and usable[:3] == ["fp32", "bf16", "int8"]  # torch's first, as before
    assert "twin-fp32" not in A.candidates(CPU, OPEN)[0]  # only with daemon.backend: auto
    assert A.split_choice("twin-fp32") == ("twin", "fp32")
    assert "twin-fp32" in A.variants_here(CPU, auto_backend=True)
    base = load_backbone(str(tiny_backbone_dir))
    assert A.speed_key(CPU, "tiny", base, {TINY_IMAGE: 1.0}, auto_backend=True)["twin"] == "1"
    # measured on its own plain backbone, and taken when it is the fastest
    speeds = A.measure_speeds(base, ["fp32", "twin-fp32"], {TINY_IMAGE: 2.0}, rounds=1)
    assert set(speeds) == {"fp32", "twin-fp32"} and all(t > 0 for t in speeds.values())
    choice = A.choose("auto", CPU, OPEN, {"fp32": 1.0, "bf16": 0.9, "int8": 0.8, "twin-fp32": 0.5}, auto_backend=True)
    assert choice.precision == "twin-fp32"


def test_an_unregistered_backend_is_gone_from_auto(twin):
    BACKBONE_BACKENDS.unregister(twin)
    assert not any(p.startswith("twin-") for p in A.candidates(CPU, OPEN, auto_backend=True)[0])
    assert A.split_choice("twin-fp32") == ("torch", "twin-fp32")
