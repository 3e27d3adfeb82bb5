"""Adapter cards and reports: what they claim must follow from the numbers, including the undefined ones."""
from vlora_va.training.cards import _seed_runs, write_report
from vlora_va.training.metrics import person_activity_report


def _test_report(persons_refs: list[list[dict]], preds: list[list[dict]]) -> dict:
    return {"top1": 1.0, "clips": 1, "labels": ["standing"], "confusion": [[1]],
            "persons": person_activity_report(preds, persons_refs, ["standing"], 0.5)}


def test_report_says_n_a_for_a_range_without_labelled_persons(tmp_path):
    someone = {"box": [0, 0, 10, 40], "label": "standing"}
    guess = {"box": [0, 0, 10, 40], "score": 0.9, "activity": "standing"}
    test = {"street": _test_report([[someone]], [[guess]]), "empty": _test_report([[]], [[guess, guess]])}
    runs = [{"seed": s, "top1": {"street": 1.0, "empty": 1.0}, "person_top1": {"street": v}}
            for s, v in ((0, 1.0), (1, 0.5))]
    row = {"model": "LoRA+head", "train_seconds": 1.0, "steps": 1, "complete": True, "test": test, "runs": runs,
           "mean_top1": {"street": 1.0, "empty": 1.0}, "mean_person_top1": {"street": 0.75}}
    write_report(tmp_path / "REPORT-x", {"spec": "x", "task": "action", "image_size": 28, "lora": {}, "rows": [row]})
    md = (tmp_path / "REPORT-x.md").read_text()
    assert "| LoRA+head | street | top-1 per person | 1.000; seeds 0, 1: mean 0.750, range 0.500–1.000 |" in md
    assert "| LoRA+head | empty | top-1 per person | n/a: no labelled person, 2 false alarms |" in md
    seeds = _seed_runs(row).splitlines()
    assert seeds[1:] == ["- seed 0: street 1.000 / 1.000, empty 1.000 / n/a (no labelled person)",
                         "- seed 1: street 1.000 / 0.500, empty 1.000 / n/a (no labelled person)",
                         "- mean: street 1.000 / 0.750, empty 1.000 / n/a (no labelled person)"]


def test_the_action_card_says_where_the_persons_boxes_come_from(tmp_path):
    from vlora_va.training.cards import action_card
    from vlora_va.training.spec import Spec

    someone = {"box": [0, 0, 10, 40], "label": "standing"}
    guess = {"box": [0, 0, 10, 40], "score": 0.9, "activity": "standing"}
    row = {"model": "LoRA+head", "train_seconds": 1.0, "steps": 1, "complete": True,
           "test": {"street": _test_report([[someone]], [[guess]])}}
    words = {}
    for boxes in (0, 4):
        head = {"spatial": "local", "persons": True, **({"boxes": boxes} if boxes else {})}
        spec = Spec(name="x", task="action", output=tmp_path, clip_len=4, head=head)
        words[boxes] = action_card(spec, row, {"train": {"standing": 1}})
    assert "a per-person branch" in words[0] and "person detection head" not in words[0]
    assert ("each person's box from a person detection head (patch grid ×4) on the clip's two middle frames"
            in words[4]) and "started from" not in words[4] and "detail" not in words[4]
    spec = Spec(name="x", task="action", output=tmp_path / "x", clip_len=4, box_head_from=tmp_path / "detect",
                head={"spatial": "local", "persons": True, "boxes": 4, "detail": 32})
    card = action_card(spec, row, {"train": {"standing": 1}})
    assert "(patch grid ×4, joined there by a 32-channel convolution branch on the input image" in card
    assert "that person head started from the `detect` adapter's detection head (its person class)" in card
