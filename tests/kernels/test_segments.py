"""Segments: the batch layout shared by every layer of a forward."""

from vlora_va.kernels.segments import Segments


def test_runs_merge_adjacent_elements_of_one_slot_and_skip_rows_without_adapter():
    seg = Segments.from_elements([-1, 0, 0, 2, -1, 2], rows_per_elem=3)
    assert (seg.starts, seg.ends, seg.slots) == ((3, 9, 15), (9, 12, 18), (0, 2, 2))
    assert not seg.is_grouped and seg.used_slots == (0, 2)


def test_slot_progression_only_for_equal_back_to_back_runs_with_evenly_rising_slots():
    prog = lambda slots: Segments.from_elements(slots, rows_per_elem=4).slot_progression()  # noqa: E731
    assert prog([0, 1, 2, 3]) == (0, 1)
    assert prog([-1, 1, 3, 5]) == (1, 2)        # leading rows without adapter are allowed
    assert prog([0, 0, 1, 1, -1]) == (0, 1)     # runs of two elements each, trailing no-adapter rows
    assert prog([0, 1, 1]) is None              # unequal runs
    assert prog([0, 2, 3]) is None              # uneven step
    assert prog([1, 0]) is None                 # falling slots
    assert prog([0, -1, 1]) is None             # a gap between the runs
    assert prog([2]) is None                    # a single run: nothing to batch
