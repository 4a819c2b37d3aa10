//! flashgate's load generator: a truly instantaneous burst (every connection is open before the
//! first byte is sent, then all are released at one instant), or a fixed-rate open-loop load
//! (latency measured from each request's scheduled time, so queueing is not hidden). Reports
//! throughput, latency percentiles and outcome counts, and can check correctness against the
//! demo upstream's record (winners == stock, nobody over the per-user limit, unique jti).
#![forbid(unsafe_code)]

use clap::{Args, Parser, Subcommand};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Parser)]
#[command(about = "Load generator for flashgate (and anything else speaking HTTP/1.1)")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Open every connection, then release all requests at one instant.
    Burst(Common),
    /// Send at a fixed rate for a duration (open loop).
    Rate {
        #[command(flatten)]
        common: Common,
        /// Requests per second.
        #[arg(long)]
        rate: u64,
        /// How long to send.
        #[arg(long, default_value_t = 10)]
        duration_secs: u64,
    },
}

#[derive(Args, Clone)]
struct Common {
    /// Where to send, host:port.
    #[arg(long)]
    target: SocketAddr,
    /// Request path; `{n}` is replaced by the request number.
    #[arg(long, default_value = "/api/seckill/1001/buy")]
    path: String,
    #[arg(long, default_value = "POST")]
    method: String,
    /// Distinct buyers.
    #[arg(long, default_value_t = 1000)]
    buyers: u64,
    /// Requests each buyer sends (repeat buyers when > 1). In rate mode: the request count is
    /// rate × duration and buyers are cycled.
    #[arg(long, default_value_t = 1)]
    requests_per_buyer: u64,
    /// Connections (each keeps alive and carries its share of the requests).
    #[arg(long, default_value_t = 256)]
    connections: u64,
    /// Burst only: write all of a connection's requests at once (HTTP/1.1 pipelining).
    #[arg(long)]
    pipeline: bool,
    /// Quantity mix, e.g. `1:80,2:20` (weights); sent as `?qty=N` when any N differs from 1.
    #[arg(long, default_value = "1:1")]
    qty_mix: String,
    /// Identity header carrying the buyer id; empty sends none.
    #[arg(long, default_value = "X-User-Id")]
    user_header: String,
    /// Buyer ids are this prefix plus a number.
    #[arg(long, default_value = "buyer-")]
    user_prefix: String,
    /// Demo upstream to check correctness against (its /__upstream/requests).
    #[arg(long)]
    check_upstream: Option<SocketAddr>,
    /// With --check-upstream: the stock on sale.
    #[arg(long)]
    stock: Option<u64>,
    /// With --check-upstream: the per-user limit in units.
    #[arg(long)]
    per_user_limit: Option<u64>,
    /// Waiting-room tickets: every answer must carry a ticket (`202 queued`), and no two
    /// answers the same ticket number or `queue_position` (one place per buyer; with
    /// `--requests-per-buyer` 1, distinct buyers).
    #[arg(long)]
    check_tickets: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone)]
struct Plan {
    requests: Arc<Vec<Vec<u8>>>,
}

fn parse_mix(mix: &str) -> Vec<u32> {
    let mut table = Vec::new();
    for part in mix.split(',') {
        let (qty, weight) = part.split_once(':').unwrap_or((part, "1"));
        let qty: u32 = qty.trim().parse().expect("qty-mix: quantity");
        let weight: u32 = weight.trim().parse().expect("qty-mix: weight");
        table.extend(std::iter::repeat_n(qty, weight as usize));
    }
    assert!(!table.is_empty(), "qty-mix is empty");
    table
}

fn build_plan(c: &Common, total: u64) -> Plan {
    let mix = parse_mix(&c.qty_mix);
    let explicit_qty = mix.iter().any(|&q| q != 1);
    let requests = (0..total)
        .map(|n| {
            let buyer = n % c.buyers;
            let mut path = c.path.replace("{n}", &n.to_string());
            if explicit_qty {
                let qty = mix[(n as usize * 7919) % mix.len()];
                path.push(if path.contains('?') { '&' } else { '?' });
                path.push_str(&format!("qty={qty}"));
            }
            let mut req = format!("{} {path} HTTP/1.1\r\nHost: {}\r\n", c.method, c.target);
            if !c.user_header.is_empty() {
                req.push_str(&format!("{}: {}{buyer}\r\n", c.user_header, c.user_prefix));
            }
            if c.method == "POST" || c.method == "PUT" {
                req.push_str("Content-Length: 0\r\n");
            }
            req.push_str("\r\n");
            req.into_bytes()
        })
        .collect();
    Plan {
        requests: Arc::new(requests),
    }
}

/// One response: status and the contract `code` when the body has one; a waiting-room
/// answer's ticket number and place.
struct Answer {
    status: u16,
    code: Option<String>,
    ticket: Option<(u64, u64)>,
}

/// The JSON string value of `key` in `body`, if any (flat, unescaped values only).
fn string_field<'b>(body: &'b str, key: &str) -> Option<&'b str> {
    let start = body.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let end = start + body[start..].find('"')?;
    Some(&body[start..end])
}

/// The number of `key` in `body`, if any.
fn number_field(body: &str, key: &str) -> Option<u64> {
    let start = body.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits = body[start..].split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<Answer> {
    use tokio::io::AsyncBufReadExt;
    let mut line = String::new();
    let mut status = 0u16;
    let mut length = 0usize;
    let mut first = true;
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if first {
            status = l
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            first = false;
        } else if l.is_empty() {
            break;
        } else if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).await?;
    let text = std::str::from_utf8(&body).ok();
    let code = text.and_then(|b| string_field(b, "code").map(str::to_owned));
    // `t1.<activity>.<number>.<issued>.<epoch>.<mac>`
    let ticket = text.and_then(|b| {
        let number = string_field(b, "ticket")?.split('.').nth(2)?.parse().ok()?;
        Some((number, number_field(b, "queue_position")?))
    });
    Ok(Answer {
        status,
        code,
        ticket,
    })
}

#[derive(Default)]
struct Tally {
    latency_us: Option<Histogram<u64>>,
    outcomes: BTreeMap<String, u64>,
    errors: u64,
    /// Waiting-room answers' (ticket number, place).
    tickets: Vec<(u64, u64)>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            latency_us: Some(Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram")),
            ..Default::default()
        }
    }

    fn record(&mut self, started: Instant, answer: std::io::Result<Answer>) {
        let us = started.elapsed().as_micros().max(1) as u64;
        match answer {
            Ok(a) => {
                let _ = self.latency_us.as_mut().unwrap().record(us.min(60_000_000));
                let key = match a.code {
                    Some(code) => format!("{} {code}", a.status),
                    None => a.status.to_string(),
                };
                *self.outcomes.entry(key).or_default() += 1;
                self.tickets.extend(a.ticket);
            }
            Err(_) => self.errors += 1,
        }
    }

    fn merge(&mut self, other: Tally) {
        if let (Some(a), Some(b)) = (self.latency_us.as_mut(), other.latency_us.as_ref()) {
            a.add(b).expect("same bounds");
        }
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        self.errors += other.errors;
        self.tickets.extend(other.tickets);
    }
}

async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Burst: connections open first, then every connection starts at the same instant.
async fn burst(c: &Common) -> (Tally, Duration) {
    let total = c.buyers * c.requests_per_buyer;
    let plan = build_plan(c, total);
    let conns = c.connections.min(total).max(1);
    let gate = Arc::new(tokio::sync::Barrier::new(conns as usize + 1));
    let mut tasks = Vec::new();
    for k in 0..conns {
        let (plan, gate, target, pipeline) = (plan.clone(), gate.clone(), c.target, c.pipeline);
        tasks.push(tokio::spawn(async move {
            let mine: Vec<usize> = (k as usize..plan.requests.len())
                .step_by(conns as usize)
                .collect();
            let mut tally = Tally::new();
            let stream = connect(target).await;
            gate.wait().await;
            let Ok(stream) = stream else {
                tally.errors += mine.len() as u64;
                return tally;
            };
            let (read, mut write) = stream.into_split();
            let mut read = BufReader::new(read);
            let released = Instant::now();
            if pipeline {
                let mut all = Vec::new();
                for &i in &mine {
                    all.extend_from_slice(&plan.requests[i]);
                }
                if write.write_all(&all).await.is_err() {
                    tally.errors += mine.len() as u64;
                    return tally;
                }
                for _ in &mine {
                    let answer = read_response(&mut read).await;
                    let failed = answer.is_err();
                    tally.record(released, answer);
                    if failed {
                        break;
                    }
                }
            } else {
                for &i in &mine {
                    let started = Instant::now();
                    if write.write_all(&plan.requests[i]).await.is_err() {
                        tally.errors += 1;
                        break;
                    }
                    let answer = read_response(&mut read).await;
                    let failed = answer.is_err();
                    tally.record(started, answer);
                    if failed {
                        break;
                    }
                }
            }
            tally
        }));
    }
    gate.wait().await;
    let started = Instant::now();
    let mut tally = Tally::new();
    for t in tasks {
        tally.merge(t.await.expect("connection task"));
    }
    (tally, started.elapsed())
}

/// Fixed rate, open loop: request i is due at start + i/rate; latency counts from that instant.
async fn rate(c: &Common, rate: u64, duration: Duration) -> (Tally, Duration) {
    let total = (rate as f64 * duration.as_secs_f64()) as u64;
    let plan = build_plan(c, total.min(c.buyers * c.requests_per_buyer.max(1)).max(1));
    let conns = c.connections.max(1);
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut streams = Vec::new();
    for _ in 0..conns {
        streams.push(connect(c.target).await);
    }
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::new();
    for (k, stream) in streams.into_iter().enumerate() {
        let plan = plan.clone();
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new();
            let Ok(stream) = stream else {
                tally.errors += 1;
                return tally;
            };
            let (read, mut write) = stream.into_split();
            let mut read = BufReader::new(read);
            let mut i = k as u64;
            while i < total {
                let due = start + interval.mul_f64(i as f64);
                tokio::time::sleep_until(due.into()).await;
                let req = &plan.requests[(i % plan.requests.len() as u64) as usize];
                if write.write_all(req).await.is_err() {
                    tally.errors += 1;
                    break;
                }
                let answer = read_response(&mut read).await;
                let failed = answer.is_err();
                tally.record(due, answer);
                if failed {
                    break;
                }
                i += conns;
            }
            tally
        }));
    }
    let mut tally = Tally::new();
    for t in tasks {
        tally.merge(t.await.expect("connection task"));
    }
    (tally, start.elapsed())
}

#[derive(Serialize)]
struct Report {
    requests: u64,
    errors: u64,
    elapsed_secs: f64,
    throughput_rps: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    outcomes: BTreeMap<String, u64>,
    correct: Option<bool>,
    check: Vec<String>,
    /// With `--check-tickets`: answers with a ticket, distinct numbers, distinct places.
    #[serde(skip_serializing_if = "Option::is_none")]
    tickets: Option<[u64; 3]>,
}

fn report(tally: &Tally, elapsed: Duration) -> Report {
    let h = tally.latency_us.as_ref().unwrap();
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let done: u64 = tally.outcomes.values().sum();
    Report {
        requests: done,
        errors: tally.errors,
        elapsed_secs: elapsed.as_secs_f64(),
        throughput_rps: done as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: ms(0.5),
        p90_ms: ms(0.9),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: h.max() as f64 / 1000.0,
        outcomes: tally.outcomes.clone(),
        correct: None,
        check: Vec::new(),
        tickets: None,
    }
}

/// With `--check-tickets`: every request answered with a ticket, no number and no place twice.
fn check_tickets(c: &Common, tally: &Tally, report: &mut Report) {
    if !c.check_tickets {
        return;
    }
    let numbers: HashSet<u64> = tally.tickets.iter().map(|t| t.0).collect();
    let places: HashSet<u64> = tally.tickets.iter().map(|t| t.1).collect();
    let answered = tally.tickets.len() as u64;
    report.tickets = Some([answered, numbers.len() as u64, places.len() as u64]);
    let mut problems = Vec::new();
    if report.errors > 0 || answered != report.requests {
        problems.push(format!(
            "{answered} tickets for {} requests ({} transport errors)",
            report.requests, report.errors
        ));
    }
    if numbers.len() as u64 != answered || places.len() as u64 != answered {
        problems.push(format!(
            "{answered} tickets: {} distinct numbers, {} distinct places",
            numbers.len(),
            places.len()
        ));
    }
    report.correct = Some(report.correct.unwrap_or(true) && problems.is_empty());
    report.check.extend(problems);
}

/// Checks the demo upstream's record: every winner reached it once, with a unique jti; no more
/// units than the stock; nobody over the per-user limit.
async fn check_upstream(c: &Common, report: &mut Report) {
    let Some(addr) = c.check_upstream else { return };
    let mut problems = Vec::new();
    let body = match fetch(addr, "/__upstream/requests").await {
        Ok(b) => b,
        Err(e) => {
            report.correct = Some(false);
            report
                .check
                .push(format!("cannot read the upstream's record: {e}"));
            return;
        }
    };
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let requests = v["requests"].as_array().cloned().unwrap_or_default();
    let mut units_by_user: HashMap<String, u64> = HashMap::new();
    let mut jtis = HashSet::new();
    let mut units = 0;
    for r in &requests {
        let Some(token) = r["headers"]["x-flashgate-reservation"].as_str() else {
            problems.push("an upstream request without a reservation".to_owned());
            continue;
        };
        let claims = match jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(token) {
            Ok(data) => data.claims,
            Err(e) => {
                problems.push(format!("unreadable reservation: {e}"));
                continue;
            }
        };
        let qty = claims["qty"].as_u64().unwrap_or(0);
        units += qty;
        *units_by_user
            .entry(claims["sub"].as_str().unwrap_or("").to_owned())
            .or_default() += qty;
        if !jtis.insert(claims["jti"].as_str().unwrap_or("").to_owned()) {
            problems.push("a jti reached the upstream twice".to_owned());
        }
    }
    let winners = report.outcomes.get("200").copied().unwrap_or(0);
    if winners != requests.len() as u64 {
        problems.push(format!(
            "{winners} buyers won but the upstream saw {}",
            requests.len()
        ));
    }
    if let Some(stock) = c.stock {
        if units > stock {
            problems.push(format!("OVERSOLD: {units} units forwarded, stock {stock}"));
        }
    }
    if let Some(limit) = c.per_user_limit {
        let over = units_by_user.values().filter(|&&u| u > limit).count();
        if over > 0 {
            problems.push(format!("{over} users over the per-user limit {limit}"));
        }
    }
    report.check.push(format!(
        "upstream saw {} winners, {units} units",
        requests.len()
    ));
    report.correct = Some(problems.is_empty());
    report.check.extend(problems);
}

async fn fetch(addr: SocketAddr, path: &str) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(buf.len(), |p| p + 4);
    Ok(buf[split..].to_vec())
}

fn print_human(r: &Report) {
    println!(
        "requests {}  errors {}  elapsed {:.3}s  throughput {:.0} req/s",
        r.requests, r.errors, r.elapsed_secs, r.throughput_rps
    );
    println!(
        "latency ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        r.p50_ms, r.p90_ms, r.p99_ms, r.p999_ms, r.max_ms
    );
    for (outcome, n) in &r.outcomes {
        println!("  {outcome:<28} {n}");
    }
    for line in &r.check {
        println!("check: {line}");
    }
    if let Some(ok) = r.correct {
        println!("correct: {}", if ok { "yes" } else { "NO" });
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let (common, (tally, elapsed)) = match &cli.mode {
        Mode::Burst(c) => (c.clone(), burst(c).await),
        Mode::Rate {
            common,
            rate: r,
            duration_secs,
        } => (
            common.clone(),
            rate(common, *r, Duration::from_secs(*duration_secs)).await,
        ),
    };
    let mut r = report(&tally, elapsed);
    check_upstream(&common, &mut r).await;
    check_tickets(&common, &tally, &mut r);
    if common.json {
        println!("{}", serde_json::to_string(&r).expect("report serializes"));
    } else {
        print_human(&r);
    }
    if r.correct == Some(false) {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
