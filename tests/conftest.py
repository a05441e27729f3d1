"""Test session set-up: run on the optimized BLAS when one is installed (see blas.py)."""

from mlx_specstream.blas import ensure_fast_blas

ensure_fast_blas()
