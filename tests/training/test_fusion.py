"""The greedy fusion's decisions, checked exactly on a synthetic case with known interference."""

from vlora_va.training.fusion import fuse

# Accuracy of each task when trained alone, and how much every extra member of its adapter costs it.
ALONE = {"a": 0.95, "b": 0.90, "c": 0.85, "d": 0.92, "e": 0.80}
COST = 0.04


def make(trained: list):
    def train(state, members):
        trained.append((None if state is None else tuple(state), tuple(members)))
        return tuple(members)  # the "weights" are just the member list

    def evaluate(state, members):
        assert tuple(members) == state
        return {s: ALONE[s] - COST * (len(members) - 1) for s in members}

    return train, evaluate


def test_fusion_rolls_back_and_opens_new_adapters_exactly():
    trained: list = []
    train, evaluate = make(trained)
    required = {"a": 0.85, "b": 0.80, "c": 0.80, "d": 0.80, "e": 0.75}
    res = fuse(list("abcde"), required, train, evaluate)
    # a alone; +b: a .91 b .86 ok; +c: a .87 b .82 c .77 < .80 -> rollback, new [c];
    # +d: c .81 d .88 ok; +e: c .77 fails -> rollback, new [e].
    assert [a.sources for a in res.adapters] == [["a", "b"], ["c", "d"], ["e"]]
    assert [e["decision"] for e in res.log] == ["new", "fused", "rollback", "new", "fused", "rollback", "new"]
    assert res.log[2]["failing"] == ["c"]
    assert res.log[5]["failing"] == ["c", "e"]
    # the rolled-back adapter keeps its earlier state and accuracy, not the rejected one
    assert res.adapters[0].state == ("a", "b")
    assert res.adapters[0].accuracy == {"a": ALONE["a"] - COST, "b": ALONE["b"] - COST}
    assert trained[2] == (("a", "b"), ("a", "b", "c"))  # continued from the current state, all members
    assert trained[3] == (None, ("c",))  # the new adapter starts fresh on the source alone
    assert all(a.meets(required) for a in res.adapters)
    assert res.placement() == {"a": 0, "b": 0, "c": 1, "d": 1, "e": 2}
    assert len(res.adapters) < len(ALONE)


def test_fusion_keeps_a_lone_adapter_that_misses_its_requirement_and_flags_it():
    train, evaluate = make([])
    res = fuse(["a", "e"], {"a": 0.5, "e": 0.9}, train, evaluate)
    assert [a.sources for a in res.adapters] == [["a"], ["e"]]
    assert res.log[-1] == {"source": "e", "adapter": 1, "accuracy": {"e": 0.80}, "decision": "new", "failing": ["e"]}
    assert not res.adapters[1].meets({"e": 0.9})


def test_no_requirement_fuses_everything_into_one_adapter():
    train, evaluate = make([])
    res = fuse(list("abcde"), {}, train, evaluate)
    assert [a.sources for a in res.adapters] == [list("abcde")]
