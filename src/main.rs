#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use flashgate::reload::ConfigSource;
use flashgate::Settings;
use std::path::PathBuf;
use std::process::ExitCode;

/// flashgate: a flash-sale gateway in front of a shop backend.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway in the foreground until SIGTERM (graceful) or SIGINT (fast); SIGHUP (or
    /// a change of the file) reloads the configuration.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate a configuration file: exit 0 if valid, else name the offending key.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the stock ledger per activity and version; exit 1 on any drift. Needs only the
    /// configuration file and Redis, not the gateway's secrets.
    Reconcile {
        #[arg(long)]
        config: PathBuf,
        /// Only this activity.
        #[arg(long)]
        activity: Option<String>,
    },
}

/// Exit codes beyond success.
const EXIT_DRIFT: u8 = 1;
const EXIT_CONFIG: u8 = 2;
const EXIT_STORE: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match Settings::load(&config) {
            Ok(settings) => {
                println!(
                    "{}: valid ({} activities, {} sale routes)",
                    config.display(),
                    settings.activities.len(),
                    settings.sale_routes.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", config.display());
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Reconcile { config, activity } => {
            let settings = match Settings::load_without_secrets(&config) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            match flashgate::reconcile::run_cli(settings, activity.as_deref()) {
                Ok(report) => {
                    print!("{}", report.table());
                    if report.clean() {
                        println!("reconcile: clean");
                        ExitCode::SUCCESS
                    } else {
                        println!("reconcile: DRIFT");
                        ExitCode::from(EXIT_DRIFT)
                    }
                }
                Err(e) => {
                    eprintln!("reconcile: {e}");
                    match e {
                        flashgate::reconcile::ReconcileError::UnknownActivity(_) => {
                            ExitCode::from(EXIT_CONFIG)
                        }
                        flashgate::reconcile::ReconcileError::Store(_) => {
                            ExitCode::from(EXIT_STORE)
                        }
                    }
                }
            }
        }
        Command::Serve { config } => {
            let (settings, source) = match ConfigSource::load(&config) {
                Ok(loaded) => loaded,
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            let _log_guard = init_logging();
            match flashgate::server::run(settings, Some(source), Default::default()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("flashgate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Logs to stdout through a non-blocking writer (decision lines must not stall requests).
/// `RUST_LOG` filters; `FLASHGATE_LOG_FORMAT=json` switches to JSON lines.
fn init_logging() -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::EnvFilter;
    let (writer, guard) = tracing_appender::non_blocking(std::io::stdout());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_writer(writer);
    if std::env::var("FLASHGATE_LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.init();
    }
    guard
}
