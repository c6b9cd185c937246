"""A GGUF's metadata and tensor table through ggml's own reader (gguf_init_from_file in libggml-base, shipped with
llama-cpp-python), with no weights read. The `gguf` package's reader builds a numpy view for every element of the
vocabulary arrays: 1.7-3 s for a 49k-token model, tens of seconds on a slow box at first boot; this takes
milliseconds. Only what the planner asks for is converted."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from pathlib import Path

from host_runtime.gpu.llama_build import LIB_PATH_ENV

# enum gguf_type (ggml/include/gguf.h)
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR = {_U8: ("u8", ctypes.c_uint8), _I8: ("i8", ctypes.c_int8), _U16: ("u16", ctypes.c_uint16),
           _I16: ("i16", ctypes.c_int16), _U32: ("u32", ctypes.c_uint32), _I32: ("i32", ctypes.c_int32),
           _F32: ("f32", ctypes.c_float), _BOOL: ("bool", ctypes.c_bool), _U64: ("u64", ctypes.c_uint64),
           _I64: ("i64", ctypes.c_int64), _F64: ("f64", ctypes.c_double)}
GGML_MAX_DIMS = 4


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


class _TensorHead(ctypes.Structure):
    """The start of struct ggml_tensor (ggml.h): type, buffer, ne[GGML_MAX_DIMS]."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * GGML_MAX_DIMS)]


@functools.lru_cache(maxsize=1)
def _lib():
    """libggml-base from llama-cpp-python's package (OSError where it is missing)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise OSError("llama_cpp is not installed")
    # The folder llama-cpp-python itself loads from (its own LLAMA_CPP_LIB_PATH rule), so that the reader is the
    # libggml-base the engine's llama.cpp uses, not a second one (the wheel's, beside the image's CUDA build).
    base = os.environ.get(LIB_PATH_ENV) or Path(list(spec.submodule_search_locations)[0]) / "lib"
    # The SONAME file (what libllama asks for) where it is a file of its own: a wheel holds libggml-base.so and
    # libggml-base.so.0 as two copies (zip has no symlinks), and opening the first beside libllama's .so.0 maps a
    # second ggml-base into the engine, with its own globals.
    lib = ctypes.CDLL(str(next((p for p in (Path(base) / "libggml-base.so.0", Path(base) / "libggml-base.so")
                                if p.exists()), Path(base) / "libggml-base.so")))
    vp, i64, cs = ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p
    sigs = {
        "gguf_init_from_file": (vp, [cs, _InitParams]), "gguf_init_from_file_ptr": (vp, [vp, _InitParams]),
        "gguf_free": (None, [vp]), "ggml_free": (None, [vp]),
        "gguf_find_key": (i64, [vp, cs]), "gguf_get_kv_type": (ctypes.c_int, [vp, i64]),
        "gguf_get_val_str": (cs, [vp, i64]), "gguf_get_arr_type": (ctypes.c_int, [vp, i64]),
        "gguf_get_arr_n": (ctypes.c_size_t, [vp, i64]), "gguf_get_arr_data": (vp, [vp, i64]),
        "gguf_get_arr_str": (cs, [vp, i64, ctypes.c_size_t]),
        "gguf_get_n_tensors": (i64, [vp]), "gguf_get_tensor_name": (cs, [vp, i64]),
        "gguf_get_tensor_type": (ctypes.c_int, [vp, i64]), "gguf_get_tensor_size": (ctypes.c_size_t, [vp, i64]),
        "ggml_get_tensor": (ctypes.POINTER(_TensorHead), [vp, cs]),
        "gguf_get_data_offset": (ctypes.c_size_t, [vp]), "gguf_get_tensor_offset": (ctypes.c_size_t, [vp, i64]),
    }
    for kind, (_, ctype) in _SCALAR.items():
        sigs[f"gguf_get_val_{_SCALAR[kind][0]}"] = (ctype, [vp, i64])
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _from_fd(lib, fd: int, params: _InitParams):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fdopen.restype, libc.fdopen.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    own = os.dup(fd)  # fclose closes the FILE's descriptor: a copy, so the caller's stays open
    os.lseek(own, 0, os.SEEK_SET)
    stream = libc.fdopen(own, b"rb")
    if not stream:
        os.close(own)
        raise OSError(ctypes.get_errno(), "fdopen failed")
    try:
        return lib.gguf_init_from_file_ptr(stream, params)
    finally:
        libc.fclose(stream)


class GGUFTable:
    """An open GGUF's metadata and tensor descriptions; close() (or `with`) frees ggml's copies."""

    def __init__(self, path=None, *, fd: int | None = None):
        """From a path, or from an open file descriptor (read from its start; the caller keeps it open): a child
        that cannot open the file itself reads what its parent opened."""
        lib = self._lib = _lib()
        self._meta = ctypes.c_void_p()
        params = _InitParams(True, ctypes.pointer(self._meta))
        if fd is None:
            self._ctx = lib.gguf_init_from_file(str(path).encode(), params)
        else:
            self._ctx = _from_fd(lib, fd, params)
        if not self._ctx:
            raise ValueError("ggml's reader refused it (not a GGUF, or damaged; llama.cpp's log says why)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        if self._ctx:
            self._lib.gguf_free(self._ctx)
            self._lib.ggml_free(self._meta)
            self._ctx = None

    def value(self, key: str):
        """A metadata value: str, a number, a bool, or a list for an array (None when absent)."""
        lib, ctx = self._lib, self._ctx
        kid = lib.gguf_find_key(ctx, key.encode())
        if kid < 0:
            return None
        kind = lib.gguf_get_kv_type(ctx, kid)
        if kind == _STR:
            return lib.gguf_get_val_str(ctx, kid).decode("utf-8", "replace")
        if kind in _SCALAR:
            return getattr(lib, f"gguf_get_val_{_SCALAR[kind][0]}")(ctx, kid)
        if kind == _ARR:
            n, item = lib.gguf_get_arr_n(ctx, kid), lib.gguf_get_arr_type(ctx, kid)
            if item == _STR:
                return [lib.gguf_get_arr_str(ctx, kid, i).decode("utf-8", "replace") for i in range(n)]
            if item not in _SCALAR:
                return None
            data = ctypes.cast(lib.gguf_get_arr_data(ctx, kid), ctypes.POINTER(_SCALAR[item][1]))
            return [data[i] for i in range(n)]
        return None

    def tensors(self) -> list[tuple[str, int, tuple[int, ...], int]]:
        """(name, ggml type, shape with ne0 first, bytes) of every tensor, in file order."""
        lib, ctx = self._lib, self._ctx
        out = []
        for i in range(lib.gguf_get_n_tensors(ctx)):
            name = lib.gguf_get_tensor_name(ctx, i)
            head = lib.ggml_get_tensor(self._meta, name)
            ne = list(head.contents.ne) if head else []
            while len(ne) > 1 and ne[-1] == 1:  # as the gguf package gives shapes: no trailing unit dimensions
                ne.pop()
            out.append((name.decode(), int(lib.gguf_get_tensor_type(ctx, i)), tuple(int(x) for x in ne),
                        int(lib.gguf_get_tensor_size(ctx, i))))
        return out

    def data_end(self) -> int:
        """Where the last tensor's bytes end in the file (a file shorter than this is cut short)."""
        lib, ctx = self._lib, self._ctx
        ends = [lib.gguf_get_tensor_offset(ctx, i) + lib.gguf_get_tensor_size(ctx, i)
                for i in range(lib.gguf_get_n_tensors(ctx))]
        return int(lib.gguf_get_data_offset(ctx)) + max(ends, default=0)


def available() -> bool:
    try:
        _lib()
    except (OSError, AttributeError):
        return False
    return True
