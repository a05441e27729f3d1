"""Metal kernel sources (``*.metal``), shipped as package data and loaded by mlx_specstream.kernels."""
