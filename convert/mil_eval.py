"""A reference evaluator of saved Core ML packages, in numpy, for machines without Core ML.

Core ML predictions need macOS; coremltools can still read a saved ``.mlpackage`` back on Linux:
the spec (``ct.utils.load_spec``), its ML program (coremltools' milproto loader) and the weight
blobs. :class:`Package` evaluates that program op by op with numpy, states and the constexpr
dequantization ops included, so a package is judged by the file that ships, not by the graph it
was made from. An op this evaluator does not know fails loudly, naming it.

Numerics: fp16 tensors are stored as float16 after every op (as the package declares them) but
each op computes in float32, roughly what Core ML's GPU does; fp32 packages compute in float32.
This is a reference for correctness, not a model of Core ML's exact rounding or speed.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from ..errors import MissingPackageError, PackageError


class UnsupportedOpError(NotImplementedError):
    """The package uses a MIL op that the reference evaluator does not implement."""


def coremltools(feature: str = "reading a Core ML package"):
    """coremltools, imported without its start-up warnings and logs; where it is not installed,
    one line saying that ``feature`` needs it and how to install it."""
    import logging

    logging.getLogger("coremltools").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import coremltools as ct
        except ImportError:
            raise MissingPackageError(f"{feature} needs coremltools: pip install "
                                      "'mlx-specstream[coreml]'") from None
    return ct


def read_metadata(path: str | Path) -> dict[str, str]:
    """The package's user-defined metadata (strings)."""
    ct = coremltools()
    spec = _load_spec(ct, Path(path))
    return dict(spec.description.metadata.userDefined)


def _load_spec(ct, path: Path):
    if not (path / "Manifest.json").is_file():
        raise PackageError(f"{path}: not an .mlpackage (no Manifest.json)")
    try:
        return ct.utils.load_spec(str(path))
    except Exception as e:
        raise PackageError(f"{path}: unreadable Core ML package ({e})") from None


def weights_dir_of(path: Path) -> str:
    """The weights folder of the package at ``path``, as its manifest names it."""
    manifest = json.loads((path / "Manifest.json").read_text())
    for item in manifest.get("itemInfoEntries", {}).values():
        if item.get("path") == "weights":
            return str(path / "Data" / item.get("author", "com.apple.CoreML") / "weights")
    return str(path / "Data" / "com.apple.CoreML" / "weights")


_NP = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64, "int32": np.int32,
       "int64": np.int64, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "uint16": np.uint16,
       "bool": np.bool_, "uint4": np.uint8, "int4": np.int8, "uint2": np.uint8, "uint1": np.uint8,
       "uint3": np.uint8, "uint6": np.uint8}


def _np_dtype(var):
    from coremltools.converters.mil.mil import types

    dt = var.dtype
    name = types.builtin_to_string(dt)
    if name not in _NP:
        raise UnsupportedOpError(f"dtype {name} of '{var.name}' is not supported by the evaluator")
    return _NP[name]


class Package:
    """A saved .mlpackage, loaded back from disk and evaluated function by function."""

    def __init__(self, path: str | Path):
        ct = coremltools()
        from coremltools.converters.mil.frontend.milproto.load import load as load_mil

        self.path = Path(path)
        spec = _load_spec(ct, self.path)
        if spec.WhichOneof("Type") != "mlProgram":
            raise PackageError(f"{self.path}: not an ML program")
        self.metadata = dict(spec.description.metadata.userDefined)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                self.program = load_mil(spec, spec.specificationVersion, weights_dir_of(self.path))
            except Exception as e:  # a weight file cut short or damaged: coremltools says only where
                raise PackageError(f"{self.path}: its program or weights do not load ({e}): a corrupt or "
                                   "truncated weight file, or a package of a newer Core ML?") from None
        self.functions = list(self.program.functions)
        self.default_function = getattr(self.program, "default_function_name", "main")
        if spec.description.functions:
            self.default_function = spec.description.defaultFunctionName
        self._consts: dict[int, np.ndarray] = {}

    # -- states --------------------------------------------------------------------------
    def state_shapes(self, function: str | None = None) -> dict[str, tuple[tuple[int, ...], type]]:
        """Name -> (shape, numpy dtype) of the states a function declares."""
        from coremltools.converters.mil.mil import types
        from coremltools.converters.mil.mil.types.type_state import is_state

        func = self.program.functions[function or self.default_function]
        out = {}
        for name, var in func.inputs.items():
            if is_state(var.sym_type):
                wrapped = var.sym_type.wrapped_type()
                dtype = _NP[types.builtin_to_string(wrapped.get_primitive())]
                out[name] = (tuple(int(d) for d in wrapped.get_shape()), dtype)
        return out

    def new_state(self) -> dict[str, np.ndarray]:
        """Zero-filled state buffers (as Core ML's ``makeState``)."""
        return {n: np.zeros(shape, dt) for n, (shape, dt) in self.state_shapes().items()}

    # -- evaluation ------------------------------------------------------------------------
    def predict(self, inputs: dict[str, np.ndarray], state: dict[str, np.ndarray] | None = None,
                function: str | None = None) -> dict[str, np.ndarray]:
        """Run one function; ``state`` buffers are updated in place."""
        from coremltools.converters.mil.mil.types.type_state import is_state

        name = function or self.default_function
        if name not in self.program.functions:
            raise PackageError(f"{self.path}: no function '{name}' (has {', '.join(self.functions)})")
        func = self.program.functions[name]
        env: dict[int, object] = {}
        state = state if state is not None else {}
        for iname, var in func.inputs.items():
            if is_state(var.sym_type):
                if iname not in state:
                    raise PackageError(f"state '{iname}' was not given")
                env[id(var)] = ("state", iname)
                continue
            if iname not in inputs:
                raise PackageError(f"input '{iname}' of function '{name}' was not given")
            value = np.asarray(inputs[iname]).astype(_np_dtype(var))
            shape = tuple(var.shape)
            if value.shape != shape:
                raise PackageError(f"input '{iname}' has shape {value.shape}, expected {shape}")
            env[id(var)] = value
        self._run_block(func, env, state)
        return {v.name: np.asarray(env[id(v)]) for v in func.outputs}

    def _run_block(self, block, env, state) -> None:
        for op in block.operations:
            fn = OPS.get(op.op_type)
            if fn is None:
                raise UnsupportedOpError(
                    f"the reference evaluator does not implement MIL op '{op.op_type}' (op {op.name})")
            if op.op_type == "const" or op.op_type.startswith("constexpr_"):
                key = id(op)
                if key not in self._consts:
                    self._consts[key] = fn(_Args(op, env, state), op)
                results = self._consts[key]
            else:
                results = fn(_Args(op, env, state), op)
            if not isinstance(results, tuple):
                results = (results,)
            for var, value in zip(op.outputs, results):
                if isinstance(value, np.ndarray) or np.isscalar(value):
                    value = np.asarray(value)
                    if not isinstance(value.dtype, np.dtypes.StrDType):
                        value = value.astype(_np_dtype(var), copy=False)
                env[id(var)] = value


class _Args:
    """Input values of one op, by name (const inputs straight from the program)."""

    def __init__(self, op, env, state):
        self.op, self.env, self.state = op, env, state

    def __call__(self, name: str, default=None):
        var = self.op.inputs.get(name)
        if var is None:
            return default
        if isinstance(var, (list, tuple)):
            return [self._value(v) for v in var]
        return self._value(var)

    def _value(self, var):
        if id(var) in self.env:
            return self.env[id(var)]
        if var.val is not None:
            return var.val
        raise UnsupportedOpError(f"value of '{var.name}' (input of {self.op.op_type} {self.op.name}) "
                                 "is not available")

    def state_name(self, name: str) -> str:
        ref = self.env.get(id(self.op.inputs[name]))
        if not (isinstance(ref, tuple) and ref[0] == "state"):
            raise UnsupportedOpError(f"{self.op.op_type} {self.op.name}: input is not a state")
        return ref[1]


# -- op implementations ------------------------------------------------------------------------
def _f(x):
    """Compute dtype: float32 for fp16 (and fp32) values, ints and bools as they are."""
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _binary(fn):
    return lambda a, op: fn(_f(a("x")), _f(a("y")))


def _unary(fn):
    return lambda a, op: fn(_f(a("x")))


def _axes(a):
    axes = a("axes")
    return None if axes is None else tuple(int(i) for i in np.atleast_1d(axes))


def _reduce(fn):
    def run(a, op):
        x = _f(a("x"))
        return fn(x, axis=_axes(a), keepdims=bool(a("keep_dims", False)))
    return run


def _argreduce(fn):
    def run(a, op):
        x = _f(a("x"))
        axis = int(a("axis", -1))
        out = fn(x, axis=axis)
        return np.expand_dims(out, axis) if bool(a("keep_dims", False)) else out
    return run


def _softmax(a, op):
    x = _f(a("x"))
    axis = int(a("axis", -1))
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


def _slices(a, x, squeeze=True):
    rank = x.ndim
    begin = np.asarray(a("begin")).astype(int).tolist()
    end = np.asarray(a("end")).astype(int).tolist()
    stride = np.asarray(a("stride", [1] * rank)).astype(int).tolist()
    bm = np.asarray(a("begin_mask", [False] * rank)).tolist()
    em = np.asarray(a("end_mask", [False] * rank)).tolist()
    sm = np.asarray(a("squeeze_mask", [False] * rank)).tolist()
    idx = []
    for i in range(rank):
        if sm[i]:
            idx.append(begin[i] if squeeze else slice(begin[i], begin[i] + 1 if begin[i] != -1 else None))
            continue
        b = None if bm[i] else begin[i]
        e = None if em[i] else end[i]
        idx.append(slice(b, e, stride[i]))
    return tuple(idx)


def _slice_by_index(a, op):
    x = np.asarray(a("x"))
    return x[_slices(a, x)]


def _slice_update(a, op):
    x = np.array(a("x"), copy=True)
    upd = np.asarray(a("update"))
    idx = _slices(a, x, squeeze=False)
    target = x[idx]
    if target.size != upd.size:
        raise UnsupportedOpError(f"slice_update {op.name}: update of {upd.shape} into a slice of "
                                 f"{target.shape} (out of bounds?)")
    x[idx] = upd.reshape(target.shape).astype(x.dtype)
    return x


def _reshape(a, op):
    x = np.asarray(a("x"))
    shape = [int(s) for s in np.asarray(a("shape")).tolist()]
    if len(shape) == x.ndim:
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _gather(a, op):
    x = np.asarray(a("x"))
    idx = np.asarray(a("indices")).astype(np.int64)
    axis = int(a("axis", 0))
    if int(a("batch_dims", 0)) != 0:
        raise UnsupportedOpError(f"gather {op.name}: batch_dims != 0")
    n = x.shape[axis]
    if np.any(idx >= n) or np.any(idx < -n):
        raise UnsupportedOpError(f"gather {op.name}: index out of range (Core ML: undefined)")
    return np.take(x, np.where(idx < 0, idx + n, idx), axis=axis)


def _gather_along_axis(a, op):
    x = np.asarray(a("x"))
    idx = np.asarray(a("indices")).astype(np.int64)
    axis = int(a("axis", 0))
    n = x.shape[axis]
    return np.take_along_axis(x, np.where(idx < 0, idx + n, idx), axis=axis)


def _topk(a, op):
    x = _f(a("x"))
    k = int(a("k", 1))
    axis = int(a("axis", -1))
    ascending = bool(a("ascending", False))
    order = np.argsort(x if ascending else -x, axis=axis, kind="stable")
    if k >= 0:
        order = np.take(order, np.arange(k), axis=axis)
    values = np.take_along_axis(x, order, axis=axis)
    if a("return_indices", True) is False:
        return values
    return values, order.astype(np.int32)


def _concat(a, op):
    values = [np.asarray(v) for v in a("values")]
    axis = int(a("axis"))
    if bool(a("interleave", False)):
        raise UnsupportedOpError(f"concat {op.name}: interleave")
    values = [v.reshape(1) if v.ndim == 0 else v for v in values]
    dt = np.result_type(*values)
    return np.concatenate([v.astype(dt) for v in values], axis=axis)


def _linear(a, op):
    x, w = _f(a("x")), _f(a("weight"))
    y = x @ w.T
    b = a("bias")
    return y + _f(b) if b is not None else y


def _matmul(a, op):
    x, y = _f(a("x")), _f(a("y"))
    if bool(a("transpose_x", False)):
        x = np.swapaxes(x, -1, -2)
    if bool(a("transpose_y", False)):
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def _cast(a, op):
    dtype = str(a("dtype"))
    if dtype not in _NP:
        raise UnsupportedOpError(f"cast {op.name}: dtype {dtype}")
    x = np.asarray(a("x"))
    if np.issubdtype(_NP[dtype], np.integer) and np.issubdtype(x.dtype, np.floating):
        x = np.trunc(x)
    return x.astype(_NP[dtype])


def _blockwise_shift_scale(a, op):
    data = np.asarray(a("data")).astype(np.float32)
    scale = np.asarray(a("scale"))
    out_dtype = scale.dtype
    scale = scale.astype(np.float32)
    offset = a("offset")
    reps = [d // s for d, s in zip(data.shape, scale.shape)]

    def expand(t):
        for axis, r in enumerate(reps):
            if r > 1:
                t = np.repeat(t, r, axis=axis)
        return t

    if offset is not None:
        data = data - expand(np.asarray(offset).astype(np.float32))
    return (expand(scale) * data).astype(out_dtype)


def _read_state(a, op):
    return np.array(a.state[a.state_name("input")], copy=True)


def _write_state(a, op):
    name = a.state_name("input")
    data = np.asarray(a("data"))
    a.state[name][...] = data.astype(a.state[name].dtype)
    return ()


def _update_state(a, op):
    name = a.state_name("state")
    value = np.asarray(a("value"))
    a.state[name][...] = value.astype(a.state[name].dtype)
    return np.array(a.state[name], copy=True)


def _select(a, op):
    return np.where(np.asarray(a("cond")).astype(bool), _f(a("a")), _f(a("b")))


def _expand_dims(a, op):
    x = np.asarray(a("x"))
    for axis in sorted(int(i) for i in np.atleast_1d(a("axes"))):
        x = np.expand_dims(x, axis if axis >= 0 else x.ndim + 1 + axis)
    return x


def _squeeze(a, op):
    x = np.asarray(a("x"))
    axes = a("axes")
    return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(int(i) for i in np.atleast_1d(axes)))


def _split(a, op):
    x = np.asarray(a("x"))
    axis = int(a("axis"))
    sizes = a("split_sizes")
    if sizes is not None:
        cuts = np.cumsum(np.asarray(sizes).astype(int))[:-1]
        return tuple(np.split(x, cuts, axis=axis))
    return tuple(np.split(x, int(a("num_splits")), axis=axis))


def _range_1d(a, op):
    return np.arange(a("start"), a("end"), a("step"))


def _layer_norm(a, op):
    x = _f(a("x"))
    axes = tuple(int(i) for i in np.atleast_1d(a("axes")))
    eps = float(a("epsilon", 1e-5))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if a("gamma") is not None:
        y = y * _f(a("gamma"))
    if a("beta") is not None:
        y = y + _f(a("beta"))
    return y


def _gelu(a, op):
    from math import erf, pi, sqrt

    x = _f(a("x"))
    mode = str(a("mode", "EXACT"))
    if mode == "EXACT":
        return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)).astype(np.float32))
    if mode == "TANH_APPROXIMATION":
        return 0.5 * x * (1 + np.tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
    return x / (1 + np.exp(-1.702 * x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _rsqrt(a, op):
    return 1.0 / np.sqrt(_f(a("x")) + float(a("epsilon", 1e-12)))


def _band_part(a, op):
    x = np.asarray(a("x"))
    lower, upper = int(a("lower", -1)), int(a("upper", -1))
    m, n = x.shape[-2:]
    i = np.arange(m)[:, None]
    j = np.arange(n)[None, :]
    keep = np.ones((m, n), bool)
    if lower >= 0:
        keep &= (i - j) <= lower
    if upper >= 0:
        keep &= (j - i) <= upper
    return np.where(keep, x, 0)


OPS = {
    "const": lambda a, op: op.outputs[0].val,
    "constexpr_blockwise_shift_scale": _blockwise_shift_scale,
    "read_state": _read_state,
    "write_state": _write_state,
    "coreml_update_state": _update_state,
    "identity": lambda a, op: np.asarray(a("x")),
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "real_div": _binary(np.divide),
    "floor_div": _binary(np.floor_divide),
    "mod": _binary(np.mod),
    "pow": _binary(np.power),
    "maximum": _binary(np.maximum),
    "minimum": _binary(np.minimum),
    "equal": _binary(np.equal),
    "not_equal": _binary(np.not_equal),
    "greater": _binary(np.greater),
    "greater_equal": _binary(np.greater_equal),
    "less": _binary(np.less),
    "less_equal": _binary(np.less_equal),
    "logical_and": _binary(np.logical_and),
    "logical_or": _binary(np.logical_or),
    "logical_xor": _binary(np.logical_xor),
    "logical_not": _unary(np.logical_not),
    "abs": _unary(np.abs),
    "neg": _unary(np.negative),
    "exp": _unary(np.exp),
    "log": lambda a, op: np.log(_f(a("x")) + float(a("epsilon", 0.0))),
    "sqrt": _unary(np.sqrt),
    "rsqrt": _rsqrt,
    "inverse": lambda a, op: 1.0 / (_f(a("x")) + float(a("epsilon", 0.0))),
    "square": _unary(np.square),
    "tanh": _unary(np.tanh),
    "sin": _unary(np.sin),
    "cos": _unary(np.cos),
    "floor": _unary(np.floor),
    "ceil": _unary(np.ceil),
    "round": _unary(np.round),
    "sign": _unary(np.sign),
    "relu": _unary(lambda x: np.maximum(x, 0)),
    "sigmoid": _unary(_sigmoid),
    "silu": _unary(lambda x: x * _sigmoid(x)),
    "gelu": _gelu,
    "clip": lambda a, op: np.clip(_f(a("x")), _f(a("alpha")), _f(a("beta"))),
    "softmax": _softmax,
    "reduce_sum": _reduce(np.sum),
    "reduce_mean": _reduce(np.mean),
    "reduce_max": _reduce(np.max),
    "reduce_min": _reduce(np.min),
    "reduce_prod": _reduce(np.prod),
    "reduce_argmax": _argreduce(np.argmax),
    "reduce_argmin": _argreduce(np.argmin),
    "reduce_log_sum_exp": _reduce(lambda x, axis, keepdims: np.log(np.sum(np.exp(
        x - np.max(x, axis=axis, keepdims=True)), axis=axis, keepdims=keepdims)) + np.max(
        x, axis=axis, keepdims=keepdims)),
    "linear": _linear,
    "matmul": _matmul,
    "layer_norm": _layer_norm,
    "select": _select,
    "cast": _cast,
    "reshape": _reshape,
    "transpose": lambda a, op: np.transpose(np.asarray(a("x")), [int(i) for i in a("perm")]),
    "expand_dims": _expand_dims,
    "squeeze": _squeeze,
    "concat": _concat,
    "stack": lambda a, op: np.stack([np.asarray(v) for v in a("values")], axis=int(a("axis"))),
    "split": _split,
    "tile": lambda a, op: np.tile(np.asarray(a("x")), [int(r) for r in a("reps")]),
    "slice_by_index": _slice_by_index,
    "slice_update": _slice_update,
    "gather": _gather,
    "gather_along_axis": _gather_along_axis,
    "topk": _topk,
    "shape": lambda a, op: np.array(np.asarray(a("x")).shape, np.int32),
    "fill": lambda a, op: np.full([int(s) for s in np.asarray(a("shape"))], a("value", 0.0)),
    "range_1d": _range_1d,
    "band_part": _band_part,
}


def describe(path: str | Path) -> dict:
    """Functions, inputs, outputs and states of a package (for messages and docs)."""
    pkg = Package(path)
    out = {}
    for name, func in pkg.program.functions.items():
        out[name] = {
            "inputs": {k: list(v.shape) for k, v in func.inputs.items()},
            "outputs": {v.name: list(v.shape) for v in func.outputs},
        }
    return out


__all__ = ["OPS", "Package", "PackageError", "UnsupportedOpError", "describe", "read_metadata"]
