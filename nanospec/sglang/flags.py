"""SGLang launch flags that would trace or capture NanoSpec's Python hooks: refused at start-up.

NanoSpec runs Python around SGLang's LM heads (``hooks.install_prefill_topk`` stashes the target's
top-K_pre of every prompt row for ``Runtime.start_batch``; ``hooks.install_draft_head`` keeps the
draft logits' column map for the ``hot_token_id`` lookup that follows). Those side effects happen only
when the Python runs:

* ``--enable-torch-compile``: SGLang compiles the models' forwards (``torch.compile`` of the decode
  graphs, up to ``--torch-compile-max-bs``); Dynamo would trace the logits-processor hooks, whose
  writes to Python objects (the stashed top-k, the pending column map) are not part of a graph.
* a prefill CUDA graph with the ``full`` backend (``--cuda-graph-backend-prefill full`` or
  ``--cuda-graph-config '{"prefill": {"backend": "full"}}'``): one whole-forward graph per token
  bucket, logits processor included, so a replay never stashes the prompt's top-K_pre and the first
  prefill stops on "prefill top-k rows do not match". SGLang's default prefill graph on CUDA
  (``breakable``) runs the logits processor eagerly and is supported (docs/plugin.md, GPU features).

Neither path has run with NanoSpec on a GPU, so both are refused, with the flag named, until each is
supported and tested.
"""

from __future__ import annotations

from collections.abc import Iterator

FULL = "full"


def _prefill_backends(server_args) -> Iterator[tuple[str, str]]:
    """(flag as the user wrote it, backend) for every way the prefill graph backend can be set."""
    raw = getattr(server_args, "cuda_graph_backend_prefill", None)
    if raw is not None:
        yield "--cuda-graph-backend-prefill", str(raw)
    config = getattr(server_args, "cuda_graph_config", None)
    prefill = config.get("prefill") if isinstance(config, dict) else getattr(config, "prefill", None)
    backend = prefill.get("backend") if isinstance(prefill, dict) else getattr(prefill, "backend", None)
    if backend is not None:
        yield "--cuda-graph-config (prefill.backend)", str(backend)


def refused_flags(server_args) -> list[str]:
    """The launch flags of ``server_args`` that NANOSPEC refuses, each with its reason."""
    out = []
    if getattr(server_args, "enable_torch_compile", False):
        out.append("--enable-torch-compile: torch.compile would trace NanoSpec's logits-processor hooks, "
                   "whose side effects (the prefill top-k, the draft column map) a compiled graph drops")
    for flag, backend in _prefill_backends(server_args):
        if backend == FULL:
            out.append(f"{flag} {FULL}: a full prefill CUDA graph captures the target's logits processor, "
                       "so a replay never hands NanoSpec the prompt's top-k (use the default breakable "
                       "prefill graph or --disable-prefill-cuda-graph)")
    return out


def check_flags(server_args) -> None:
    """ValueError naming every refused flag (``algo.validate_server_args`` calls it at launch)."""
    refused = refused_flags(server_args)
    if refused:
        raise ValueError("NANOSPEC does not support " + "; ".join(refused))
