"""NanoSpec's device memory inside SGLang's KV-cache budget.

SGLang 0.5.23 sizes the KV cache once, in the target's ``KVCacheConfigurator._profile_available_bytes``:
free device memory minus the runtime slack ``pre_model_load_memory * (1 - mem_fraction_static)``, so
whatever is resident then (target and draft weights) is charged and everything allocated later must
fit in the slack. NanoSpec's vocabulary state and packed head are allocated later (the draft worker's
``init_lm_head``, after the pools), so without a reservation they would eat the slack SGLang keeps
for activations and CUDA graphs: about 1.2 GB at 49 slots and Llama-3.1-8B dims.

``MemoryPlan`` is the single source of truth for those bytes, computed before the KV cache is sized
from the numbers that decide them (slots, vocabulary, hidden size, dtype, W_max, draft tokens):

* persistent: ``VocabState`` (nanospec/state.py), the packed head (nanospec/head.py), the reduced
  vocabulary's target -> draft map and the telemetry counters, exactly as they are allocated;
* workspace: the largest temporaries of a NanoSpec call, bounded by construction: one chunk of target
  logits for the prefill top-K_pre (``prefill_chunk_rows``) and the draft-extend logits over the
  columns of ``extend_kind``'s head (the packed window, or a draft vocabulary no wider than it).

``NanoSpecWorker.__init__`` (after the draft loads, before the pools) announces the plan;
``take_from_kv_budget``, a HookRegistry AFTER hook on ``_profile_available_bytes``, subtracts it from the
target's KV budget, so the pool shrinks by what NanoSpec will allocate and the slack stays SGLang's.
SGLang's post-capture KV resizing (CUDA, when planned) re-measures free memory after the buffers exist,
so it charges them as well. ``allocated_bytes`` counts what a live ``Runtime`` holds (the tests' check
of the plan).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from nanospec.state import col_dtype

logger = logging.getLogger(__name__)

KV_BUDGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes"
PREFILL_TOPK_BYTES = 64 << 20  # bound on one chunk of float32 target logits for the prefill top-K_pre
PREFILL_MAX_ROWS = 1024  # each chunk reads the whole LM head; past 1,024 rows that cost is noise


def prefill_chunk_rows(vocab: int) -> int:
    """Prompt rows whose target logits [rows, vocab] are materialised at once for the top-K_pre: at
    most ``PREFILL_TOPK_BYTES`` of float32 (SGLang's LM head may return float32), at least one row."""
    return max(1, min(PREFILL_MAX_ROWS, PREFILL_TOPK_BYTES // (4 * max(1, vocab))))


def extend_kind(head: str, w_max: int, draft_rows: int) -> str:
    """The draft head of every draft-extend pass (``hooks.extend_head``): "full" when forced or when
    the window is at least the vocabulary, else "packed"; its logits are [N, draft_rows] or
    [N, w_max] float32, never [N, V_target]."""
    return "full" if head == "full" or w_max >= draft_rows else "packed"


@dataclass(frozen=True)
class MemoryPlan:
    """NanoSpec's device bytes for one server.

    slots: request slots (SGLang's req_to_token rows: max running requests + 1); draft_rows, dim,
    elem: the draft LM head [draft_rows, dim] and its element size; w_max, gather, k_pre: the
    vocabulary settings; head: the head setting ("auto" unless forced); target_vocab: the target's
    vocabulary size; reduced: the draft has its own row -> target id map (a target -> draft map is
    kept); draft_tokens: tokens per request in a verify (rows per request of a draft-extend);
    gap_bytes: bytes per slot of the skipped positions' inputs (``gapfill.GapFill``; 0: none kept).
    """

    slots: int
    draft_rows: int
    dim: int
    elem: int
    w_max: int
    gather: str
    head: str
    k_pre: int
    target_vocab: int
    reduced: bool
    draft_tokens: int
    gap_bytes: int = 0

    def persistent(self) -> dict[str, int]:
        """Bytes of every buffer allocated for the server's life, by name."""
        r, v, w = self.slots, self.draft_rows, self.w_max
        cd = torch.empty((), dtype=col_dtype(w)).element_size()
        rows = r * w + 1  # every [R, W] array has one spare element behind it (nanospec/state.py)
        return {
            "packed_head": 0 if self.gather == "indexed" else rows * self.dim * self.elem,
            "col_of": (r * v + 1) * cd,
            "col_tok": rows * 4,
            "count_ring_stack": 3 * rows * cd,
            "per_slot": r * (4 + 8 + 8),  # nfree int32, pos and gathered int64
            "target_to_draft": self.target_vocab * 8 if self.reduced else 0,
            "telemetry": r * 4 * 8,
            "gap_fill": r * self.gap_bytes,
        }

    def workspace(self) -> dict[str, int]:
        """Peak bytes of the bounded temporaries, by name."""
        return {
            "prefill_topk_logits": prefill_chunk_rows(self.target_vocab) * self.target_vocab * 4,
            "draft_extend_logits": self.slots * self.draft_tokens * self.extend_width * 4,
        }

    @property
    def extend_width(self) -> int:
        """Columns of the draft-extend logits."""
        full = extend_kind(self.head, self.w_max, self.draft_rows) == "full"
        return self.draft_rows if full else self.w_max

    @property
    def persistent_bytes(self) -> int:
        return sum(self.persistent().values())

    @property
    def workspace_bytes(self) -> int:
        return sum(self.workspace().values())

    @property
    def total(self) -> int:
        return self.persistent_bytes + self.workspace_bytes

    def describe(self) -> str:
        return (f"{self.total / 2**20:.1f} MiB (persistent {self.persistent_bytes} B: packed head "
                f"{self.persistent()['packed_head']} B; workspace {self.workspace_bytes} B) for "
                f"{self.slots} slots, W_max {self.w_max}, head [{self.draft_rows}, {self.dim}] x "
                f"{self.elem} B, {self.draft_tokens} draft tokens")


def plan(*, slots: int, head: torch.Tensor, settings, target_vocab: int, reduced: bool,
         draft_tokens: int, gap_bytes: int = 0) -> MemoryPlan:
    """The plan for a draft LM head ``head`` [V_d, d] (only its shape and dtype are read) and the
    plugin's ``Settings``."""
    v = settings.vocab
    return MemoryPlan(slots=int(slots), draft_rows=int(head.shape[0]), dim=int(head.shape[1]),
                      elem=head.element_size(), w_max=v.w_max, gather=v.gather, head=settings.head,
                      k_pre=v.k_pre,
                      target_vocab=int(target_vocab), reduced=bool(reduced), draft_tokens=int(draft_tokens),
                      gap_bytes=int(gap_bytes))


# -- the reservation -----------------------------------------------------------------------------

_announced: list[MemoryPlan] = []  # the plan of this process's NANOSPEC server (one per scheduler)


def announce(p: MemoryPlan) -> None:
    """Make ``take_from_kv_budget`` reserve ``p`` when SGLang sizes this process's KV cache."""
    _announced[:] = [p]


def announced() -> MemoryPlan | None:
    return _announced[0] if _announced else None


def take_from_kv_budget(available: int, configurator, *args, **kwargs) -> int:
    """HookRegistry AFTER hook on ``KVCacheConfigurator._profile_available_bytes``: the target's KV
    budget (bytes) less the announced plan. The draft's configurator (it reuses the target's pool
    config) and servers without a plan (plain, EAGLE3 in the same environment) are left alone."""
    p = announced()
    if p is None or getattr(configurator, "is_draft_worker", False):
        return available
    left = available - p.total
    if left <= 0:
        raise ValueError(f"NANOSPEC needs {p.describe()}, more than the {available / 2**20:.1f} MiB left "
                         "for the KV cache; lower --max-running-requests or NANOSPEC_W_MAX, or raise "
                         "--mem-fraction-static")
    logger.info("NANOSPEC reserves %d bytes of the KV cache budget (%d -> %d bytes): %s", p.total,
                available, left, p.describe())
    return left


# -- what a live Runtime holds -------------------------------------------------------------------


def _tensors(obj, seen: set[int], out: dict[int, torch.Tensor], depth: int) -> None:
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        out.setdefault(storage.data_ptr(), obj)
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif type(obj).__module__.startswith("nanospec"):
        if dataclasses.is_dataclass(obj):
            items = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
        else:
            items = list(getattr(obj, "__dict__", {}).values())
    else:
        return
    for item in items:
        _tensors(item, seen, out, depth + 1)


def allocated_bytes(runtime, *, exclude: tuple[torch.Tensor, ...] = ()) -> int:
    """Bytes of the distinct tensor storages on ``runtime``'s device reachable from it (NanoSpec's
    objects, their dicts, lists and dataclasses), less those of ``exclude`` (SGLang's own tensors
    that NanoSpec keeps by reference: the draft LM head, SGLang's hot-token map)."""
    found: dict[int, torch.Tensor] = {}
    _tensors(runtime, set(), found, 0)
    skip = {t.untyped_storage().data_ptr() for t in exclude if isinstance(t, torch.Tensor)}
    dev = runtime.device
    return sum(t.untyped_storage().nbytes() for ptr, t in found.items()
               if ptr not in skip and t.device == dev)
