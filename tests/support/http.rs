//! A small raw HTTP/1.1 client, and reading metrics.

use super::*;

// ---------------------------------------------------------------- HTTP client

#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The reservation id a winner was told.
    pub fn reservation_id(&self) -> String {
        self.header("x-flashgate-reservation-id")
            .unwrap_or_else(|| {
                panic!(
                    "no reservation id: {} {}",
                    self.status,
                    String::from_utf8_lossy(&self.body)
                )
            })
            .to_owned()
    }

    /// The body as text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts the status and the contract's `code` of a gateway answer.
    #[track_caller]
    pub fn assert_answer(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.code().as_str()),
            (status, code),
            "{}",
            self.text()
        );
    }

    /// The contract's `code` field of a gateway answer.
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }
}

pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: flashgate.test\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" || method == "PUT" {
        req.push_str("Content-Length: 0\r\n");
    }
    req.push_str("\r\n");
    req
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> HttpResponse {
    send_raw(addr, raw_request(method, path, headers).as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{method} {path} to {addr}: {e}"))
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    request(addr, "GET", path, headers).await
}

pub fn blocking_get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(raw_request("GET", path, &[]).as_bytes())?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub async fn send_raw(addr: SocketAddr, raw: &[u8]) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr).await?;
    send_on(&mut stream, raw).await
}

pub async fn send_on(stream: &mut TcpStream, raw: &[u8]) -> std::io::Result<HttpResponse> {
    stream.write_all(raw).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "response timed out"))??;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> std::io::Result<HttpResponse> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_owned());
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| bad("head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("no status line"))?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = buf[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_str = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_str.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// Opens one connection per request first, then sends all of them at the same instant, and
/// returns the responses in request order.
pub async fn burst(addr: SocketAddr, requests: Vec<String>) -> Vec<HttpResponse> {
    let n = requests.len();
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for raw in requests {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let connected = TcpStream::connect(addr).await;
            gate.wait().await;
            let mut stream = connected.expect("connect before the burst");
            send_on(&mut stream, raw.as_bytes())
                .await
                .expect("burst response")
        }));
    }
    gate.wait().await;
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// The value of the first series in Prometheus text `metrics` that starts with `series` (name
/// and labels as exported, e.g. `flashgate_config_reloads_total{result="applied"}`).
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}
