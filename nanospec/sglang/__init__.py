"""SGLang plugin: ``--speculative-algorithm NANOSPEC``.

Loaded by SGLang in every process through the ``sglang.srt.plugins`` entry point ``nanospec``
(``register`` below). The worker module (heavy SGLang imports) loads only when a server actually
creates the worker.
"""

from __future__ import annotations

import os

_registered = False


def _worker_factory(server_args):
    from nanospec.sglang.worker import NanoSpecWorker

    return NanoSpecWorker


def register() -> None:
    """Entry point: register NANOSPEC with SGLang, the tokenizer-side meta_info and request-validation
    hooks and the exact-penalty hooks. Idempotent."""
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from nanospec.sglang import memory, penalties, validate
    from nanospec.sglang.algo import NAME, NanoSpecAlgo, validate_server_args
    from nanospec.sglang.hooks import collapse_meta

    SpeculativeAlgorithm.register(NAME, supports_overlap=True, validate_server_args=validate_server_args,
                                  spec_class=NanoSpecAlgo)(_worker_factory)
    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info",
                          collapse_meta, HookType.AFTER)
    # Exact penalties in NANOSPEC's verify (SGLang's speculative penalties are relaxed, see
    # penalties.py); every hook leaves batches of other algorithms alone.
    for target, hook, kind in penalties.HOOKS:
        HookRegistry.register(target, hook, HookType[kind])
    # Refuse unservable requests in the tokenizer process (HTTP 400), before the scheduler sees them.
    HookRegistry.register("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
                          validate.before_validate_one_request, HookType.BEFORE)
    # NanoSpec's device memory comes out of the target's KV budget (memory.py); a no-op without the
    # plan a NANOSPEC worker announces, so plain and EAGLE3 servers keep SGLang's sizing.
    HookRegistry.register(memory.KV_BUDGET, memory.take_from_kv_budget, HookType.AFTER)
    if os.environ.get("NANOSPEC_TIME_DRAFT") == "1":
        from nanospec.sglang.telemetry import DraftTimer

        HookRegistry.register("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft", DraftTimer(),
                              HookType.AROUND)
    _registered = True
