"""pbwire — just enough of the protobuf wire format to speak proto/specd.proto
from the integration tests, written independently of the C side (so a
mistake in net/ cannot hide behind the same mistake here).

encode(schema, dict) -> bytes and decode(schema, bytes) -> dict, where a
schema maps field names to (tag, kind) with kind one of the scalar kinds
below, ("msg", SCHEMA), ("rep", kind) for repeated fields (numeric ones
packed, as proto3 writes them), or "bytes"/"string". Unknown tags are
skipped on decode; a truncated or malformed buffer raises ValueError.
Rejected: the `protobuf` package (needs protoc-generated Python or a
descriptor built by hand; the wire format is smaller than either).
"""
import struct

VARINT_KINDS = {"uint32", "uint64", "int32", "int64", "bool", "enum"}


def _varint(v):
    if v < 0:
        v += 1 << 64  # int32/int64 negatives are 10-byte two's complement
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(tag, wire):
    return _varint((tag << 3) | wire)


def _scalar(kind, v):
    """(wire type, payload bytes) of one scalar."""
    if kind in VARINT_KINDS:
        return 0, _varint(int(v))
    if kind == "float":
        return 5, struct.pack("<f", v)
    if kind == "double":
        return 1, struct.pack("<d", v)
    if kind == "fixed64":
        return 1, struct.pack("<Q", v)
    if kind == "string":
        return 2, _varint(len(v.encode())) + v.encode()
    if kind == "bytes":
        return 2, _varint(len(v)) + bytes(v)
    raise ValueError("unknown kind %r" % (kind,))


def encode(schema, msg):
    out = bytearray()
    for name, value in msg.items():
        tag, kind = schema[name]
        if isinstance(kind, tuple) and kind[0] == "msg":
            body = encode(kind[1], value)
            out += _key(tag, 2) + _varint(len(body)) + body
        elif isinstance(kind, tuple) and kind[0] == "rep":
            inner = kind[1]
            if isinstance(inner, tuple):  # repeated message
                for v in value:
                    body = encode(inner[1], v)
                    out += _key(tag, 2) + _varint(len(body)) + body
            elif inner in ("string", "bytes"):
                for v in value:
                    w, p = _scalar(inner, v)
                    out += _key(tag, w) + p
            else:  # packed numbers
                body = b"".join(_scalar(inner, v)[1] for v in value)
                out += _key(tag, 2) + _varint(len(body)) + body
        else:
            w, p = _scalar(kind, value)
            out += _key(tag, w) + p
    return bytes(out)


def _read_varint(buf, i):
    shift = v = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _signed(v, bits):
    v &= (1 << 64) - 1
    if v >> 63:
        v -= 1 << 64
    return v if bits == 64 else max(min(v, (1 << 31) - 1), -(1 << 31))


def _from_raw(kind, wire, raw):
    if kind in ("uint32", "uint64", "enum"):
        return raw
    if kind in ("int32", "int64"):
        return _signed(raw, 32 if kind == "int32" else 64)
    if kind == "bool":
        return bool(raw)
    if kind == "float":
        return struct.unpack("<f", raw)[0]
    if kind == "double":
        return struct.unpack("<d", raw)[0]
    if kind == "fixed64":
        return struct.unpack("<Q", raw)[0]
    if kind == "string":
        return raw.decode("utf-8", errors="replace")
    if kind == "bytes":
        return bytes(raw)
    raise ValueError("unknown kind %r" % (kind,))


def _unpack_packed(kind, data):
    vals, i = [], 0
    while i < len(data):
        if kind in VARINT_KINDS:
            raw, i = _read_varint(data, i)
        elif kind == "float":
            raw, i = data[i:i + 4], i + 4
        elif kind in ("double", "fixed64"):
            raw, i = data[i:i + 8], i + 8
        else:
            raise ValueError("cannot pack %s" % kind)
        vals.append(_from_raw(kind, None, raw))
    return vals


def decode(schema, buf):
    by_tag = {tag: (name, kind) for name, (tag, kind) in schema.items()}
    out = {}
    i = 0
    buf = bytes(buf)
    while i < len(buf):
        key, i = _read_varint(buf, i)
        tag, wire = key >> 3, key & 7
        if wire == 0:
            raw, i = _read_varint(buf, i)
        elif wire == 1:
            raw, i = buf[i:i + 8], i + 8
        elif wire == 5:
            raw, i = buf[i:i + 4], i + 4
        elif wire == 2:
            n, i = _read_varint(buf, i)
            raw, i = buf[i:i + n], i + n
        else:
            raise ValueError("wire type %d" % wire)
        if i > len(buf):
            raise ValueError("truncated field %d" % tag)
        if tag not in by_tag:
            continue
        name, kind = by_tag[tag]
        if isinstance(kind, tuple) and kind[0] == "msg":
            out[name] = decode(kind[1], raw)
        elif isinstance(kind, tuple) and kind[0] == "rep":
            inner = kind[1]
            lst = out.setdefault(name, [])
            if isinstance(inner, tuple):
                lst.append(decode(inner[1], raw))
            elif inner in ("string", "bytes"):
                lst.append(_from_raw(inner, wire, raw))
            elif wire == 2:
                lst.extend(_unpack_packed(inner, raw))
            else:
                lst.append(_from_raw(inner, wire, raw))
        else:
            out[name] = _from_raw(kind, wire, raw)
    return out


# ---- proto/specd.proto, the client link (tags must match the .proto) ----

SAMPLING = {"temperature": (1, "float"), "top_k": (2, "uint32"), "top_p": (3, "float"),
            "min_p": (4, "float"), "seed": (5, "uint64"), "presence_penalty": (6, "float"),
            "frequency_penalty": (7, "float"), "rule": (8, "enum")}
VERIFY_RULE_COUPLED, VERIFY_RULE_REJECTION = 1, 2
WORKER_STATS = {"kv_blocks_total": (1, "uint32"), "kv_blocks_free": (2, "uint32"),
                "n_sequences": (3, "uint32"), "steps": (4, "uint64"), "prefix_query_tokens": (5, "uint64"),
                "prefix_hit_tokens": (6, "uint64"), "prefix_blocks_cached": (7, "uint32"),
                "prefix_blocks_evicted": (8, "uint64")}
HEARTBEAT = {"sent_us": (1, "uint64"), "stats": (2, ("msg", WORKER_STATS))}
HELLO = {"protocol_version": (1, "uint32"), "role": (2, "enum"), "rank": (3, "uint32"),
         "group_size": (4, "uint32"), "name": (6, "string")}
CHAT_MESSAGE = {"role": (1, "enum"), "content": (2, "string"), "tool_calls": (3, "string"),
                "tool_call_id": (4, "string")}
CONSTRAINT = {"kind": (1, "enum"), "text": (2, "string")}  # kind: ConstraintKind (NONE 0 .. GRAMMAR 4)
SUBMIT = {"client_tag": (1, "uint64"), "prompt": (2, "string"), "prompt_ids": (3, ("rep", "int32")),
          "chat": (4, "bool"), "system": (5, "string"), "max_tokens": (6, "uint32"),
          "sampling": (7, ("msg", SAMPLING)), "stop": (8, ("rep", "string")), "ignore_eos": (9, "bool"),
          "max_k": (10, "int32"), "messages": (11, ("rep", ("msg", CHAT_MESSAGE))), "drafter_kind": (13, "enum"),
          "logprobs": (14, "bool"), "top_logprobs": (15, "uint32"), "prompt_logprobs": (16, "bool"),
          "echo": (17, "bool"), "prompt_only": (18, "bool"), "parse_special": (19, "bool"),
          "constraint": (20, ("msg", CONSTRAINT)), "tools": (21, "string")}
CANCEL = {"request_id": (1, "uint64")}
STATS_QUERY = {"include_workers": (1, "bool")}
CLIENT_TO_COORD = {"hello": (1, ("msg", HELLO)), "submit": (2, ("msg", SUBMIT)), "cancel": (3, ("msg", CANCEL)),
                   "stats": (4, ("msg", STATS_QUERY)), "heartbeat": (5, ("msg", HEARTBEAT))}

ERROR = {"code": (1, "enum"), "message": (2, "string"), "request_id": (3, "uint64"), "client_tag": (4, "uint64")}
ACCEPTED = {"client_tag": (1, "uint64"), "request_id": (2, "uint64"), "prompt_tokens": (3, "uint32"),
            "prompt_text": (4, "bytes")}
TOKEN_LOGPROB = {"logprob": (1, "float"), "top_ids": (2, ("rep", "int32")), "top_logprobs": (3, ("rep", "float")),
                 "token": (4, "bytes"), "top_tokens": (5, ("rep", "bytes"))}
PROMPT_LOGPROBS = {"request_id": (1, "uint64"), "from": (2, "uint32"), "tokens": (3, ("rep", "int32")),
                   "logprobs": (4, ("rep", ("msg", TOKEN_LOGPROB)))}
TOKEN_CHUNK = {"request_id": (1, "uint64"), "tokens": (2, ("rep", "int32")), "text": (3, "bytes"),
               "n_generated": (4, "uint32")}
REQUEST_STATS = {"prompt_tokens": (1, "uint32"), "generated_tokens": (2, "uint32"), "drafted": (3, "uint32"),
                 "accepted": (4, "uint32"), "target_steps": (5, "uint32"), "queued_ms": (6, "double"),
                 "drafting_ms": (7, "double"), "verifying_ms": (8, "double"), "first_token_ms": (9, "double"),
                 "total_ms": (10, "double"), "drafter_kind": (11, "enum"), "drafter_switches": (12, "uint32")}
FINISHED = {"request_id": (1, "uint64"), "reason": (2, "enum"), "stats": (3, ("msg", REQUEST_STATS)),
            "text_tail": (4, "bytes")}
WORKER_INFO = {"role": (1, "enum"), "rank": (2, "uint32"), "name": (3, "string"), "drafter_kind": (4, "enum"),
               "alive": (5, "bool"), "stats": (6, ("msg", WORKER_STATS)), "group_id": (7, "uint32"),
               "group_size": (8, "uint32"), "active_requests": (9, "uint32"), "served_requests": (10, "uint64"),
               "drafted": (11, "uint64"), "accepted": (12, "uint64"), "committed": (13, "uint64"),
               "step_us": (14, "double"), "worker_id": (15, "uint64")}
SERVICE_STATS = {"active_requests": (1, "uint32"), "queued_requests": (2, "uint32"),
                 "finished_requests": (3, "uint64"), "committed_tokens": (4, "uint64"),
                 "workers": (5, ("rep", ("msg", WORKER_INFO))), "step_overhead_p50_us": (6, "double"),
                 "step_overhead_p99_us": (7, "double"), "draft_wait_mean_us": (8, "double"),
                 "draft_wait_p99_us": (9, "double"), "draft_wait_share": (10, "double"),
                 "verify_fixed_us": (11, "double"), "verify_token_us": (12, "double"),
                 "draft_token_us": (13, "double"), "draft_step_us": (14, "double"),
                 "seq_verify_steps": (15, "uint64"), "drafts": (16, "uint64"), "draft_tokens": (17, "uint64"),
                 "accepted_tokens": (18, "uint64"), "draft_tokens_per_pos": (19, ("rep", "uint64")),
                 "accepted_tokens_per_pos": (20, ("rep", "uint64")), "verify_batches": (21, "uint64"),
                 "catchup_row_us": (22, "double")}
COORD_TO_CLIENT = {"accepted": (1, ("msg", ACCEPTED)), "tokens": (2, ("msg", TOKEN_CHUNK)),
                   "finished": (3, ("msg", FINISHED)), "error": (4, ("msg", ERROR)),
                   "stats": (5, ("msg", SERVICE_STATS)), "heartbeat": (6, ("msg", HEARTBEAT)),
                   "prompt_logprobs": (7, ("msg", PROMPT_LOGPROBS))}

# enum values
ROLE_DRAFTER, ROLE_VERIFIER = 2, 3
DRAFTER_KIND_MODEL, DRAFTER_KIND_NGRAM, DRAFTER_KIND_SELF, DRAFTER_KIND_EAGLE = 1, 2, 3, 4
CODE = {1: "OK", 2: "BAD_REQUEST", 3: "MALFORMED", 4: "TOO_LARGE", 5: "UNKNOWN_REQUEST", 6: "CACHE_MISS",
        7: "OVERLOADED", 8: "KV_FULL", 9: "VOCAB_MISMATCH", 10: "PROTOCOL", 11: "UNAVAILABLE", 12: "CANCELLED",
        13: "INTERNAL", 14: "REFUSED"}
STOP_REASON = {1: "EOS", 2: "LENGTH", 3: "STOP_STRING", 4: "CONTEXT", 5: "CANCELLED"}


def _selftest():
    m = {"submit": {"client_tag": 7, "prompt": "hi", "prompt_ids": [1, 300, 0], "max_k": -1,
                    "sampling": {"temperature": 0.5, "seed": 2 ** 40}, "stop": ["a", "bc"]}}
    b = encode(CLIENT_TO_COORD, m)
    back = decode(CLIENT_TO_COORD, b)
    assert back["submit"]["prompt_ids"] == [1, 300, 0], back
    assert back["submit"]["max_k"] == -1, back
    assert back["submit"]["stop"] == ["a", "bc"], back
    assert abs(back["submit"]["sampling"]["temperature"] - 0.5) < 1e-7
    assert back["submit"]["sampling"]["seed"] == 2 ** 40


_selftest()
