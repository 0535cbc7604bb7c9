#!/usr/bin/env python3
"""Raw HTTP/2 frames against onceproxy's plain listener (h2c, prior knowledge), for
tests/integration/http2_test.cpp. Each scenario prints what the client observed, one fact a line
("goaway 0xb", "status 431", "rst 1 0x8", ...); the C++ test asserts on those lines. Frames are
built with hyperframe and hpack (python3-h2's dependencies) so the hostile ones can be sent as
they are; every read is bounded in time.

usage: probe.py SCENARIO PORT [ARGS...]
"""

import json
import socket
import struct
import sys
import time
import urllib.request

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ERRORS = {0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x7: "REFUSED_STREAM", 0x8: "CANCEL",
          0xB: "ENHANCE_YOUR_CALM"}


def say(*words):
    print(*words, flush=True)


class Conn:
    """A client connection: the preface and our SETTINGS, then raw frames both ways."""

    def __init__(self, port, settings=None, window=None, ack=True):
        self.ack = ack  # acknowledge the server's SETTINGS (else they stay pending)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.buf = b""
        self.remote_settings = {}
        s = SettingsFrame(0)
        s.settings = settings or {}
        out = PREFACE + s.serialize()
        if window:
            out += WindowUpdateFrame(0, window_increment=window).serialize()
        self.sock.sendall(out)

    def send(self, data):
        """False when the server has closed (or reset) the connection."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def block(self, path, method="GET", extra=()):
        fields = [(":method", method), (":scheme", "http"), (":authority", "127.0.0.1"),
                  (":path", path)]
        return self.enc.encode(fields + list(extra))

    def request(self, stream, path, method="GET", extra=(), end_stream=True):
        f = HeadersFrame(stream)
        f.data = self.block(path, method, extra)
        f.flags.add("END_HEADERS")
        if end_stream:
            f.flags.add("END_STREAM")
        return f.serialize()

    def read_frame(self, deadline):
        """The next frame, or None on close or deadline. SETTINGS are recorded (and
        acknowledged unless told not to); every header block is decoded into `fields`, so the
        HPACK table stays in step."""
        while True:
            if len(self.buf) >= 9:
                f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) >= 9 + length:
                    f.parse_body(memoryview(self.buf[9:9 + length]))
                    self.buf = self.buf[9 + length:]
                    if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                        self.remote_settings.update(f.settings)
                        if self.ack:
                            ack = SettingsFrame(0)
                            ack.flags.add("ACK")
                            self.send(ack.serialize())
                    if isinstance(f, HeadersFrame):
                        f.fields = dict(self.dec.decode(f.data))
                    return f
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return None
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk

    def ping(self):
        """Prints "pong" when the connection still answers a PING (bounded: 5 s)."""
        self.send(PingFrame(0, opaque_data=b"stillok!").serialize())
        deadline = time.monotonic() + 5
        while True:
            f = self.read_frame(deadline)
            if f is None:
                say("no pong")
                return
            if isinstance(f, PingFrame) and "ACK" in f.flags:
                say("pong")
                return

    def until_goaway(self, seconds=5):
        """Reads until a GOAWAY ("goaway 0x..") or the end ("closed" / "timeout")."""
        deadline = time.monotonic() + seconds
        while True:
            f = self.read_frame(deadline)
            if f is None:
                say("timeout" if time.monotonic() >= deadline else "closed")
                return None
            if isinstance(f, GoAwayFrame):
                say("goaway", hex(f.error_code))
                return f


def rapid_reset(port, n="2000"):
    """Opens and cancels streams back to back: the CVE-2023-44487 pattern."""
    c = Conn(port)
    out = b""
    for i in range(int(n)):
        stream = 1 + 2 * i
        out += c.request(stream, "/rapid") + RstStreamFrame(stream, error_code=0x8).serialize()
    c.send(out)
    c.until_goaway()


def ping_flood(port, n="5000"):
    c = Conn(port)
    c.send(b"".join(PingFrame(0, opaque_data=struct.pack(">Q", i)).serialize()
                    for i in range(int(n))))
    c.until_goaway()


def continuation_flood(port, n="1000"):
    """A HEADERS frame without END_HEADERS, then CONTINUATION frames that never end the block,
    each small (under any byte bound) but many."""
    c = Conn(port)
    h = HeadersFrame(1)
    h.data = c.block("/flood")
    h.flags.add("END_STREAM")
    out = h.serialize()
    piece = c.enc.encode([("x-flood", "f" * 20)])
    for _ in range(int(n)):
        k = ContinuationFrame(1)
        k.data = piece
        out += k.serialize()
    c.send(out)
    c.until_goaway()


def big_headers(port, n="16384"):
    """A request whose header list exceeds max_header_bytes (split over CONTINUATION frames as
    the frame size requires): prints the status of the answer, then whether the connection
    still answers a PING."""
    c = Conn(port)
    extra = [("x-big-%d" % i, "b" * 200) for i in range(int(n) // 232 + 1)]
    block = c.block("/big", extra=extra)
    pieces = [block[i:i + 16384] for i in range(0, len(block), 16384)]
    h = HeadersFrame(1)
    h.data = pieces[0]
    h.flags.add("END_STREAM")
    frames = [h]
    for p in pieces[1:]:
        k = ContinuationFrame(1)
        k.data = p
        frames.append(k)
    frames[-1].flags.add("END_HEADERS")
    c.send(b"".join(f.serialize() for f in frames))
    deadline = time.monotonic() + 5
    while True:
        f = c.read_frame(deadline)
        if f is None:
            say("closed")
            return
        if isinstance(f, HeadersFrame) and f.stream_id == 1:
            say("status", f.fields[":status"])
            c.ping()
            return
        if isinstance(f, (GoAwayFrame, RstStreamFrame)):
            say(type(f).__name__, hex(f.error_code))
            return


def zero_window(port, path, size):
    """SETTINGS_INITIAL_WINDOW_SIZE 0, asks for `size` bytes and never opens the window: prints
    the status, then how the stream ended ("rst <code> after <s>") and whether the connection
    still answers a PING."""
    c = Conn(port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0})
    c.send(c.request(1, path, extra=[("x-test-body-bytes", size)]))
    start = time.monotonic()
    deadline = start + 10
    while True:
        f = c.read_frame(deadline)
        if f is None:
            say("no reset")
            return
        if isinstance(f, HeadersFrame) and f.stream_id == 1:
            say("status", f.fields[":status"])
        elif isinstance(f, RstStreamFrame) and f.stream_id == 1:
            say("rst", hex(f.error_code), "after %.1f" % (time.monotonic() - start))
            break
        elif isinstance(f, GoAwayFrame):
            say("goaway", hex(f.error_code))
            return
    c.ping()


def max_streams(port, ack="ack"):
    """Prints the proxy's SETTINGS_MAX_CONCURRENT_STREAMS, opens that many streams and keeps
    them open (request bodies that never end), then one more: prints how that one was
    answered. With "noack" the client has not acknowledged the proxy's SETTINGS yet (as when
    it sends its first requests right after its preface)."""
    c = Conn(port, ack=ack == "ack")
    deadline = time.monotonic() + 5
    while SettingsFrame.MAX_CONCURRENT_STREAMS not in c.remote_settings:
        if c.read_frame(deadline) is None:
            say("no settings")
            return
    limit = c.remote_settings[SettingsFrame.MAX_CONCURRENT_STREAMS]
    say("max_concurrent_streams", limit)
    out = b""
    for i in range(limit + 1):
        out += c.request(1 + 2 * i, "/held", method="POST", end_stream=False)
    c.send(out)
    last = 1 + 2 * limit
    while True:
        f = c.read_frame(deadline)
        if f is None:
            say("no answer")
            return
        if isinstance(f, RstStreamFrame) and f.stream_id == last:
            say("rst", hex(f.error_code))
            c.ping()
            return
        if isinstance(f, HeadersFrame) and f.stream_id == last:
            say("status", f.fields[":status"])
            return
        if isinstance(f, GoAwayFrame):
            say("goaway", hex(f.error_code), "last_stream", f.last_stream_id)
            return


def drain(port, path, stream_id):
    """A download the upstream holds part-way (X-Test-Pause-After-Bytes): prints "head 200",
    then "goaway 0x0 last_stream N" when the proxy drains, then "complete <bytes>" when the
    body ends."""
    c = Conn(port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 2**31 - 1}, window=2**30)
    size = 2 << 20
    c.send(c.request(1, path, extra=[("x-test-body-bytes", str(size)),
                                      ("x-test-pause-after-bytes", "65536"),
                                      ("x-test-stream-id", stream_id)]))
    got = 0
    deadline = time.monotonic() + 20
    while True:
        f = c.read_frame(deadline)
        if f is None:
            say("cut after", got)
            return
        if isinstance(f, HeadersFrame) and f.stream_id == 1:
            say("head", f.fields[":status"])
        elif isinstance(f, GoAwayFrame):
            say("goaway", hex(f.error_code), "last_stream", f.last_stream_id)
        elif isinstance(f, RstStreamFrame):
            say("rst", hex(f.error_code))
            return
        elif f.type == 0 and f.stream_id == 1:
            got += len(f.data)
            if "END_STREAM" in f.flags:
                say("complete", got)
                return


def cancel_guarded(port, upstream_port, path, key):
    """A guarded POST the upstream answers after 1 s; once the upstream has it (its /__count
    for the key, polled for at most 5 s), the client cancels the stream (RST_STREAM CANCEL).
    Prints "cancelled", then "pong" when the connection goes on."""
    c = Conn(port)
    body = b'{"amount":1000,"currency":"eur"}'
    out = c.request(1, path, method="POST", end_stream=False,
                    extra=[("idempotency-key", key), ("content-type", "application/json"),
                           ("content-length", str(len(body))), ("x-test-delay-ms", "1000")])
    d = DataFrame(1)
    d.data = body
    d.flags.add("END_STREAM")
    c.send(out + d.serialize())
    url = "http://127.0.0.1:%s/__count?key=%s" % (upstream_port, key)
    deadline = time.monotonic() + 5
    while json.load(urllib.request.urlopen(url, timeout=5))["count"] < 1:
        if time.monotonic() > deadline:
            say("the upstream never had the request")
            return
        time.sleep(0.01)  # a poll of the upstream's counter, bounded above
    c.send(RstStreamFrame(1, error_code=0x8).serialize())
    say("cancelled")
    c.ping()


def idle(port):
    """One request, answered, then nothing: prints how the proxy ends the idle connection
    ("goaway 0x0 last_stream 1", then "closed")."""
    c = Conn(port)
    c.send(c.request(1, "/idle"))
    deadline = time.monotonic() + 10
    while True:
        f = c.read_frame(deadline)
        if f is None:
            say("timeout" if time.monotonic() >= deadline else "closed")
            return
        if isinstance(f, GoAwayFrame):
            say("goaway", hex(f.error_code), "last_stream", f.last_stream_id)


SCENARIOS = {f.__name__: f for f in (rapid_reset, ping_flood, continuation_flood, big_headers,
                                      zero_window, max_streams, drain, cancel_guarded, idle)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](int(sys.argv[2]), *sys.argv[3:])
