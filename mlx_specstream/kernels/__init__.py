"""Custom Metal kernels, runnable on a Mac through ``mx.fast.metal_kernel`` and anywhere through a
CPU emulator of Metal (:mod:`mlx_specstream.kernels.emulator`).

``metal_kernel`` is the one entry point: it takes ``mx.fast.metal_kernel``'s arguments plus
``backend``, and returns a callable with the same keywords as MLX's (``inputs``, ``template``,
``grid``, ``threadgroup``, ``output_shapes``, ``output_dtypes``, ``init_value``, ``verbose``,
``stream``). On Metal it returns mx arrays; from the emulator, numpy arrays (bfloat16 outputs as
exact float32 values; :func:`emulator.to_mx` converts back).

The attention kernels of the decode step and their wrappers live in
:mod:`mlx_specstream.kernels.attention`; their Metal sources in the package's ``metal/`` folder.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from .emulator import EmulatedKernel, KernelRuntimeError, MetalCompileError

METAL_DIR = Path(__file__).resolve().parent.parent / "metal"

__all__ = ["metal_kernel", "metal_available", "resolve_backend", "read_metal", "EmulatedKernel",
           "MetalCompileError", "KernelRuntimeError", "METAL_DIR"]


def metal_available() -> bool:
    """Whether MLX runs on a Metal device here."""
    try:
        return bool(mx.metal.is_available())
    except Exception:  # pragma: no cover - very old MLX
        return False


def require_metal() -> None:
    """A ValueError (one line on the command line) where the Metal backend is asked for and MLX has
    no Metal device."""
    if not metal_available():
        raise ValueError("the 'metal' kernel backend (backend= or MLX_SPECSTREAM_ATTENTION) needs MLX on a "
                         "Metal device (Apple silicon); 'emulator' runs the kernels on the CPU")


def resolve_backend(backend: str) -> str:
    """"auto" -> "metal" where MLX has a Metal device, else "emulator"."""
    if backend == "auto":
        return "metal" if metal_available() else "emulator"
    if backend not in ("metal", "emulator"):
        raise ValueError(f"backend must be 'auto', 'metal' or 'emulator', not {backend!r}")
    if backend == "metal":
        require_metal()
    return backend


class MetalKernel:
    """``mx.fast.metal_kernel`` behind the same interface as :class:`EmulatedKernel`."""

    def __init__(self, name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                 atomic_outputs=False, compile_options=None):
        kw = {} if compile_options is None else {"compile_options": compile_options}
        self.name = name
        self._kernel = mx.fast.metal_kernel(name=name, input_names=list(input_names),
                                            output_names=list(output_names), source=source,
                                            header=header, ensure_row_contiguous=ensure_row_contiguous,
                                            atomic_outputs=atomic_outputs, **kw)

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                 init_value=None, verbose=False, stream=None, schedule=None, workers=None, seed=None):
        # schedule/workers/seed only mean something to the emulator
        kw = {"template": template} if template else {}
        if init_value is not None:
            kw["init_value"] = init_value
        if stream is not None:
            kw["stream"] = stream
        return self._kernel(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes,
                            grid=grid, threadgroup=threadgroup, verbose=verbose, **kw)


def metal_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                 atomic_outputs=False, compile_options=None, backend="auto"):
    """``mx.fast.metal_kernel`` with a choice of ``backend``: "metal", "emulator" or "auto"."""
    cls = MetalKernel if resolve_backend(backend) == "metal" else EmulatedKernel
    return cls(name, input_names, output_names, source, header, ensure_row_contiguous, atomic_outputs,
               compile_options)


def read_metal(filename: str) -> str:
    """The text of a kernel source shipped in the package's ``metal/`` folder."""
    return (METAL_DIR / filename).read_text()
