"""The ``NANOSPEC`` speculative algorithm as SGLang sees it: a ``CustomSpecAlgo`` that behaves as
the EAGLE family everywhere SGLang asks (``is_eagle``), and as EAGLE3 when the draft is an EAGLE-3
model (so the target captures auxiliary hidden states). Every SGLang symbol used here is a row of
``seam.SEAM``."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from nanospec.controller import read_adaptive_config
from nanospec.sglang import seam
from nanospec.sglang.drafts import check_draft
from nanospec.sglang.flags import check_flags
from nanospec.sglang.settings import check_against_model, load_settings

logger = logging.getLogger(__name__)

NAME = "NANOSPEC"
DEFAULT_TREE = {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


def _read_config(path: str | None) -> dict:
    if not path:
        return {}
    f = Path(path) / "config.json"
    if f.is_file():
        return json.loads(f.read_text())
    try:  # a hub name or another layout: let transformers resolve it
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path).to_dict()
    except Exception:
        return {}


@functools.lru_cache(maxsize=8)
def draft_is_eagle3(path: str | None) -> bool:
    """Whether the draft at ``path`` is an EAGLE-3 model (read once per path and process)."""
    archs = _read_config(path).get("architectures") or []
    return any("Eagle3" in a or "EAGLE3" in a for a in archs)


class NanoSpecAlgo(CustomSpecAlgo):
    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        # SGLang asks in its worker processes, where its runtime context names the draft (the same
        # context its own EAGLE workers read); the answer is cached per draft path.
        from sglang.srt.runtime_context import get_spec

        try:
            path = get_spec().speculative_draft_model_path
        except Exception as e:  # no runtime context: not inside an SGLang server process
            logger.debug("NANOSPEC is_eagle3 outside an SGLang runtime context: %s", e)
            return False
        return draft_is_eagle3(path)

    def carries_draft_hidden_states(self) -> bool:
        return True

    def need_topk(self) -> bool:
        return True

    def get_platform_worker_cls(self):
        return None

    def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True,
                          needs_confidence_relay=False):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def handle_server_args(self, server_args) -> None:
        """Defaults SGLang's ``_handle_eagle_family`` gives its built-in EAGLE algorithms (it skips
        plugin algorithms), applied to NANOSPEC. Every write is logged (``seam.set_server_arg``) and
        recorded by SGLang's resolver."""
        why = "SGLang's EAGLE default tree"
        if server_args.speculative_num_steps is None:
            seam.set_server_arg(server_args, "speculative_num_steps",
                                DEFAULT_TREE["speculative_num_steps"], why)
            if server_args.speculative_eagle_topk is None:
                seam.set_server_arg(server_args, "speculative_eagle_topk",
                                    DEFAULT_TREE["speculative_eagle_topk"], why)
            if server_args.speculative_num_draft_tokens is None:
                seam.set_server_arg(server_args, "speculative_num_draft_tokens",
                                    DEFAULT_TREE["speculative_num_draft_tokens"], why)
        if server_args.max_running_requests is None:
            seam.set_server_arg(server_args, "max_running_requests", 48,
                                "SGLang's EAGLE default; also sizes NanoSpec's per-slot state")
        if server_args.device == "cpu" and not server_args.disable_overlap_schedule:
            seam.set_server_arg(server_args, "disable_overlap_schedule", True,
                                "SGLang has no overlap scheduler for speculative decoding on CPU")
        graphs = getattr(server_args, "cuda_graph_config", None)
        if server_args.device == "cpu" and graphs is not None and graphs.decode.backend != Backend.DISABLED:
            # SGLang's CPU model runner skips decode graphs by device, but its per-step runtime states
            # (built for the step controller, also EAGLE3's --speculative-adaptive) do not.
            seam.set_server_arg(server_args, "cuda_graph_config",
                                with_phase(graphs, Phase.DECODE, backend=Backend.DISABLED),
                                "no CUDA graphs on CPU (decode graph backend 'disabled')")
        if server_args.enable_mixed_chunk:
            seam.set_server_arg(server_args, "enable_mixed_chunk", False,
                                "mixed steps would decode running requests one token at a time "
                                "without a verify (SGLang refuses it without supports_mixed_chunk)")


def check_steps(server_args, settings) -> None:
    """The step controller's launch flags: SGLang's ``--speculative-adaptive`` means NanoSpec's own
    controller here (SGLang's accept-length rule serves EAGLE/EAGLE3 only), and its config file must
    be readable with candidates within ``--speculative-num-steps``."""
    adaptive = bool(getattr(server_args, "speculative_adaptive", False))
    if adaptive and settings.steps == "fixed":
        raise ValueError("NANOSPEC: --speculative-adaptive asks for adaptive steps but NANOSPEC_STEPS=fixed "
                         "pins the chain; drop one of them")
    if adaptive:
        logger.info("NANOSPEC: --speculative-adaptive is served by NanoSpec's cost-aware step controller "
                    "(NANOSPEC_STEPS=auto); SGLang's own adaptive rule is for EAGLE/EAGLE3")
    path = getattr(server_args, "speculative_adaptive_config", None)
    if path and settings.steps == "auto":
        steps = server_args.speculative_num_steps or DEFAULT_TREE["speculative_num_steps"]
        read_adaptive_config(path, int(steps))


def validate_server_args(server_args) -> None:
    """Reject what NANOSPEC cannot serve, with the reason; runs once in the launching process."""
    seam.check()
    settings = load_settings()
    if server_args.speculative_draft_model_path is None:
        raise ValueError("NANOSPEC needs --speculative-draft-model-path (an EAGLE-3 or EAGLE draft)")
    for name in ("tp_size", "pp_size", "dp_size"):
        if (getattr(server_args, name, 1) or 1) != 1:
            raise ValueError(f"NANOSPEC supports {name} == 1 only (the packed draft head needs the whole "
                             f"LM head on one device); got {getattr(server_args, name)}")
    if getattr(server_args, "speculative_use_rejection_sampling", False):
        raise ValueError("NANOSPEC does not support --speculative-use-rejection-sampling: draft "
                         "probabilities live on the packed vocabulary")
    check_steps(server_args, settings)
    check_flags(server_args)  # paths that would trace or capture the plugin's hooks
    target = _read_config(server_args.model_path)
    draft = Path(server_args.speculative_draft_model_path)
    if draft.is_dir() and target.get("vocab_size") and target.get("hidden_size"):
        info = check_draft(draft, target, target_name=server_args.model_path,
                           token_map=getattr(server_args, "speculative_token_map", None))
        logger.info("NANOSPEC draft: %s", info.describe())
    else:  # a hub name, resolved by SGLang later: NanoSpec cannot read its files here
        logger.info("NANOSPEC draft %s is not a local directory: its files cannot be checked before "
                    "SGLang fetches them", draft)
    vocab = target.get("vocab_size")
    topk = server_args.speculative_eagle_topk or DEFAULT_TREE["speculative_eagle_topk"]
    if vocab:
        check_against_model(settings, vocab_size=int(vocab), eagle_topk=int(topk))
    logger.info("NANOSPEC settings: %s", settings.describe())
