"""The skipped catch-up positions' inputs (``nanospec.sglang.gapfill.GapFill``), without SGLang: what
is kept, the widened window's locations and inputs, and the gap bookkeeping that sizes it."""

from __future__ import annotations

import pytest
import torch

from nanospec.sglang import memory
from nanospec.sglang.gapfill import GapFill
from nanospec.sglang.settings import Settings

SLOTS, WIDTH, WINDOW = 5, 3, 4


def _skip(g: GapFill, slots: list[int], seq_lens: list[int]) -> None:
    """One skipped cycle of requests in ``slots`` at positions ``seq_lens``: token 100 * slot +
    position, hidden rows filled with that number too."""
    pos = torch.tensor(seq_lens)
    tok = torch.tensor([100 * s + p for s, p in zip(slots, seq_lens, strict=True)])
    g.stash(slots, torch.tensor(slots), pos, tok, tok[:, None].float().expand(-1, WIDTH))


def test_widened_window_runs_the_kept_positions_then_the_verify_rows_in_position_order():
    g = GapFill(SLOTS, WIDTH, torch.float32, "cpu", window=WINDOW)
    slots, seq = [3, 1], [10, 7]
    for step in range(3):  # three plain cycles: positions 10..12 and 7..9
        _skip(g, slots, [s + step for s in seq])
    now = torch.tensor([13, 10])  # the cycle whose pass runs: its verify window starts here
    front, d = g.front(slots), 2
    assert front == 3
    req_to_token = torch.arange(SLOTS * 64).view(SLOTS, 64)
    locs, pos = g.window_of(req_to_token, torch.tensor(slots), now, front, d)
    assert pos.tolist() == [*range(10, 15), *range(7, 12)]
    assert locs.tolist() == [3 * 64 + p for p in range(10, 15)] + [64 + p for p in range(7, 12)]
    predict = torch.tensor([-1, -2, -3, -4])
    verify_hidden = predict[:, None].float().expand(-1, WIDTH)
    ids = torch.zeros(2 * (front + d), dtype=torch.long)
    hidden = torch.zeros(2 * (front + d), WIDTH)
    g.fill(ids, hidden, torch.tensor(slots), now, front, predict, verify_hidden)
    assert ids.tolist() == [310, 311, 312, -1, -2, 107, 108, 109, -3, -4]
    assert torch.equal(hidden, ids[:, None].float().expand(-1, WIDTH))


def test_the_ring_keeps_the_last_window_positions_and_forces_a_pass_before_it_wraps():
    g = GapFill(SLOTS, WIDTH, torch.float32, "cpu", window=WINDOW)
    for step in range(WINDOW):
        assert not g.due([2])
        _skip(g, [2], [20 + step])
    assert g.due([2]) and g.front([2]) == WINDOW
    ids = torch.zeros(WINDOW + 1, dtype=torch.long)
    g.fill(ids, torch.zeros(WINDOW + 1, WIDTH), torch.tensor([2]), torch.tensor([24]), WINDOW,
           torch.tensor([7]), torch.zeros(1, WIDTH))
    assert ids.tolist() == [220, 221, 222, 223, 7]
    g.written([2], WINDOW)
    assert not g.due([2]) and g.front([2]) == 0 and g.report()["filled"] == WINDOW


def test_a_batch_fills_its_smallest_gap_and_counts_the_rest_as_holes():
    g = GapFill(SLOTS, WIDTH, torch.float32, "cpu", window=WINDOW)
    _skip(g, [0], [5])  # slot 0 skips alone, then slot 4 joins (its prefill) for two more
    g.started([4])
    _skip(g, [0, 4], [6, 30])
    _skip(g, [0, 4], [7, 31])
    assert g.front([0, 4]) == 2
    g.written([0, 4], 2)
    assert g.report() == {"window": WINDOW, "filled": 4, "holes": 1}
    assert g.front([0, 4]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_memory_plan_reserves_what_the_gap_fill_allocates(dtype):
    slots, width = 9, 48
    g = GapFill(slots, width, dtype, "cpu")
    got = g.tokens.untyped_storage().nbytes() + g.hidden.untyped_storage().nbytes()
    head = torch.zeros(16, 8)
    plan = memory.plan(slots=slots, head=head, settings=Settings(), target_vocab=16, reduced=False,
                       draft_tokens=2, gap_bytes=GapFill.slot_bytes(width, dtype))
    assert plan.persistent()["gap_fill"] == got


def test_hidden_states_of_another_width_turn_the_fill_off_instead_of_failing():
    g = GapFill(SLOTS, WIDTH, torch.float32, "cpu", window=WINDOW)
    g.stash([1], torch.tensor([1]), torch.tensor([4]), torch.tensor([9]), torch.zeros(1, WIDTH + 1))
    assert g.front([1]) == 0 and not g.due([1]) and "not [B, 3]" in g.report()["off"]
