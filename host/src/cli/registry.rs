//! `herald plugin push` and `herald plugin deploy`: the plugin registry's HTTP endpoints
//! (docs/PROTOCOL.md, "Plugin registry") called from the command line, over plain HTTP/1.1
//! (`http://` URLs: reach a node on a trusted network, or through a TLS proxy on loopback).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The longest a call may take: a deploy waits for every node to compile and warm the
/// version (the server bounds that by `plugin_registry.deploy_timeout_ms`).
const CALL_LIMIT: Duration = Duration::from_secs(300);

/// An HTTP answer: status and body.
struct Answer {
    status: u16,
    body: String,
}

/// `http://host:port[/base]` → (`host:port`, base path without a trailing slash).
fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("--url {url:?}: use an http:// URL of a Herald node (https:// is not spoken here)");
    };
    let (authority, base) = rest.split_once('/').map_or((rest, ""), |(a, b)| (a, b));
    if authority.is_empty() {
        bail!("--url {url:?} names no host");
    }
    let authority = if authority.contains(':') { authority.to_owned() } else { format!("{authority}:80") };
    Ok((authority, format!("/{base}").trim_end_matches('/').to_owned()))
}

async fn call(
    url: &str,
    method: &str,
    path: &str,
    key: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> anyhow::Result<Answer> {
    let (authority, base) = split_url(url)?;
    let exchange = async {
        let mut stream =
            tokio::net::TcpStream::connect(&authority).await.with_context(|| format!("connecting to {authority}"))?;
        let mut head = format!(
            "{method} {base}{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nAuthorization: Bearer {key}\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").context("the answer has no end of headers")?;
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).context("the answer has no status")?;
        let mut body = raw[split + 4..].to_vec();
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            body = dechunk(&body);
        }
        anyhow::Ok(Answer { status, body: String::from_utf8_lossy(&body).into_owned() })
    };
    tokio::time::timeout(CALL_LIMIT, exchange).await.context("no answer in time")?
}

/// A chunked body, whole.
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..end]).trim(), 16).unwrap_or(0);
        if size == 0 || raw.len() < end + 2 + size {
            break;
        }
        body.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[(end + 4 + size).min(raw.len())..];
    }
    body
}

/// The answer's body when it is a success; its error message otherwise.
fn success(answer: Answer, what: &str) -> anyhow::Result<String> {
    if (200..300).contains(&answer.status) {
        return Ok(answer.body);
    }
    let message = serde_json::from_str::<serde_json::Value>(&answer.body)
        .ok()
        .and_then(|json| json["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or(answer.body);
    bail!("{what} failed (HTTP {}): {message}", answer.status)
}

/// `herald plugin push FILE.wasm [--manifest FILE.toml]`: uploads a version. Its name and
/// version come from the flags, else from the manifest, else (the name) the file's stem.
pub async fn push(
    file: &Path,
    manifest: Option<&Path>,
    name: Option<String>,
    version: Option<String>,
    url: &str,
    key: &str,
) -> anyhow::Result<String> {
    // The command's only work: nothing else waits on this thread.
    let component = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let text = match manifest {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => String::new(),
    };
    let parsed = match text.is_empty() {
        true => herald_plugin_runtime::Manifest::default(),
        false => herald_plugin_runtime::Manifest::parse(&text).context("the manifest is not valid")?,
    };
    let stem = file.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
    let name = name.or(parsed.name.clone()).or(stem).context("name the plugin with --name")?;
    let version = version.or(parsed.version.clone()).context("give the version with --version or in the manifest")?;
    let headers = if text.is_empty() {
        Vec::new()
    } else {
        vec![("X-Herald-Manifest", base64::engine::general_purpose::STANDARD.encode(text.as_bytes()))]
    };
    let path = format!("/admin/plugins/{name}/versions/{version}");
    success(call(url, "PUT", &path, key, &headers, &component).await?, "the upload")
}

/// `herald plugin deploy NAME VERSION [--shadow]`.
pub async fn deploy(name: &str, version: &str, shadow: bool, url: &str, key: &str) -> anyhow::Result<String> {
    let body = serde_json::json!({ "version": version, "as": if shadow { "shadow" } else { "active" } }).to_string();
    let headers = [("Content-Type", "application/json".to_owned())];
    let path = format!("/admin/plugins/{name}/deploy");
    success(call(url, "POST", &path, key, &headers, body.as_bytes()).await?, "the deploy")
}
