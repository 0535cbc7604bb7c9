#!/usr/bin/python3
"""A real gRPC client (Debian's python3-grpcio) for the gRPC integration tests.

Usage: client.py TARGET METHOD [options]
  TARGET   host:port (plaintext, HTTP/2 prior knowledge)
  METHOD   /package.Service/Method
Options:
  --text T          the request message bytes as text (default: empty)
  --hex H           the request message bytes in hex
  -m NAME=VALUE     request metadata (repeatable); for NAME ending in -bin, VALUE is hex
  --timeout S       deadline in seconds (sent as grpc-timeout); default 10
  --stream          server-streaming call (one request, any number of answers)
  --concurrent N    N identical calls at once (threads); the output is {"calls": [...]}
  --retry           gRPC's retry policy on (docs/grpc.md's client): up to 4 attempts on
                    UNAVAILABLE and ABORTED, honouring grpc-retry-pushback-ms; off by default

Prints ONE JSON line per run:
  {"code": "OK", "details": "...", "initial": [[name, value], ...], "trailing": [...],
   "messages": ["<hex>", ...]}
Metadata values of -bin entries are in hex, the others as text. Exit status 0 whenever the call
ended (whatever its status); 2 on a usage error.
"""

import argparse
import json
import sys
import threading

import grpc


def _identity(b):
    return b


def _metadata_out(md):
    out = []
    for k, v in md or ():
        out.append([k, v.hex() if isinstance(v, bytes) else v])
    return out


def _call(channel, args, request, metadata):
    result = {"code": "OK", "details": "", "initial": [], "trailing": [], "messages": []}
    if args.stream:
        call = channel.unary_stream(
            args.method, request_serializer=_identity, response_deserializer=_identity
        )(request, metadata=metadata, timeout=args.timeout)
        try:
            for message in call:
                result["messages"].append(message.hex())
        except grpc.RpcError:
            pass  # the status is read below
    else:
        fn = channel.unary_unary(
            args.method, request_serializer=_identity, response_deserializer=_identity
        )
        try:
            response, call = fn.with_call(request, metadata=metadata, timeout=args.timeout)
            result["messages"].append(response.hex())
        except grpc.RpcError as e:
            call = e
    result["code"] = call.code().name
    result["details"] = call.details() or ""
    result["initial"] = _metadata_out(call.initial_metadata())
    result["trailing"] = _metadata_out(call.trailing_metadata())
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("target")
    p.add_argument("method")
    p.add_argument("--text")
    p.add_argument("--hex")
    p.add_argument("-m", action="append", default=[])
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--concurrent", type=int, default=0)
    p.add_argument("--retry", action="store_true")
    args = p.parse_args()

    request = bytes.fromhex(args.hex) if args.hex is not None else (args.text or "").encode()
    metadata = []
    for item in args.m:
        name, sep, value = item.partition("=")
        if not sep:
            p.error("metadata %r is not NAME=VALUE" % item)
        metadata.append((name, bytes.fromhex(value) if name.endswith("-bin") else value))

    # No proxy from the environment; no retries unless asked: exactly the calls asked for reach
    # the target.
    options = [("grpc.enable_http_proxy", 0)]
    if args.retry:
        service = args.method.strip("/").split("/")[0]
        policy = {
            "maxAttempts": 4,
            "initialBackoff": "0.2s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"],
        }
        config = {"methodConfig": [{"name": [{"service": service}], "retryPolicy": policy}]}
        options += [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
    else:
        options.append(("grpc.enable_retries", 0))
    with grpc.insecure_channel(args.target, options=options) as channel:
        if args.concurrent > 0:
            results = [None] * args.concurrent
            start = threading.Barrier(args.concurrent)

            def run(i):
                start.wait()
                results[i] = _call(channel, args, request, metadata)

            threads = [threading.Thread(target=run, args=(i,)) for i in range(args.concurrent)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out = {"calls": results}
        else:
            out = _call(channel, args, request, metadata)
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
