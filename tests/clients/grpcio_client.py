"""A gRPC C-core client (Python grpcio) calling the plugin as tools other than the
kubelet do: it dials each Unix socket by path, so it sends the percent-encoded path as
the HTTP/2 `:authority` (grpc C-core >= 1.57 does by default).

Usage: grpcio_client.py REGISTRATION_SOCKET DRA_SOCKET SCRATCH_DIR

1. Records the `:authority` this client sends, against a listener of its own in
   SCRATCH_DIR that answers the HTTP/2 SETTINGS and reads the request's HEADERS, so
   the caller can check the calls below carried a path and not "localhost".
2. Calls pluginregistration.Registration/GetInfo on REGISTRATION_SOCKET.
3. Calls the v1 DRAPlugin/NodePrepareResources with an empty request on DRA_SOCKET.

Messages are protobuf encoded and decoded by hand (no generated stubs, no
grpcio-tools). Prints one JSON object; exits 1 if a call fails, with the gRPC status.
"""

import json
import os
import socket
import sys
import threading

import grpc

TIMEOUT_S = 20


def identity(b):
    return b


def call(socket_path, method, request):
    """One unary call over a fresh channel dialing `unix:<socket_path>`."""
    with grpc.insecure_channel("unix:" + socket_path) as channel:
        rpc = channel.unary_unary(
            method, request_serializer=identity, response_deserializer=identity
        )
        return rpc(request, timeout=TIMEOUT_S)


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def string_fields(buf):
    """The length-delimited fields of a protobuf message: {field number: [str]}."""
    out = {}
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = varint(buf, i)
        elif wire == 2:
            n, i = varint(buf, i)
            out.setdefault(field, []).append(buf[i : i + n].decode())
            i += n
        else:
            raise ValueError("unexpected wire type %d in field %d" % (wire, field))
    return out


def has_authority(received):
    """Whether `received` holds the `:authority` field and all of its value."""
    at = received.find(b":authority")
    return at >= 0 and len(received) > at + 10 and len(received) >= at + 11 + (received[at + 10] & 0x7F)


def recorded_authority(scratch):
    """The `:authority` of one call to a socket in `scratch`, read off the wire."""
    path = os.path.join(scratch, "authority.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    received = bytearray()

    def serve():
        conn, _ = listener.accept()
        conn.settimeout(5)
        # An empty SETTINGS, and an ACK of the client's: the client then sends HEADERS.
        conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
        try:
            while not has_authority(received):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received.extend(chunk)
        except OSError:
            pass
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    try:
        with grpc.insecure_channel("unix:" + path) as channel:
            channel.unary_unary("/probe/Authority", request_serializer=identity)(b"", timeout=3)
    except grpc.RpcError:
        pass  # the listener never answers the call
    t.join()
    listener.close()
    at = received.find(b":authority")
    if at < 0:
        return None
    # HPACK literal, new name: ... 0x0a ":authority" <length byte> <value>; C-core
    # does not Huffman-code these values (the high bit of the length would say so).
    n = received[at + 10]
    if n & 0x80:
        return "<huffman-coded>"
    return received[at + 11 : at + 11 + n].decode()


def main():
    registration, dra, scratch = sys.argv[1:4]
    out = {"grpcio": grpc.__version__, "authority_sent": recorded_authority(scratch)}
    try:
        info = string_fields(call(registration, "/pluginregistration.Registration/GetInfo", b""))
        out["get_info"] = {
            "type": info.get(1, [""])[0],
            "name": info.get(2, [""])[0],
            "endpoint": info.get(3, [""])[0],
            "supported_versions": info.get(4, []),
        }
        response = call(
            dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", b""
        )
        out["prepare_response_bytes"] = len(response)
    except grpc.RpcError as e:
        out["error"] = "%s: %s" % (e.code(), e.details())
        print(json.dumps(out))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
