//! gRPC clients that dial a Unix socket by path send that path, percent-encoded, as the
//! HTTP/2 `:authority`: the real kubelet's plugin-registration client does
//! (`grpc.DialContext(socketPath)` in its operation generator), and so do grpc C-core
//! clients (Python's grpcio). The plugin's sockets must serve such a request; upstream
//! h2 resets the stream with PROTOCOL_ERROR before any handler runs, which kept the real
//! kubelet from ever registering Tessera (found on a real 1.34/1.37 cluster).
//!
//! The test speaks HTTP/2 by hand (preface, SETTINGS, one HEADERS frame with literal
//! HPACK fields, one DATA frame), so the `:authority` is exactly what those clients send.

#[path = "support/harness.rs"]
mod harness;

#[path = "../cdi/tests/common/mod.rs"]
mod cdi_common;

use std::path::Path;
use std::time::Duration;

use harness::Harness;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One HPACK "literal header field without indexing, new name" (RFC 7541 6.2.2), no
/// Huffman coding; names and values here are shorter than 127 bytes.
fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    assert!(name.len() < 127 && value.len() < 127);
    block.push(0x00);
    block.push(name.len() as u8);
    block.extend_from_slice(name.as_bytes());
    block.push(value.len() as u8);
    block.extend_from_slice(value.as_bytes());
}

/// The percent-encoding grpc-go applies to a socket path used as the authority.
fn percent_encoded(path: &Path) -> String {
    path.display().to_string().replace('/', "%2F")
}

struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

async fn read_frame(s: &mut UnixStream) -> Frame {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.expect("a frame header");
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.expect("a frame payload");
    Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    }
}

/// Sends `GetInfo` on the registration socket with the socket path as `:authority` and
/// returns the response's gRPC message bytes, or why the stream was refused.
async fn get_info_with_path_authority(socket: &Path) -> Result<Vec<u8>, String> {
    let mut s = UnixStream::connect(socket).await.expect("connect");
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    let mut block = Vec::new();
    literal(&mut block, ":method", "POST");
    literal(&mut block, ":scheme", "http");
    literal(
        &mut block,
        ":path",
        "/pluginregistration.Registration/GetInfo",
    );
    literal(&mut block, ":authority", &percent_encoded(socket));
    literal(&mut block, "content-type", "application/grpc");
    literal(&mut block, "te", "trailers");
    out.extend(frame(HEADERS, END_HEADERS, 1, &block));
    // An empty InfoRequest: uncompressed, length 0.
    out.extend(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]));
    s.write_all(&out).await.expect("write");
    let mut message = Vec::new();
    loop {
        let f = read_frame(&mut s).await;
        match (f.kind, f.stream) {
            (SETTINGS, 0) if f.flags & ACK == 0 => {
                s.write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .await
                    .expect("ack");
            }
            (RST_STREAM, 1) => {
                let code =
                    u32::from_be_bytes([f.payload[0], f.payload[1], f.payload[2], f.payload[3]]);
                return Err(format!("RST_STREAM with error code {code}"));
            }
            (GOAWAY, _) => return Err("GOAWAY".into()),
            (DATA, 1) => message.extend_from_slice(&f.payload),
            (HEADERS, 1) if f.flags & END_STREAM != 0 => return Ok(message),
            _ => {}
        }
    }
}

/// GetInfo answers with the driver's name whatever the client put in `:authority`.
#[tokio::test]
async fn registration_serves_a_client_that_sends_the_socket_path_as_authority() {
    let h = Harness::new().await;
    let _p = h.start_plugin().await;
    let socket = h.registration_socket();
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        get_info_with_path_authority(&socket),
    )
    .await
    .expect("an answer within 30 s")
    .unwrap_or_else(|e| panic!("GetInfo with :authority {}: {e}", percent_encoded(&socket)));
    // A gRPC message: flag byte, 4-byte length, then the PluginInfo protobuf.
    assert!(reply.len() > 5, "{reply:?}");
    let len = u32::from_be_bytes([reply[1], reply[2], reply[3], reply[4]]) as usize;
    assert_eq!(reply.len(), 5 + len);
    let info = String::from_utf8_lossy(&reply[5..]);
    assert!(info.contains(harness::DRIVER), "{info}");
    assert!(info.contains("DRAPlugin"), "{info}");
}
