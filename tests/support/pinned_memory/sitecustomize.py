"""Test-only: pins the free host memory SGLang measures, so that two CPU servers size their KV cache
from the same number (``tests/test_plugin_memory.py``).

Put this directory first on ``PYTHONPATH`` with ``NANOSPEC_TEST_AVAILABLE_BYTES`` set; Python imports
``sitecustomize`` at start-up in the launcher and in every process SGLang spawns. SGLang 0.5.23 takes
a CPU's free memory from ``psutil.virtual_memory().available`` (``srt/utils/common.py:
get_free_cpu_memory``), both for the baseline before the weights load and for the KV budget; on a
shared host other processes move that number by hundreds of MB between two servers.
"""

import os

_pinned = os.environ.get("NANOSPEC_TEST_AVAILABLE_BYTES")
if _pinned:
    import psutil

    _real = psutil.virtual_memory

    def _virtual_memory():
        return _real()._replace(available=int(_pinned))

    psutil.virtual_memory = _virtual_memory
