"""Produces records whose header names are arbitrary bytes, as Go and Java clients can.

confluent-kafka takes header names as ``str`` and encodes them as UTF-8, so it cannot send a
name that is not valid UTF-8. librdkafka itself takes any bytes: this calls the copy that
confluent-kafka bundles through ctypes (``rd_kafka_produceva``), the way a C producer would.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import confluent_kafka

__all__ = ["produce_raw_headers"]

# rd_kafka_vtype_t
_END, _TOPIC, _VALUE, _KEY, _HEADER, _PARTITION = 0, 1, 4, 5, 9, 3


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Header(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("val", ctypes.c_void_p), ("size", ctypes.c_ssize_t)]


class _U(ctypes.Union):
    _fields_ = [
        ("cstr", ctypes.c_char_p),
        ("i32", ctypes.c_int32),
        ("mem", _Mem),
        ("header", _Header),
        ("_pad", ctypes.c_char * 64),
    ]


class _VU(ctypes.Structure):
    _fields_ = [("vtype", ctypes.c_int), ("u", _U)]


def _lib() -> ctypes.CDLL:
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    [path] = sorted(libs.glob("librdkafka*.so*"))
    lib = ctypes.CDLL(str(path))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.POINTER(_VU), ctypes.c_size_t]
    lib.rd_kafka_error_string.restype = ctypes.c_char_p
    lib.rd_kafka_error_string.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_error_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_outq_len.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    return lib


def produce_raw_headers(
    bootstrap: str,
    topic: str,
    partition: int,
    key: bytes,
    value: bytes,
    headers: Sequence[tuple[bytes, bytes]],
) -> None:
    """Writes one record and waits until the broker has it.

    Raises:
        RuntimeError: The client could not be made, refused the record, or did not deliver it.
    """
    lib = _lib()
    err = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    for setting, text in (("bootstrap.servers", bootstrap), ("acks", "all")):
        if lib.rd_kafka_conf_set(conf, setting.encode(), text.encode(), err, len(err)) != 0:
            raise RuntimeError(err.value.decode())
    rk = lib.rd_kafka_new(0, conf, err, len(err))  # RD_KAFKA_PRODUCER
    if not rk:
        raise RuntimeError(err.value.decode())
    try:
        keep: list[object] = []  # buffers must outlive the call
        vus = [
            _VU(vtype=_TOPIC, u=_U(cstr=topic.encode())),
            _VU(vtype=_PARTITION, u=_U(i32=partition)),
        ]
        for data, vtype in ((key, _KEY), (value, _VALUE)):
            buf = ctypes.create_string_buffer(data, len(data))
            keep.append(buf)
            mem = _Mem(ctypes.cast(buf, ctypes.c_void_p), len(data))
            vus.append(_VU(vtype=vtype, u=_U(mem=mem)))
        for name, val in headers:
            nbuf = ctypes.create_string_buffer(name)  # NUL-terminated, as the API reads it
            vbuf = ctypes.create_string_buffer(val, len(val))
            keep += [nbuf, vbuf]
            head = _Header(
                ctypes.cast(nbuf, ctypes.c_char_p), ctypes.cast(vbuf, ctypes.c_void_p), len(val)
            )
            vus.append(_VU(vtype=_HEADER, u=_U(header=head)))
        array = (_VU * len(vus))(*vus)
        error = lib.rd_kafka_produceva(rk, array, len(vus))
        if error:
            text = lib.rd_kafka_error_string(error).decode()
            lib.rd_kafka_error_destroy(error)
            raise RuntimeError(f"produce refused: {text}")
        lib.rd_kafka_flush(rk, 30_000)
        if lib.rd_kafka_outq_len(rk) != 0:
            raise RuntimeError("record not delivered within 30 s")
    finally:
        lib.rd_kafka_destroy(rk)
