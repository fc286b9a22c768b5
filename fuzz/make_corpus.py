#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

The seeds are small valid conversations (and a few classic malformed ones) so that the
fuzzers start from inputs that already reach deep into the parsers. Layouts follow
launcher/store_protocol.h and transport/tcp/frame.h (host byte order = little-endian here).
Run it again after a wire format change; the output is deterministic.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = b"fuzz-token"


def frame(tag, body=b""):
    return struct.pack("<I", 1 + len(body)) + bytes([tag]) + body


def s(b):
    return struct.pack("<I", len(b)) + b


HELLO, SET, GET, ADD, WAIT, REMOVE = 1, 2, 3, 4, 5, 6
OK, TIMEOUT, ERROR = 0, 1, 2

requests = {
    "hello": frame(HELLO, s(TOKEN)),
    "set": frame(SET, s(b"key") + s(b"value")),
    "get": frame(GET, s(b"key") + struct.pack("<I", 100)),
    "get_now": frame(GET, s(b"missing") + struct.pack("<I", 0)),
    "add": frame(ADD, s(b"counter") + struct.pack("<q", 5)),
    "add_overflow": frame(ADD, s(b"counter") + struct.pack("<q", 2**63 - 1)),
    "wait": frame(WAIT, struct.pack("<I", 2) + s(b"key") + s(b"counter") + struct.pack("<I", 50)),
    "remove": frame(REMOVE, s(b"key")),
}
responses = {
    "ok": frame(OK),
    "ok_value": frame(OK, s(b"value")),
    "ok_sum": frame(OK, struct.pack("<q", 42)),
    "ok_existed": frame(OK, b"\x01"),
    "timeout": frame(TIMEOUT, s(b"key 'x' not set within 5 ms")),
    "error": frame(ERROR, b"\x01" + s(b"store add: not an integer")),
}
malformed = {
    "huge_length": struct.pack("<I", 0xFFFFFFF0) + bytes([SET]),
    "zero_length": struct.pack("<I", 0),
    "truncated_set": frame(SET, s(b"key") + struct.pack("<I", 1000) + b"abc"),
    "wait_count": frame(WAIT, struct.pack("<I", 0x7FFFFFFF)),
    "trailing": frame(GET, s(b"k") + struct.pack("<I", 1) + b"xx"),
}


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# store_protocol_fuzz: a connection's byte stream (HELLO first), or single frames.
conversation = requests["hello"] + b"".join(v for k, v in requests.items() if k != "hello")
write("store_protocol_fuzz", "conversation", conversation)
for k, v in {**requests, **responses, **malformed}.items():
    write("store_protocol_fuzz", k, v)

# store_server_fuzz: byte 0 != 0 (mod 8) makes the harness send the HELLO itself.
write("store_server_fuzz", "conversation", b"\x01" + b"".join(
    v for k, v in requests.items() if k not in ("hello", "get", "wait")))
write("store_server_fuzz", "own_hello", b"\x00" + requests["hello"] + requests["set"])
write("store_server_fuzz", "wrong_token", b"\x00" + frame(HELLO, s(b"wrong")))
write("store_server_fuzz", "no_hello", b"\x00" + requests["set"])
for k in ("get", "wait", "add_overflow", "remove"):
    write("store_server_fuzz", k, b"\x01" + requests["set"] + requests[k])
for k, v in malformed.items():
    write("store_server_fuzz", k, b"\x01" + v)

# frame_fuzz: byte 0 = this rank's view (0x03: rank 0 of 4), a hello, then frame headers.
FRAME_MAGIC, HELLO_MAGIC, VERSION = 0x52534652, 0x5253484C, 2


def hello(rank=1, world=4, token=TOKEN, channel=0, channels=1, flags=0, magic=HELLO_MAGIC,
          version=VERSION, token_bytes=None):
    n = len(token) if token_bytes is None else token_bytes
    return struct.pack("<IHHIIHHHH", magic, version, n, rank, world, channel, channels, flags,
                       0) + token


def header(kind, payload=0, message=0, offset=0, total=0, error_kind=0, magic=FRAME_MAGIC):
    tag = struct.pack("<QQIBBBBII", 7, 16, 0, 1, 2, 3, 0, 0, 0)
    return struct.pack("<IBBHQQQQ", magic, kind, error_kind, 0, payload, message, offset,
                       total) + tag


assert len(hello()) == 24 + len(TOKEN) and len(header(1)) == 72
all_kinds = (header(1, 64, 0, 0, 64) + header(1, 32, 1, 32, 64) + header(2, 20, error_kind=3)
             + header(3, message=2) + header(4, offset=128) + header(5, message=0)
             + header(6))
write("frame_fuzz", "session", b"\x03" + hello() + all_kinds)
write("frame_fuzz", "hello_rank3", b"\x03" + hello(rank=3))
write("frame_fuzz", "hello_rails", b"\x03" + hello(channel=3, channels=4))
write("frame_fuzz", "hello_wrong_token", b"\x03" + hello(token=b"nope"))
write("frame_fuzz", "hello_huge_token", b"\x03" + hello(token=b"", token_bytes=65535))
write("frame_fuzz", "hello_bad_magic", b"\x03" + hello(magic=0x11223344))
write("frame_fuzz", "hello_rejoin", b"\x03" + hello(flags=1))
write("frame_fuzz", "data_out_of_range", b"\x03" + hello() + header(1, 2**63, 0, 2**63, 2**63))
write("frame_fuzz", "abort_huge", b"\x03" + hello() + header(2, 2**40, error_kind=9))
write("frame_fuzz", "truncated", b"\x03" + hello() + header(1, 8, 0, 0, 8)[:40])

# message_book_fuzz: byte 0 the kind of links (bit 0: whole pieces), then 6-byte operations:
# kind (0 post, 1 piece, 2 duplicates allowed, 3 queries), message, step, size, offset, length.
def post(step, size):
    return bytes([0, 0, step, size, 0, 0])


def piece(message, step, size, offset, length):
    return bytes([1, message, step, size, offset, length])


# Receive first, then its two pieces; a staged message, then its receive; a re-sent piece.
in_order = post(0, 40) + piece(0, 0, 40, 0, 24) + piece(0, 0, 40, 24, 16)
early = piece(0, 1, 30, 10, 20) + post(1, 30) + piece(0, 1, 30, 0, 10)
resent = in_order + bytes([2, 0, 0, 0, 0, 0]) + piece(0, 0, 40, 24, 16)
write("message_book_fuzz", "stream_in_order", b"\x00" + in_order)
write("message_book_fuzz", "stream_early", b"\x00" + early + bytes([3, 0, 0, 0, 0, 0]))
write("message_book_fuzz", "whole_resent", b"\x01" + resent)
write("message_book_fuzz", "mismatches", b"\x01" + post(0, 8) + piece(0, 1, 8, 0, 8)
      + piece(0, 0, 9, 0, 8) + piece(3, 0, 255, 0, 1) + piece(0, 0, 8, 6, 4))
