#!/usr/bin/python3
"""One unary gRPC call with python3-grpcio (bench/run.sh's check that a gRPC row's target answers
real gRPC before it is loaded: h2load sees HTTP statuses only, not grpc-status).

  grpc_check.py HOST:PORT /package.Service/Method MESSAGE_BYTES [IDEMPOTENCY_KEY]

Sends one message of MESSAGE_BYTES bytes (the bytes h2load and onceproxy_grpc_load send) with
a 5 s deadline. Prints "<status code name> <idempotency-status metadata or -> <answer bytes>"
and exits 0 when the status is OK, else prints the status and its details and exits 1.
"""
import sys

import grpc


def main() -> int:
    target, method, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    metadata = [("idempotency-key", sys.argv[4])] if len(sys.argv) > 4 else []
    message = bytes(ord("a") + i % 26 for i in range(size))
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            answer, info = call.with_call(message, timeout=5, metadata=metadata)
        except grpc.RpcError as e:
            print(f"{e.code().name} {e.details()!r} "
                  f"{dict(e.initial_metadata() or ())} {dict(e.trailing_metadata() or ())}")
            return 1
        status = dict(info.initial_metadata()).get("idempotency-status", "-")
        print(f"{info.code().name} {status} {len(answer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
