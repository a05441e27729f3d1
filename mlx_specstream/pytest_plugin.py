"""pytest plugin (registered as an entry point): run test sessions on the optimized BLAS.

pytest loads it before any test module imports MLX; importing the package preloads the BLAS.
"""

from . import blas  # noqa: F401
