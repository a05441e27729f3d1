"""A CPU emulator of Metal compute kernels written for ``mx.fast.metal_kernel``.

``EmulatedKernel`` takes the arguments of ``mx.fast.metal_kernel`` and, when called with the same
keywords as the kernel MLX returns, builds the source MLX would build (``metal_source``: the
generated signature with ``const device T*`` / ``const constant T*`` / ``const constant T&``
inputs, ``NAME_shape`` / ``NAME_strides`` / ``NAME_ndim`` for the names the source mentions,
``device T*`` or ``device atomic<T>*`` outputs, the template parameters and the thread attributes
the source names), compiles it with the system C++ compiler against ``include/metal_emu.h`` (Metal's
types and functions in C++20) and runs the grid on the CPU.

How it runs: the grid counts threads, as in MLX (``dispatchThreads``): threadgroups are
``min(threadgroup, grid)`` per dimension and the last ones along a dimension may be partial. Each
threadgroup runs on one OS thread with every Metal thread a fiber; fibers run one after the other
until they block at a ``threadgroup_barrier``, a ``simdgroup_barrier`` or a simdgroup function,
in the order ``schedule`` picks: "forward", "reverse" or "random" (all simdgroups step by step
together), or "simdgroups" / "simdgroups-reverse" (each simdgroup, first to last or last to first,
runs alone to its next threadgroup barrier). A simdgroup function completes when every live lane
of the simdgroup has reached one (lanes that returned are inactive, as on the GPU); a threadgroup
barrier when every thread has. So a thread never sees another thread's writes unless a barrier or
a simdgroup function ordered them: a missing barrier reads stale data in one schedule or another
(between simdgroups, one that runs ahead and overwrites a tile another still reads, in the
"simdgroups" schedules). Threadgroup arrays start poisoned in each threadgroup (every byte 0xFF:
NaN for floats, -1 for integers), as do outputs without ``init_value``; a shuffle from an inactive
lane returns poison. Errors the GPU would leave undefined are raised: a barrier some threads skip
by returning, lanes of one simdgroup waiting at different simdgroup functions, more than 32 KB
of threadgroup memory, more than 1024 threads per threadgroup, writes past an output's end.

Builds are cached by a hash of the generated C++ source, the header and the compiler flags in
``$MLX_SPECSTREAM_KERNEL_CACHE`` (default ``~/.cache/mlx-specstream/kernels``). A compile error is
raised as :class:`MetalCompileError` with the kernel's own file names and line numbers
(``NAME.metal:LINE`` for the source, ``NAME.header:LINE`` for the header).

What is not emulated: simdgroup matrices (``simdgroup_float8x8`` ...), textures, swizzles
(``v.xy``), ``packed_float3``, the exact rounding of Metal's fast-math functions, and the order of
floating-point reductions inside ``simd_sum`` (sums are taken in lane order).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from .. import machine

INCLUDE_DIR = Path(__file__).resolve().parent / "include"

# mlx/backend/common/metal_kernel.cpp: the thread attributes a kernel source may name, in the
# order MLX writes them into the signature.
ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
]
MAX_CONSTANT_ARRAY_SIZE = 8  # inputs with fewer elements go in the constant address space

_MX_TYPES = {
    mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t", mx.bool_: "bool",
    mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
    mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t",
}
# numpy storage of each Metal type (bfloat16 as its raw bits)
_NP_STORAGE = {
    "float": np.float32, "float16_t": np.float16, "bfloat16_t": np.uint16, "bool": np.bool_,
    "int8_t": np.int8, "int16_t": np.int16, "int32_t": np.int32, "int64_t": np.int64,
    "uint8_t": np.uint8, "uint16_t": np.uint16, "uint32_t": np.uint32, "uint64_t": np.uint64,
}
_NP_TYPES = {np.dtype(v): k for k, v in _NP_STORAGE.items() if k != "bfloat16_t"}
SCHEDULES = {"forward": 0, "reverse": 1, "random": 2, "simdgroups": 3, "simdgroups-reverse": 4}


class MetalCompileError(RuntimeError):
    """The kernel did not compile; the message cites ``NAME.metal:LINE`` / ``NAME.header:LINE``."""

    def __init__(self, message: str, compiler_output: str = "", cpp_source: str = ""):
        super().__init__(message)
        self.compiler_output = compiler_output
        self.cpp_source = cpp_source


class KernelRuntimeError(RuntimeError):
    """The emulated kernel did something Metal leaves undefined (see the module doc)."""


def type_string(dtype) -> str:
    """Metal type name MLX uses for an mx or numpy dtype (``get_type_string``)."""
    if isinstance(dtype, mx.Dtype):
        if dtype not in _MX_TYPES:
            raise TypeError(f"unsupported dtype for a Metal kernel: {dtype}")
        return _MX_TYPES[dtype]
    dt = np.dtype(dtype)
    if dt not in _NP_TYPES:
        raise TypeError(f"unsupported dtype for a Metal kernel: {dt}")
    return _NP_TYPES[dt]


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as MLX and Metal do."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


@dataclass
class _Input:
    name: str
    data: np.ndarray  # storage (bfloat16 as uint16); strides may be non-contiguous
    type: str

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size


def _as_input(name: str, x, ensure_row_contiguous: bool) -> _Input:
    if isinstance(x, mx.array):
        t = type_string(x.dtype)
        data = np.array(x.view(mx.uint16)) if x.dtype == mx.bfloat16 else np.array(x)
        return _Input(name, data, t)
    if isinstance(x, (bool, np.bool_)):
        return _Input(name, np.array(bool(x)), "bool")
    if isinstance(x, int):
        return _Input(name, np.array(x, np.int32), "int32_t")
    if isinstance(x, float):
        return _Input(name, np.array(x, np.float32), "float")
    if isinstance(x, np.generic):
        x = np.array(x)
    if isinstance(x, np.ndarray):
        t = type_string(x.dtype)
        if ensure_row_contiguous or any(s % x.itemsize for s in x.strides):
            x = np.ascontiguousarray(x)
        return _Input(name, x, t)
    raise TypeError(f"input `{name}`: expected an mx.array, a numpy array or a Python scalar")


def _template_hash(template) -> str:
    parts = []
    for _, v in template:
        if isinstance(v, bool):
            parts.append("1" if v else "0")
        elif isinstance(v, int):
            parts.append(str(v))
        else:
            parts.append(type_string(v))
    return "_" + "_".join(parts)


def kernel_name(name: str, template, inputs: list[_Input], output_dtypes) -> str:
    """The function name MLX gives a kernel instance (``custom_kernel_NAME_...``)."""
    out = "custom_kernel_" + name
    if template:
        out += _template_hash(template)
    for a in inputs:
        out += "_" + a.type + ("s" if a.ndim == 0 else "c" if a.size < MAX_CONSTANT_ARRAY_SIZE else "")
    for d in output_dtypes:
        out += "_" + type_string(d)
    return out


def _template_params(template) -> str:
    params = []
    for n, v in template:
        kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "typename"
        params.append(f"{kind} {n}")
    return "template <" + ", ".join(params) + ">\n"


def _template_args(template, cpp: bool) -> str:
    vals = []
    for _, v in template:
        if isinstance(v, bool):
            vals.append(("true" if v else "false") if cpp else ("1" if v else "0"))
        elif isinstance(v, int):
            vals.append(str(v))
        else:
            vals.append(type_string(v))
    return "<" + ", ".join(vals) + ">"


def _shape_infos(source: str, input_names) -> list[tuple[bool, bool, bool]]:
    return [(f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source) for n in input_names]


def attributes_used(source: str) -> list[tuple[str, str]]:
    return [(a, t) for a, t in ATTRIBUTES if a in source]


def write_signature(func: str, source: str, input_names, inputs: list[_Input], output_names,
                    output_dtypes, template, atomic_outputs: bool) -> str:
    """The kernel's signature line by line, as ``write_signature`` in MLX writes it."""
    s = _template_params(template) if template else ""
    s += f"[[kernel]] void {func}(\n"
    infos = _shape_infos(source, input_names)
    attrs = attributes_used(source)
    index = 0
    for a, (sh, st, nd) in zip(inputs, infos):
        loc = "constant" if a.size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if a.ndim == 0 else "*"
        s += f"  const {loc} {a.type}{ref} {a.name} [[buffer({index})]],\n"
        index += 1
        if a.ndim > 0:
            if sh:
                s += f"  const constant int* {a.name}_shape [[buffer({index})]],\n"
                index += 1
            if st:
                s += f"  const constant int64_t* {a.name}_strides [[buffer({index})]],\n"
                index += 1
            if nd:
                s += f"  const constant int& {a.name}_ndim [[buffer({index})]],\n"
                index += 1
    for i, (n, d) in enumerate(zip(output_names, output_dtypes)):
        t = type_string(d)
        t = f"atomic<{t}>" if atomic_outputs else t
        s += f"  device {t}* {n} [[buffer({index})]]"
        last = i == len(output_names) - 1 and not attrs
        s += ") {\n" if last else ",\n"
        index += 1
    for i, (a, t) in enumerate(attrs):
        s += f"  {t} {a} [[{a}]]" + (") {\n" if i == len(attrs) - 1 else ",\n")
    return s


def metal_source(name, input_names, output_names, source, header, inputs, output_dtypes, template,
                 atomic_outputs) -> str:
    """The full source MLX compiles for this call (what ``verbose=True`` prints)."""
    func = kernel_name(name, template, inputs, output_dtypes)
    text = header + write_signature(func, source, input_names, inputs, output_names, output_dtypes,
                                    template, atomic_outputs)
    text += source + "\n}\n"
    if template:
        inst = func + _template_args(template, cpp=False)
        text += f'\ntemplate [[host_name("{func}")]] [[kernel]] decltype({inst}) {inst};\n'
    return text


# ---- C++ translation ------------------------------------------------------------------------

_HALF_LITERAL = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[hH]\b")
_TG_KEYWORD = re.compile(r"\bthreadgroup\b(?!_)")


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<[(":
            depth += 1
        elif ch in ">])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def rewrite_threadgroup_declarations(text: str, counter: list[int]) -> str:
    """``threadgroup T a[N], b;`` -> references to per-threadgroup storage (mtlemu::tg_storage).

    Only declarations that start a statement and declare storage are rewritten; the keyword in
    pointer or reference types (``threadgroup float* p``) is left to the no-op macro.
    """
    out, pos = [], 0
    for m in _TG_KEYWORD.finditer(text):
        if m.start() < pos:
            continue
        before = text[: m.start()].rstrip(" \t")
        if before and before[-1] not in ";{}\n":
            continue
        end = text.find(";", m.end())
        if end < 0:
            continue
        decl = text[m.end() : end]
        outside = re.sub(r"\[[^\]]*\]", "", decl)  # array bounds may hold `*` and `(`
        if any(c in outside for c in "*&(=") or "{" in decl or "}" in decl:
            continue
        parts = _split_top_level(decl.strip())
        first = parts[0].strip()
        mm = re.match(r"^(.*?)([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$", first, re.S)
        decls = []
        if mm and mm.group(1).strip():
            base = mm.group(1).strip()
            decls.append((mm.group(2), mm.group(3)))
            for p in parts[1:]:
                pm = re.match(r"^\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$", p, re.S)
                if not pm:
                    decls = []
                    break
                decls.append((pm.group(1), pm.group(2)))
        if not decls:
            # left alone it would become per-thread storage: a silent wrong result
            raise ValueError(f"the emulator cannot read this threadgroup declaration: "
                             f"`threadgroup{decl};`")
        repl = []
        for name, dims in decls:
            dims = re.sub(r"\s+", "", dims)
            repl.append(f"auto& {name} = ::mtlemu::tg_storage<{base}{dims}, {counter[0]}>()")
            counter[0] += 1
        # keep the line count: newlines inside the declaration go after it
        out.append(text[pos : m.start()] + "; ".join(repl) + ";" + "\n" * decl.count("\n"))
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def to_cpp(text: str, counter: list[int], filename: str = "") -> str:
    text = _HALF_LITERAL.sub(r"half(\1)", text)
    try:
        return rewrite_threadgroup_declarations(text, counter)
    except ValueError as e:
        raise MetalCompileError(f"{filename}: {e}") from None


def _c_identifier(s: str) -> str:
    return re.sub(r"\W", "_", s)


def cpp_source(name, input_names, output_names, source, header, inputs: list[_Input], output_dtypes,
               template, atomic_outputs) -> str:
    func = kernel_name(name, template, inputs, output_dtypes)
    cfunc = _c_identifier(func)
    counter = [0]
    sig = write_signature(cfunc, source, input_names, inputs, output_names, output_dtypes, template,
                          atomic_outputs)
    text = '#include "metal_emu.h"\n'
    if header:
        text += f'#line 1 "{name}.header"\n' + to_cpp(header, counter, f"{name}.header") + "\n"
    text += f'#line 1 "{name} (generated signature)"\n' + sig
    text += f'#line 1 "{name}.metal"\n' + to_cpp(source, counter, f"{name}.metal") + "\n}\n"
    # the launcher: one call of the kernel per emulated thread
    args, k = [], 0
    infos = _shape_infos(source, input_names)
    for a, (sh, st, nd) in zip(inputs, infos):
        args.append(f"*(const {a.type}*)b[{k}]" if a.ndim == 0 else f"(const {a.type}*)b[{k}]")
        k += 1
        if a.ndim > 0:
            for used, ctype in ((sh, "(const int*)"), (st, "(const int64_t*)"), (nd, "*(const int*)")):
                if used:
                    args.append(f"{ctype}b[{k}]")
                    k += 1
    for d in output_dtypes:
        t = type_string(d)
        args.append(f"(metal::atomic<{t}>*)b[{k}]" if atomic_outputs else f"({t}*)b[{k}]")
        k += 1
    args += [f"a.{attr}" for attr, _ in attributes_used(source)]
    targs = _template_args(template, cpp=True) if template else ""
    text += '#line 1 "mtlemu_launcher.cpp"\n'
    text += "namespace {\nstruct MtlemuCall {\n  void** b;\n"
    text += "  void operator()(const ::mtlemu::ThreadAttrs& a) const {\n    (void)a;\n"
    text += f"    {cfunc}{targs}(\n      " + ",\n      ".join(args) + ");\n  }\n};\n}  // namespace\n"
    text += (
        'extern "C" __attribute__((visibility("default"))) int mtlemu_run(void** b, const long long* '
        "cfg, char* err, int errlen) {\n"
        "  ::mtlemu::LaunchConfig c;\n"
        "  std::memcpy(&c, cfg, sizeof(c));\n"
        "  MtlemuCall call{b};\n"
        "  return ::mtlemu::launch(c, call, err, errlen);\n}\n"
    )
    return text


# ---- compilation and cache --------------------------------------------------------------------

def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$MLX_SPECSTREAM_KERNEL_CACHE``, else the user's cache
    (:func:`machine.cache_dir`)."""
    d = os.environ.get("MLX_SPECSTREAM_KERNEL_CACHE") or machine.cache_dir("kernels")
    if d is None:
        raise RuntimeError("no folder to compile kernels into: set MLX_SPECSTREAM_KERNEL_CACHE")
    return Path(d)


def compiler() -> str:
    return os.environ.get("CXX", "g++")


def compile_flags() -> list[str]:
    """g++ flags; $MLX_SPECSTREAM_EMU_OPT replaces -O2, $MLX_SPECSTREAM_EMU_CXXFLAGS adds flags."""
    opt = os.environ.get("MLX_SPECSTREAM_EMU_OPT", "-O2")
    flags = ["-std=c++20", opt, "-fPIC", "-shared", "-pthread", "-w", "-fsingle-precision-constant",
             "-fno-strict-aliasing", "-ffp-contract=off", "-fvisibility=hidden",
             "-fvisibility-inlines-hidden", "-I", str(INCLUDE_DIR)]
    if "clang" not in _compiler_version():
        flags.append("-fno-gnu-unique")  # GCC would merge per-group storage across kernel libraries
    return flags + os.environ.get("MLX_SPECSTREAM_EMU_CXXFLAGS", "").split()


_header_digest: str | None = None
_compiler_id: str | None = None
_libs: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def _compiler_version() -> str:
    global _compiler_id
    if _compiler_id is None:
        try:
            _compiler_id = subprocess.run([compiler(), "--version"], capture_output=True, text=True,
                                          check=True).stdout.splitlines()[0]
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"the Metal emulator needs a C++20 compiler ({compiler()}): {e}") from e
    return _compiler_id


def _digest_inputs() -> str:
    global _header_digest
    if _header_digest is None:
        h = hashlib.sha256()
        for p in sorted(INCLUDE_DIR.iterdir()):
            h.update(p.name.encode() + p.read_bytes())
        _header_digest = h.hexdigest()
    return _header_digest + _compiler_version() + platform.machine()  # one cache, several machines


def _readable_errors(output: str, name: str) -> str:
    keep = [ln for ln in output.splitlines()
            if any(tag in ln for tag in (f"{name}.metal:", f"{name}.header:", "(generated signature)"))
            and ("error" in ln or "note" in ln)]
    return "\n".join(keep) if keep else output.strip()[-4000:]


def build(cpp: str, name: str) -> ctypes.CDLL:
    """Compile (or fetch from the cache) and load the shared library of a C++ kernel source."""
    flags = compile_flags()
    key = hashlib.sha256((cpp + "\0" + " ".join(flags) + "\0" + _digest_inputs()).encode()).hexdigest()[:32]
    with _lock:
        if key in _libs:
            return _libs[key]
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        lib_path = d / f"{_c_identifier(name)[:40]}-{key}.so"
        if not lib_path.exists():
            with tempfile.TemporaryDirectory(dir=d) as tmp:
                src = Path(tmp) / "kernel.cpp"
                src.write_text(cpp)
                out = Path(tmp) / "kernel.so"
                r = subprocess.run([compiler(), *flags, str(src), "-o", str(out)], capture_output=True,
                                   text=True)
                if r.returncode != 0:
                    raise MetalCompileError(
                        f"kernel `{name}` does not compile:\n" + _readable_errors(r.stderr, name),
                        r.stderr, cpp)
                os.replace(out, lib_path)
        lib = ctypes.CDLL(str(lib_path))
        lib.mtlemu_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong),
                                   ctypes.c_char_p, ctypes.c_int]
        lib.mtlemu_run.restype = ctypes.c_int
        _libs[key] = lib
        return lib


# ---- running ---------------------------------------------------------------------------------

_defaults = {
    "schedule": os.environ.get("MLX_SPECSTREAM_EMU_SCHEDULE", "forward"),
    "workers": 0,  # 0: $MLX_SPECSTREAM_EMU_WORKERS, else up to 4 of this process's cores
    "seed": 0,
    "stack_kb": 256,
}


@functools.cache  # read once, not at every kernel launch
def _env_workers() -> int:
    return machine.env_whole_number("MLX_SPECSTREAM_EMU_WORKERS", 0, 0, "up to 4 cores run a kernel's "
                                    "threadgroups") or min(4, machine.cores())


def set_defaults(**kw) -> dict:
    """Change the default ``schedule``, ``workers``, ``seed`` or ``stack_kb``; returns the old ones."""
    old = dict(_defaults)
    for k, v in kw.items():
        if k not in _defaults:
            raise KeyError(k)
        _defaults[k] = v
    return old


_GUARD = 64


def _output_buffer(shape, dtype, init_value):
    t = type_string(dtype)
    storage = np.dtype(_NP_STORAGE[t])
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    raw = np.empty(n * storage.itemsize + _GUARD, np.uint8)
    raw[-_GUARD:] = 0xA5
    arr = raw[: n * storage.itemsize].view(storage).reshape(tuple(shape))
    if init_value is None:
        raw[: n * storage.itemsize] = 0xFF
    elif t == "bfloat16_t":
        arr[...] = float_to_bf16_bits(np.array(init_value, np.float32))
    else:
        arr[...] = np.array(init_value).astype(storage)
    return raw, arr, t


class EmulatedKernel:
    """The emulator's counterpart of the callable ``mx.fast.metal_kernel`` returns."""

    def __init__(self, name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                 atomic_outputs=False, compile_options=None):
        if not output_names:
            raise ValueError("[metal_kernel] Must specify at least one output.")
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header
        self.ensure_row_contiguous = ensure_row_contiguous
        self.atomic_outputs = atomic_outputs  # compile_options (Metal compiler flags): nothing to set in g++

    def _prepare(self, inputs, output_dtypes, template):
        if len(inputs) != len(self.input_names):
            raise ValueError(f"[metal_kernel] Expected `inputs` to have size {len(self.input_names)} "
                             f"but got size {len(inputs)}.")
        if len(output_dtypes) != len(self.output_names):
            raise ValueError(f"[metal_kernel] Expected `output_dtypes` to have size "
                             f"{len(self.output_names)} but got size {len(output_dtypes)}.")
        template = list(template or [])
        for n, v in template:
            if not isinstance(v, (bool, int, mx.Dtype)):
                raise TypeError(f"[metal_kernel] Invalid template argument `{n}`. Must be "
                                "`mlx.core.Dtype`, `int` or `bool`.")
        args = [_as_input(n, x, self.ensure_row_contiguous) for n, x in zip(self.input_names, inputs)]
        return args, template

    def metal_source(self, *, inputs, output_dtypes, template=None) -> str:
        args, template = self._prepare(inputs, output_dtypes, template)
        return metal_source(self.name, self.input_names, self.output_names, self.source, self.header,
                            args, output_dtypes, template, self.atomic_outputs)

    def cpp_source(self, *, inputs, output_dtypes, template=None) -> str:
        args, template = self._prepare(inputs, output_dtypes, template)
        return cpp_source(self.name, self.input_names, self.output_names, self.source, self.header,
                          args, output_dtypes, template, self.atomic_outputs)

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                 init_value=None, verbose=False, stream=None, schedule=None, workers=None, seed=None):
        args, template = self._prepare(inputs, output_dtypes, template)
        if len(output_shapes) != len(self.output_names):
            raise ValueError(f"[metal_kernel] Expected `output_shapes` to have size "
                             f"{len(self.output_names)} but got size {len(output_shapes)}.")
        if verbose:
            src = metal_source(self.name, self.input_names, self.output_names, self.source, self.header,
                               args, output_dtypes, template, self.atomic_outputs)
            print(f"Generated source code for `{self.name}`:\n```\n{src}\n```")
        cpp = cpp_source(self.name, self.input_names, self.output_names, self.source, self.header, args,
                         output_dtypes, template, self.atomic_outputs)
        lib = build(cpp, self.name)

        keep, ptrs = [], []
        infos = _shape_infos(self.source, self.input_names)
        for a, (sh, st, nd) in zip(args, infos):
            keep.append(a.data)
            ptrs.append(a.data.ctypes.data)
            if a.ndim > 0:
                extra = []
                if sh:
                    extra.append(np.array(a.data.shape, np.int32))
                if st:
                    extra.append(np.array([s // a.data.itemsize for s in a.data.strides], np.int64))
                if nd:
                    extra.append(np.array(a.ndim, np.int32))
                for e in extra:
                    keep.append(e)
                    ptrs.append(e.ctypes.data)
        outs = []
        for shape, dtype in zip(output_shapes, output_dtypes):
            raw, arr, t = _output_buffer(tuple(int(s) for s in shape), dtype, init_value)
            outs.append((raw, arr, t))
            ptrs.append(raw.ctypes.data)
        if len(grid) != 3 or len(threadgroup) != 3:
            raise ValueError("grid and threadgroup must have 3 entries")
        sched = schedule if schedule is not None else _defaults["schedule"]
        if sched not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}")
        cfg = (ctypes.c_longlong * 10)(
            *[int(g) for g in grid], *[int(t) for t in threadgroup],
            int(workers or _defaults["workers"] or _env_workers()), SCHEDULES[sched],
            int(_defaults["seed"] if seed is None else seed), int(_defaults["stack_kb"]))
        bufs = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        err = ctypes.create_string_buffer(4096)
        rc = lib.mtlemu_run(bufs, cfg, err, len(err))
        if rc != 0:
            raise KernelRuntimeError(f"kernel `{self.name}`: {err.value.decode(errors='replace')}")
        results = []
        for n, (raw, arr, t) in zip(self.output_names, outs):
            if not np.all(raw[-_GUARD:] == 0xA5):
                raise KernelRuntimeError(f"kernel `{self.name}` wrote past the end of output `{n}`")
            results.append(bf16_bits_to_float(arr) if t == "bfloat16_t" else arr)
        return results


def to_mx(x: np.ndarray, dtype) -> mx.array:
    """An emulator output as an mx array of ``dtype`` (bfloat16 outputs come back as exact float32)."""
    return mx.array(x).astype(dtype)


if sys.platform == "win32":  # pragma: no cover
    raise ImportError("the Metal emulator needs a POSIX system with a C++20 compiler")
