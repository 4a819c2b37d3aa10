//! A real headless browser for the page tests: Debian's chromium driven over WebDriver by
//! chromedriver (both killed on drop), and the identity a shop's sign-in gives it.

use crate::support::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const IDENTITY_SECRET: &str = "identity-secret-for-the-browser";

pub fn token(user: &str) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("idp1".into());
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    jsonwebtoken::encode(
        &header,
        &json!({ "sub": user, "exp": exp }),
        &EncodingKey::from_secret(IDENTITY_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// chromedriver on a free port, with one headless chromium session; both killed on drop.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    pub session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A browser with script on, asking for English pages.
    pub async fn start() -> Browser {
        Browser::start_with(true, "en-US,en").await
    }

    /// A browser with script on or off (a buyer without JavaScript), whose `Accept-Language`
    /// is `languages`.
    pub async fn start_with(script: bool, languages: &str) -> Browser {
        let port = free_port();
        // Its own process group: the browser it starts stays in it, and goes with it on drop.
        let driver = Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (scripts/ensure-deps installs chromium-driver)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: tempfile::tempdir().unwrap(),
        };
        wait_for_async(
            "chromedriver to listen",
            Duration::from_secs(20),
            || async { tokio::net::TcpStream::connect(addr).await.ok().map(|_| ()) },
        )
        .await;
        let profile = browser._profile.path().display().to_string();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--disable-background-networking",
                         "--disable-extensions", "--no-first-run",
                         format!("--user-data-dir={profile}")],
                "prefs": {
                    "intl.accept_languages": languages,
                    "profile.managed_default_content_settings.javascript": if script { 1 } else { 2 }
                }
            }
        }}});
        let created = browser.call("POST", "/session", Some(caps)).await;
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        browser
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let (status, body) =
            tokio::time::timeout(Duration::from_secs(60), exchange(self.addr, &raw))
                .await
                .expect("chromedriver answers within a minute");
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert!(status < 300, "{method} {path}: {status} {v}");
        v["value"].clone()
    }

    pub async fn command(&self, method: &str, what: &str, body: Value) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        self.call(method, &path, Some(body)).await
    }

    pub async fn go(&self, url: &str) {
        self.command("POST", "url", json!({ "url": url })).await;
    }

    /// The page's URL now (read by the driver, not by the page's script).
    pub async fn url(&self) -> String {
        let path = format!("/session/{}/url", self.session);
        self.call("GET", &path, None)
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// Types `text` into the element `css` selects, key by key, as a person would.
    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.command(
            "POST",
            &format!("element/{id}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    /// The driver's id of the element `css` selects (panics when there is none).
    async fn element(&self, css: &str) -> String {
        let found = self
            .command(
                "POST",
                "element",
                json!({ "using": "css selector", "value": css }),
            )
            .await;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("no element {css}: {found}"))
            .to_owned()
    }

    /// Clicks the element `css` selects, as a buyer would.
    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.command("POST", &format!("element/{id}/click"), json!({}))
            .await;
    }

    /// Resizes the window to `width` x `height` CSS pixels of page (the viewport).
    pub async fn viewport(&self, width: u32, height: u32) {
        // The window's frame is what the viewport lacks of the window.
        let frame = self
            .script("return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];")
            .await;
        let (dw, dh) = (
            frame[0].as_i64().unwrap_or(0).max(0),
            frame[1].as_i64().unwrap_or(0).max(0),
        );
        let (mut w, mut h) = (width as i64 + dw, height as i64 + dh);
        self.command("POST", "window/rect", json!({ "width": w, "height": h }))
            .await;
        // Measured on a window kept wider than its page (after a phone's width), the frame is
        // off: the window is corrected once by what its page lacks, or has too much, of the size.
        let page = self
            .script("return [window.innerWidth, window.innerHeight];")
            .await;
        let (pw, ph) = (page[0].as_i64().unwrap_or(0), page[1].as_i64().unwrap_or(0));
        if (pw, ph) != (width as i64, height as i64) {
            w += width as i64 - pw;
            h += height as i64 - ph;
            self.command("POST", "window/rect", json!({ "width": w, "height": h }))
                .await;
        }
    }

    /// A PNG of the viewport, saved as `target/screenshots/<name>.png` (kept by CI); with
    /// `FLASHGATE_UPDATE_SCREENSHOTS=1`, copied to `docs/screenshots/` too (the docs' pages show them).
    pub async fn screenshot(&self, name: &str) {
        use base64::Engine;
        let path = format!("/session/{}/screenshot", self.session);
        let png = self.call("GET", &path, None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a screenshot"))
            .expect("base64");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut dirs = vec![root.join("target/screenshots")];
        if std::env::var("FLASHGATE_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
            dirs.push(root.join("docs/screenshots"));
        }
        for dir in dirs {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
        }
    }

    pub async fn script(&self, script: &str) -> Value {
        self.command(
            "POST",
            "execute/sync",
            json!({ "script": script, "args": [] }),
        )
        .await
    }
}

/// One request to chromedriver, read by its Content-Length (chromedriver says
/// `Connection: close` but keeps the connection open).
async fn exchange(addr: SocketAddr, raw: &str) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(raw.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let status = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                return (status, buf[end + 4..end + 4 + length].to_vec());
            }
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "chromedriver closed before answering");
        buf.extend_from_slice(&chunk[..n]);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver's whole group: the chromium it started outlives it otherwise (orphaned,
        // dozens of processes per run), whether or not the test ended its session.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
