#!/usr/bin/python3
"""A real gRPC server (Debian's python3-grpcio) for the gRPC integration tests.

No .proto: generic handlers take and give raw message bytes. Every execution of a method is
counted (per method and idempotency key), so a test can prove that a call took effect once.

Usage: upstream.py PORT COUNTS_FILE
  PORT 0 picks a free port. The bound port is the first line on stdout.
  COUNTS_FILE is rewritten (atomically) after every execution, one line per counter:
  "<method> <idempotency-key or -> <executions>".

Methods (all honour the request metadata below):
  test.Payments/Charge  unary: answers b"charged:<request>:<n>" where n is the method's
                        execution number, initial metadata x-upstream: payments, trailing
                        metadata x-execution: <n>, x-trace-bin: bytes 00 01 fe ff <n>, and
                        grpc-status-details-bin (a google.rpc.Status with the code and message).
  test.Payments/Fail    the same as Charge (for the tests that choose a status).
  test.Payments/Slow    the same as Charge after sleeping x-sleep-ms (default 1000) ms.
  test.Payments/Watch   server streaming: x-messages (default 3) messages b"watch:<request>:<i>".
  test.Admin/Count      unary: the request is "<method> <key>", the answer that counter in ASCII.
Metadata:
  x-want-status  comma-separated status names (or numbers); the k-th execution for this method
                 and key answers the k-th one (the last one repeats). Default OK.
  x-sleep-ms     sleep before answering (every method).
"""

import os
import sys
import threading
import time
from concurrent import futures

import grpc

_lock = threading.Lock()
_counts = {}  # (method, key) -> executions
_method_counts = {}  # method -> executions
_counts_file = None


def _write_counts():
    tmp = _counts_file + ".tmp"
    with open(tmp, "w") as f:
        for (method, key), n in sorted(_counts.items()):
            f.write("%s %s %d\n" % (method, key, n))
    os.replace(tmp, _counts_file)


def _metadata(context):
    return {k: v for k, v in context.invocation_metadata()}


def _count(method, key):
    """Counts one execution; returns (the method's execution number, the key's)."""
    with _lock:
        _counts[(method, key)] = _counts.get((method, key), 0) + 1
        _method_counts[method] = _method_counts.get(method, 0) + 1
        _write_counts()
        return _method_counts[method], _counts[(method, key)]


def _status(name):
    name = name.strip()
    if name.isdigit():
        for code in grpc.StatusCode:
            if code.value[0] == int(name):
                return code
    return grpc.StatusCode[name.upper()]


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _status_details(code, message):
    """A serialized google.rpc.Status {code, message}, written by hand (no protobuf needed)."""
    msg = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(msg)) + msg


def _start(method, context, default_sleep_ms=0):
    """Counts the execution (first: a test can wait for it), then sleeps as asked."""
    md = _metadata(context)
    key = md.get("idempotency-key", "-")
    n, nth = _count(method, key)
    time.sleep(int(md.get("x-sleep-ms", default_sleep_ms)) / 1000.0)
    wanted = md.get("x-want-status", "OK").split(",")
    return md, n, _status(wanted[min(nth, len(wanted)) - 1])


def _unary(method, default_sleep_ms=0):
    def handle(request, context):
        md, n, code = _start(method, context, default_sleep_ms)
        context.send_initial_metadata((("x-upstream", "payments"),))
        message = "%s %s #%d" % (code.name, method, n)
        context.set_trailing_metadata(
            (
                ("x-execution", str(n)),
                ("x-trace-bin", bytes([0, 1, 0xFE, 0xFF, n & 0xFF])),
                ("grpc-status-details-bin", _status_details(code.value[0], message)),
            )
        )
        if code != grpc.StatusCode.OK:
            context.abort(code, message)
        return b"charged:" + request + b":" + str(n).encode()

    return grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=None, response_serializer=None
    )


def _watch(request, context):
    md, n, code = _start("test.Payments/Watch", context)
    context.send_initial_metadata((("x-upstream", "payments"),))
    context.set_trailing_metadata((("x-execution", str(n)),))
    for i in range(int(md.get("x-messages", "3"))):
        yield b"watch:" + request + b":" + str(i + 1).encode()
    if code != grpc.StatusCode.OK:
        context.abort(code, "%s after the messages" % code.name)


def _admin_count(request, context):
    method, _, key = request.decode().partition(" ")
    with _lock:
        return str(_counts.get((method, key), 0)).encode()


def main():
    global _counts_file
    port = int(sys.argv[1])
    _counts_file = sys.argv[2]
    with _lock:
        _write_counts()
    payments = grpc.method_handlers_generic_handler(
        "test.Payments",
        {
            "Charge": _unary("test.Payments/Charge"),
            "Fail": _unary("test.Payments/Fail"),
            "Slow": _unary("test.Payments/Slow", default_sleep_ms=1000),
            "Watch": grpc.unary_stream_rpc_method_handler(_watch),
        },
    )
    admin = grpc.method_handlers_generic_handler(
        "test.Admin", {"Count": grpc.unary_unary_rpc_method_handler(_admin_count)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    server.add_generic_rpc_handlers((payments, admin))
    bound = server.add_insecure_port("127.0.0.1:%d" % port)
    server.start()
    print(bound, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
