"""pytest plugin (registered as an entry point): run test sessions on the optimized BLAS.

Loaded before pytest captures output, so re-executing the process here keeps the terminal.
"""

from .blas import ensure_fast_blas

ensure_fast_blas()
