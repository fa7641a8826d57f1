"""Chunk encodings: choice, exact BYTEGROUP bytes, round trips and malformed payloads."""

from __future__ import annotations

import struct
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import zstandard

from ckptrepo.chunks import codecs
from ckptrepo.chunks.codecs import Encoding, decode, decode_delta, encode, encode_with_base
from ckptrepo.errors import IntegrityError, UsageError


def as_bytes(payload: bytes | memoryview) -> bytes:
    return bytes(payload)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    return t.contiguous().view(torch.uint8).numpy().data.cast("B")


def plane_table(payload: bytes) -> tuple[int, int, list[tuple[int, int]]]:
    version, width = payload[0], payload[1]
    return version, width, [struct.unpack_from("<BI", payload, 2 + 5 * k) for k in range(width)]


def test_encoding_values_are_pinned() -> None:
    assert [(e.name, int(e)) for e in Encoding] == [("RAW", 0), ("ZSTD", 1), ("BYTEGROUP", 2), ("DELTA", 3)]


# --- pinned BYTEGROUP format ----------------------------------------------------------


def test_bytegroup_exact_bytes_of_a_hand_built_payload() -> None:
    # Three-byte elements (generic width), four of them, plus a two-byte tail; every plane stored.
    raw = bytes(range(14))
    payload = (
        b"\x01\x03"  # version 1, width 3
        + b"\x00\x04\x00\x00\x00" * 3  # (stored, 4 bytes) per plane
        + bytes([0, 3, 6, 9])  # plane 0: byte 0 of each element
        + bytes([1, 4, 7, 10])
        + bytes([2, 5, 8, 11])
        + bytes([12, 13])  # tail
    )
    assert bytes(decode(Encoding.BYTEGROUP, payload, 14)) == raw
    out = bytearray(14)
    assert decode(2, payload, 14, memoryview(out)) is not None
    assert bytes(out) == raw


def test_bytegroup_exact_bytes_from_encode() -> None:
    # u16 elements whose high byte is zero: plane 0 stays as is, plane 1 becomes a zstd frame.
    low = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    raw = b"".join(bytes([b, 0]) for b in low)
    encoding, payload = encode(raw, 2)
    data = as_bytes(payload)
    assert encoding is Encoding.BYTEGROUP
    assert data[:7] == b"\x01\x02" + b"\x00" + (4096).to_bytes(4, "little")
    assert data[7] == 1
    frame_len = int.from_bytes(data[8:12], "little")
    assert data[12 : 12 + 4096] == low
    frame = data[12 + 4096 :]
    assert len(frame) == frame_len and frame[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(frame) == bytes(4096)
    assert bytes(decode(encoding, payload, len(raw))) == raw


def test_float32_normal_data_compresses_only_the_exponent_plane() -> None:
    t = torch.randn(1 << 18, generator=torch.Generator().manual_seed(0))
    raw = tensor_bytes(t)
    encoding, payload = encode(raw, 4)
    assert encoding is Encoding.BYTEGROUP
    version, width, planes = plane_table(as_bytes(payload))
    n = len(raw) // 4
    assert (version, width) == (1, 4)
    assert planes[:3] == [(0, n), (0, n), (0, n)]
    assert planes[3][0] == 1 and planes[3][1] < 0.5 * n
    assert len(payload) < 0.85 * len(raw)
    assert bytes(decode(encoding, payload, len(raw))) == bytes(raw)


@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128],
)
def test_float_dtypes_round_trip_bit_exactly(dtype: torch.dtype) -> None:
    t = (torch.randn(100_003, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    t[::97] = float("nan")
    t[1::89] = float("inf")
    raw = tensor_bytes(t)
    encoding, payload = encode(raw, t.element_size())
    assert encoding in (Encoding.BYTEGROUP, Encoding.RAW)
    out = bytearray(len(raw))
    decode(encoding, payload, len(raw), memoryview(out))
    assert out == bytes(raw)


def test_small_integers_compress_well() -> None:
    t = torch.randint(0, 1000, (50_000,), dtype=torch.int64, generator=torch.Generator().manual_seed(2))
    raw = tensor_bytes(t)
    encoding, payload = encode(raw, 8)
    assert encoding is Encoding.BYTEGROUP
    assert len(payload) < 0.25 * len(raw)
    assert bytes(decode(encoding, payload, len(raw))) == bytes(raw)


# --- choice of encoding ---------------------------------------------------------------


def test_bytes_that_compress_use_zstd() -> None:
    raw = b"abcdefgh" * 10_000
    encoding, payload = encode(raw, 1)
    assert encoding is Encoding.ZSTD
    assert len(payload) < len(raw) // 10
    assert decode(encoding, payload, len(raw)) == raw


def test_incompressible_data_is_returned_raw_without_copy() -> None:
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    for itemsize in (1, 2, 4, 8):
        encoding, payload = encode(raw, itemsize)
        assert encoding is Encoding.RAW
        assert payload is raw
    view = memoryview(raw)
    assert encode(view, 4)[1] is view


def test_min_saving_decides_raw() -> None:
    raw = tensor_bytes(torch.randn(1 << 16, generator=torch.Generator().manual_seed(4)))
    assert encode(raw, 4)[0] is Encoding.BYTEGROUP
    encoding, payload = encode(raw, 4, min_saving=0.5)
    assert encoding is Encoding.RAW and payload is raw


def test_empty_and_tiny_inputs() -> None:
    assert encode(b"", 4) == (Encoding.RAW, b"")
    assert decode(Encoding.RAW, b"", 0) == b""
    encoding, payload = encode(b"\x00\x00\x00", 4)
    assert bytes(decode(encoding, payload, 3)) == b"\x00\x00\x00"


def test_level_is_honoured() -> None:
    raw = (b"some repetitive text, " * 5000)[:65536]
    for level in (1, 3, 19):
        encoding, payload = encode(raw, 1, level=level)
        assert encoding is Encoding.ZSTD
        assert decode(encoding, payload, len(raw)) == raw


@pytest.mark.parametrize("itemsize", [0, -1, 256])
def test_bad_itemsize(itemsize: int) -> None:
    with pytest.raises(UsageError):
        encode(b"abcd", itemsize)


def test_concurrent_encoders_agree_with_serial() -> None:
    gen = torch.Generator().manual_seed(5)
    chunks = [tensor_bytes(torch.randn(1 << 16, generator=gen).to(torch.bfloat16)) for _ in range(16)]
    serial = [bytes(encode(c, 2)[1]) for c in chunks]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda c: bytes(encode(c, 2)[1]), chunks * 4))
    assert parallel == serial * 4


# --- decode contract ------------------------------------------------------------------


def test_decode_into_returns_out() -> None:
    raw = tensor_bytes(torch.arange(1000, dtype=torch.int32))
    encoding, payload = encode(raw, 4)
    out = memoryview(bytearray(len(raw)))
    assert decode(encoding, payload, len(raw), out) is out
    assert bytes(out) == bytes(raw)
    typed = np.zeros(1000, dtype=np.int32)
    decode(encoding, payload, len(raw), typed.data)
    np.testing.assert_array_equal(typed, np.arange(1000, dtype=np.int32))


def test_decode_into_wrong_size_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        decode(Encoding.RAW, b"abc", 3, memoryview(bytearray(4)))


def good_bytegroup() -> tuple[bytes, bytes]:
    raw = tensor_bytes(torch.randint(0, 50, (4000,), dtype=torch.int32, generator=torch.Generator().manual_seed(6)))
    encoding, payload = encode(raw, 4)
    assert encoding is Encoding.BYTEGROUP
    return bytes(raw), as_bytes(payload)


def test_every_truncation_of_a_bytegroup_payload_is_detected() -> None:
    raw, payload = good_bytegroup()
    for cut in list(range(0, 40)) + list(range(len(payload) - 40, len(payload))):
        with pytest.raises(IntegrityError):
            decode(Encoding.BYTEGROUP, payload[:cut], len(raw))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: b"\x02" + p[1:],  # unknown version
        lambda p: p[:1] + b"\x01" + p[2:],  # width 1
        lambda p: p[:1] + b"\x00" + p[2:],  # width 0
        lambda p: p[:2] + b"\x07" + p[3:],  # unknown plane mode
        lambda p: p + b"\x00",  # trailing garbage
    ],
)
def test_malformed_bytegroup_headers(mutate: object) -> None:
    raw, payload = good_bytegroup()
    with pytest.raises(IntegrityError):
        decode(Encoding.BYTEGROUP, mutate(payload), len(raw))  # type: ignore[operator]


def test_wrong_raw_length_is_detected() -> None:
    raw, payload = good_bytegroup()
    for wrong in (len(raw) - 4, len(raw) + 4, len(raw) + 1, 0):
        with pytest.raises(IntegrityError):
            decode(Encoding.BYTEGROUP, payload, wrong)
    zpayload = encode(b"z" * 5000, 1)[1]
    with pytest.raises(IntegrityError):
        decode(Encoding.ZSTD, zpayload, 4999)
    with pytest.raises(IntegrityError):
        decode(Encoding.RAW, b"abc", 4)


def test_broken_zstd_frames() -> None:
    zpayload = bytearray(encode(b"z" * 5000, 1)[1])
    zpayload[0] ^= 0xFF
    with pytest.raises(IntegrityError):
        decode(Encoding.ZSTD, bytes(zpayload), 5000)
    with pytest.raises(IntegrityError):
        decode(Encoding.ZSTD, b"", 5000)
    raw, payload = good_bytegroup()
    _, _, planes = plane_table(payload)
    zstd_plane = next(k for k, (mode, _) in enumerate(planes) if mode == 1)
    first_frame = 2 + 5 * 4 + sum(length for _, length in planes[:zstd_plane])
    broken = bytearray(payload)
    broken[first_frame] ^= 0xFF
    with pytest.raises(IntegrityError):
        decode(Encoding.BYTEGROUP, bytes(broken), len(raw))


def test_delta_and_unknown_encodings() -> None:
    with pytest.raises(IntegrityError, match="base"):
        decode(Encoding.DELTA, b"xx", 2)
    with pytest.raises(IntegrityError, match="9"):
        decode(9, b"xx", 2)


# --- pinned DELTA formats ------------------------------------------------------------


def test_word_delta_exact_bytes_of_a_hand_built_payload() -> None:
    # Two u16 words and a one-byte tail against a base: differences +1 and -2 zigzag to 2 and 3,
    # the tail is XOR-ed. Version 2, width 2, both planes stored.
    base = bytes([0x10, 0x00, 0x05, 0x01, 0xF0])
    raw = bytes([0x11, 0x00, 0x03, 0x01, 0x0F])
    payload = (
        b"\x02\x02"  # version 2 (word difference), width 2
        + b"\x00\x02\x00\x00\x00" * 2  # (stored, 2 bytes) per plane
        + bytes([2, 3])  # plane 0: low bytes of zigzag(+1), zigzag(-2)
        + bytes([0, 0])  # plane 1: high bytes
        + bytes([0xFF])  # tail: 0x0F XOR 0xF0
    )
    out = bytearray(5)
    decode_delta(payload, base, memoryview(out))
    assert bytes(out) == raw


def test_xor_delta_payloads_still_decode() -> None:
    # Version 1 (XOR) is what width 1 and odd widths write, and what older repositories hold.
    base = bytes([1, 2, 3, 4])
    payload = b"\x01\x02" + b"\x00\x02\x00\x00\x00" * 2 + bytes([1, 0, 2, 0])
    out = bytearray(4)
    decode_delta(payload, base, memoryview(out))
    assert bytes(out) == bytes([0, 0, 3, 4])  # planes join to XOR bytes 1, 2, 0, 0


@pytest.mark.parametrize("version", [0, 3, 255])
def test_unknown_delta_versions_are_integrity_errors(version: int) -> None:
    payload = bytes([version, 2]) + b"\x00\x02\x00\x00\x00" * 2 + bytes(4)
    with pytest.raises(IntegrityError, match="version"):
        decode_delta(payload, bytes(4), memoryview(bytearray(4)))


def test_word_delta_is_not_a_bytegroup_payload() -> None:
    with pytest.raises(IntegrityError, match="version"):
        decode(Encoding.BYTEGROUP, b"\x02\x02" + b"\x00\x02\x00\x00\x00" * 2 + bytes(4), 4)


def test_weight_decay_steps_delta_to_a_fraction_of_xor() -> None:
    # Weights no gradient touched move only by decoupled weight decay, w * (1 - lr * wd) per
    # step: a few units of the last place, which XOR turns into carries across equal bits.
    w = torch.randn(1 << 18, dtype=torch.float32) * 0.05
    decayed = w * (1 - 2e-5 * 0.01) ** 10
    raw, base = decayed.numpy().tobytes(), w.numpy().tobytes()
    encoding, payload, _ = encode_with_base(raw, 4, base)
    assert encoding is Encoding.DELTA and bytes(payload)[0] == 2
    xor_only = codecs._group(codecs.xor_bytes(raw, base).data, 4, 1, 2.0, sample_first=False)
    assert xor_only is not None and len(payload) < 0.6 * len(xor_only)
    out = bytearray(len(raw))
    decode_delta(payload, base, memoryview(out))
    assert bytes(out) == raw


# --- throughput report (printed, not asserted) ----------------------------------------


def test_encode_decode_throughput_report() -> None:
    # Encode timing drops each payload once measured, as the ingest pipeline does once a
    # chunk is in its pack; keeping 64 of them alive would time page faults instead.
    size, chunk = 64 << 20, 1 << 20
    raw = tensor_bytes(torch.randn(size // 4, generator=torch.Generator().manual_seed(7)))
    best_enc = best_dec = float("inf")
    stored = 0
    for _ in range(3):
        start = time.perf_counter()
        stored = sum(len(encode(raw[off : off + chunk], 4)[1]) for off in range(0, size, chunk))
        best_enc = min(best_enc, time.perf_counter() - start)
    encoded = [encode(raw[off : off + chunk], 4) for off in range(0, size, chunk)]
    out = memoryview(bytearray(chunk))
    for _ in range(3):
        start = time.perf_counter()
        for encoding, payload in encoded:
            decode(encoding, payload, chunk, out)
        best_dec = min(best_dec, time.perf_counter() - start)
    print(
        f"\ncodec throughput, 64 MiB randn fp32 in 1 MiB chunks, one thread: "
        f"encode {size / best_enc / 1e9:.2f} GB/s, decode {size / best_dec / 1e9:.2f} GB/s, "
        f"stored/raw {stored / size:.3f}"
    )
    assert bytes(out) == bytes(raw[size - chunk :])
