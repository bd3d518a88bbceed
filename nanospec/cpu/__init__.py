"""CPU-only support for SGLang 0.5.23: pure-PyTorch ``sgl_kernel`` ops and fixes for SGLang defects.

Installed with NanoSpec; ``nanospec_sgl_cpu.pth`` runs ``nanospec.cpu._bootstrap.install()`` at start-up of
every Python process in the environment. See docs/cpu.md.
"""
