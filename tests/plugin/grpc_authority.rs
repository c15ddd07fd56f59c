//! gRPC clients that dial a Unix socket by path send that path, percent-encoded, as the
//! HTTP/2 `:authority`: the real kubelet's plugin-registration client does
//! (`grpc.DialContext(socketPath)` in its operation generator), and so do grpc C-core
//! clients (Python's grpcio). The plugin's sockets must serve such a request; upstream
//! h2 resets the stream with PROTOCOL_ERROR before any handler runs, which kept the real
//! kubelet from ever registering Tessera (found on a real 1.34/1.37 cluster).
//!
//! The test speaks HTTP/2 by hand (preface, SETTINGS, one HEADERS frame with literal
//! HPACK fields, one DATA frame), so the `:authority` is exactly what those clients send.

use testkit::harness;

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

/// The pinned grpcio client's interpreter from `tests/clients/grpcio-setup.sh`, and
/// the version it pins; `Err(why)` when the venv cannot be made (no python3-venv, no
/// package index).
fn grpcio_venv() -> Result<(std::path::PathBuf, String), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dest = std::env::var_os("TESSERA_GRPCIO_PY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcio-py"));
    let out = std::process::Command::new(root.join("tests/clients/grpcio-setup.sh"))
        .arg(&dest)
        .output()
        .map_err(|e| format!("running tests/clients/grpcio-setup.sh: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "tests/clients/grpcio-setup.sh failed ({}): {}{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let last = stdout.lines().last().unwrap_or_default();
    let field = |key: &str| {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_string)
    };
    match (field("python="), field("grpcio=")) {
        (Some(py), Some(version)) => Ok((py.into(), version)),
        _ => Err(format!(
            "unexpected last line from the setup script: {last:?}"
        )),
    }
}

/// The real thing rather than hand-made frames: the pinned Python grpcio client (gRPC
/// C-core, as other tools and test clients use) calls GetInfo on the registration
/// socket and NodePrepareResources (empty) on the DRA socket, dialing each by path.
/// The client first shows, on a listener of its own, that it sends the percent-encoded
/// socket path as `:authority` (not "localhost"), so the calls exercise the h2 patch.
#[tokio::test]
async fn grpcio_client_calls_registration_and_dra_sockets() {
    let (python, pinned) = match grpcio_venv() {
        Ok(v) => v,
        Err(why) => {
            testkit::prereq::skip_or_fail(
                &format!("grpcio_client_calls_registration_and_dra_sockets: {why}"),
                "the pinned grpcio client is needed (tests/clients/grpcio-setup.sh)",
            );
            return;
        }
    };
    let h = Harness::new().await;
    let p = h.start_plugin().await;
    let scratch = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/grpcio_client.py");
    let args = [
        script.into_os_string(),
        h.registration_socket().into_os_string(),
        h.dra_socket().into_os_string(),
        scratch.path().as_os_str().to_os_string(),
    ];
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(python)
                .args(args)
                .output()
                .unwrap()
        }),
    )
    .await
    .expect("the client finishes within 90 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "grpcio client failed ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    eprintln!("grpcio client: {got}");
    assert_eq!(got["grpcio"], pinned.as_str(), "the pinned version ran");
    let authority = got["authority_sent"].as_str().unwrap_or_default();
    assert!(
        authority.ends_with("%2Fauthority.sock") && !authority.contains('/'),
        "the client sends the percent-encoded socket path as :authority: {authority:?}"
    );
    let info = &got["get_info"];
    assert_eq!(info["type"], "DRAPlugin");
    assert_eq!(info["name"], harness::DRIVER);
    assert_eq!(info["endpoint"], h.dra_socket().display().to_string());
    assert!(
        info["supported_versions"]
            .as_array()
            .is_some_and(|v| v.iter().any(|s| s == "v1.DRAPlugin")),
        "{info}"
    );
    assert_eq!(
        got["prepare_response_bytes"], 0,
        "an empty NodePrepareResourcesResponse for an empty request"
    );
    p.stop().await;
}
