//! Child processes and waiting: free ports, bounded runs, polling with a deadline, reaping.

use super::*;

/// Ports for servers the tests start, below the kernel's ephemeral range (32768 and up): a port
/// handed out here cannot meanwhile become the local end of some client's connection, which
/// happens with `bind(:0)` ports while other tests open thousands of connections. Each port is
/// handed out once per test binary; binaries run one after another.
const GENERAL_PORTS: std::ops::Range<u16> = 23_000..32_700;
/// Cluster nodes: their bus ports (+10000) fall in 20000..23000, which nothing else uses.
const CLUSTER_PORTS: std::ops::Range<u16> = 10_000..13_000;

fn next_port(range: std::ops::Range<u16>, next: &std::sync::atomic::AtomicU32) -> u16 {
    use std::sync::atomic::Ordering;
    let len = u32::from(range.end - range.start);
    // Start somewhere the process id picks, so two binaries run by hand side by side rarely meet.
    let start = (u64::from(std::process::id()) * 2_654_435_761 % u64::from(len)) as u32 + 1;
    let _ = next.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..len {
        let port = range.start + (next.fetch_add(1, Ordering::SeqCst) % len) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {range:?}");
}

pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    next_port(GENERAL_PORTS, &NEXT)
}

/// A port for a cluster node whose bus port (+10000) is free too.
pub(super) fn free_cluster_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    loop {
        let port = next_port(CLUSTER_PORTS, &NEXT);
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Runs `cmd` to completion within `deadline`, killing it and panicking (naming `what`) if it
/// takes longer: a stuck child must fail its test, not hang the run.
pub fn run_bounded(what: &str, cmd: &mut Command, deadline: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} could not start: {e}"));
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_for_exit(&mut child, deadline).unwrap_or_else(|| {
        kill(&mut child);
        panic!("{what} did not finish within {deadline:?}");
    });
    std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Polls `child` until it exits or `deadline` passes.
pub fn wait_for_exit(child: &mut Child, deadline: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return Some(status);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `deadline`.
pub fn wait_for<T>(what: &str, deadline: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Async variant of [`wait_for`].
pub async fn wait_for_async<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A process held in a `static` is never dropped: it would outlive the test binary. This
/// watches the test process and, once it is gone, kills `pid` (if it is still the process
/// whose command line names `mark`, not a pid reused since) and removes `dir`. The watcher is a
/// `sh` loop polling twice a second; it ends with the test process.
// Never waited for: it outlives the test process by design (then init reaps it).
#[allow(clippy::zombie_processes)]
pub fn reap_at_exit(pid: u32, mark: &str, dir: Option<&Path>) {
    let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
if grep -qaF -- "$3" "/proc/$2/cmdline" 2>/dev/null; then kill -9 "$2"; fi
if [ -n "$4" ]; then rm -rf -- "$4"; fi"#;
    Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(std::process::id().to_string())
        .arg(pid.to_string())
        .arg(mark)
        .arg(dir.map(|d| d.as_os_str().to_owned()).unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sh starts");
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}
