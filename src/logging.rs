//! Process logging: stdout, `RUST_LOG` filters, `FLASHGATE_LOG_FORMAT=json` for JSON lines.
//!
//! Lines are written synchronously until start-up is over, then through a non-blocking writer
//! (decision lines must not stall requests). Start-up is written synchronously because Pingora
//! ends a failed start (e.g. `serve --upgrade` with no gateway to take over from) with
//! `exit(1)`, which would drop whatever the non-blocking writer still held: the reason.

use std::sync::atomic::{AtomicBool, Ordering};
use tracing_appender::non_blocking::{NonBlocking, WorkerGuard};
use tracing_subscriber::fmt::writer::{EitherWriter, MakeWriter};

static STARTED: AtomicBool = AtomicBool::new(false);

/// Start-up is over: later lines go through the non-blocking writer.
pub fn startup_done() {
    STARTED.store(true, Ordering::Release);
}

#[derive(Clone)]
struct StartupThenNonBlocking(NonBlocking);

impl<'a> MakeWriter<'a> for StartupThenNonBlocking {
    type Writer = EitherWriter<NonBlocking, std::io::Stdout>;

    fn make_writer(&'a self) -> Self::Writer {
        if STARTED.load(Ordering::Acquire) {
            EitherWriter::A(self.0.clone())
        } else {
            EitherWriter::B(std::io::stdout())
        }
    }
}

/// Installs the global subscriber; keep the guard alive until exit (it flushes on drop).
pub fn init() -> WorkerGuard {
    use tracing_subscriber::EnvFilter;
    let (writer, guard) = tracing_appender::non_blocking(std::io::stdout());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_writer(StartupThenNonBlocking(writer));
    if std::env::var("FLASHGATE_LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.init();
    }
    guard
}
