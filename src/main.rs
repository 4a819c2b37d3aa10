//! The `flashgate` command line: `serve`, `check`, `reconcile` and the other subcommands of the
//! contract, each a thin call into the library.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use flashgate::reload::ConfigSource;
use flashgate::server::Listeners;
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
    /// a change of the file) reloads the configuration; SIGQUIT hands the listeners to a new
    /// binary started with `--upgrade`, then drains.
    Serve {
        /// The configuration file (YAML; see docs/configuration.md).
        #[arg(long)]
        config: PathBuf,
        /// Take the listening sockets over from the gateway running with this configuration
        /// (zero-downtime binary upgrade): start this, then send the old process SIGQUIT
        /// within about 6 s; without one to take over from, exits with status 1.
        #[arg(long)]
        upgrade: bool,
    },
    /// Validate a configuration file: exit 0 if valid, else name the offending key. Needs no
    /// secrets (unset ones are named as warnings).
    Check {
        /// The configuration file (YAML; see docs/configuration.md).
        #[arg(long)]
        config: PathBuf,
        /// Also read Redis and refuse what a reload would refuse against its record (an older
        /// version, a stock change under the same version, a changed segment count).
        #[arg(long)]
        live: bool,
    },
    /// Print the configuration file's JSON Schema (draft 2020-12), generated from the types the
    /// gateway parses it with: point an editor's YAML language server at it
    /// (`# yaml-language-server: $schema=flashgate.schema.json`) to see a typo as it is typed.
    Schema,
    /// Print the stock ledger per activity and version; exit 1 on any drift. Needs only the
    /// configuration file and Redis, not the gateway's secrets.
    Reconcile {
        /// The configuration file (YAML; see docs/configuration.md).
        #[arg(long)]
        config: PathBuf,
        /// Only this activity.
        #[arg(long)]
        activity: Option<String>,
        /// Compare the backend's orders with Redis instead: a file of the reservation ids
        /// (`jti`) the backend kept for `--activity`, one per line. Exit 1 if any is unknown
        /// to Redis or was released after the sale (its unit would be sold again).
        #[arg(long, requires = "activity")]
        orders: Option<PathBuf>,
        /// With --orders: confirm the backend's orders still pending in Redis, so that they
        /// are not sold again when their hold runs out (after a gateway died before confirming).
        #[arg(long, requires = "orders")]
        confirm_pending: bool,
    },
    /// The story of one activity's sale from what Redis holds of it (during the sale or after
    /// it, until its keys expire): when it opened, first sold and sold out; units sold,
    /// released, pending and restocked; buyers queued, admitted, bought and no-shows; waits;
    /// challenges; the draw; per variant. Needs only the configuration file and Redis.
    Report {
        /// The configuration file (YAML; see docs/configuration.md).
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        activity: String,
        /// Print the figures as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also write a self-contained page with charts (opens without a network) to FILE.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Also count refusals by code over the sale from this Prometheus
        /// (`http://host:port`).
        #[arg(long, value_name = "URL")]
        prometheus: Option<String>,
        /// The page's language.
        #[arg(long, value_enum, default_value = "en")]
        lang: flashgate::report::html::Lang,
    },
    /// Load, show or drop an access list of a sale in phases (`phases[].who.list`): user ids
    /// in Redis, read by every gateway. Exit 2 on a bad configuration, an unknown activity or
    /// list, or a bad file; 3 if Redis cannot be reached.
    Access {
        #[command(subcommand)]
        action: AccessCommand,
    },
    /// Check an activity's pre-queue draw: recompute every drawn place from the seed and the
    /// recorded arrivals, check the seed against its commitment and the places the gateways
    /// admitted tickets at; print `match` (exit 0) or what differs (exit 1).
    Draw {
        /// The configuration file (YAML; see docs/configuration.md).
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        activity: String,
    },
}

#[derive(Subcommand)]
enum AccessCommand {
    /// Add the user ids of FILE (one a line) to the list; ids already there stay.
    Load {
        #[command(flatten)]
        list: ListArgs,
        /// One user id a line.
        file: PathBuf,
    },
    /// How many user ids the list holds, and some of them.
    Show {
        #[command(flatten)]
        list: ListArgs,
    },
    /// Remove the list: its phase admits nobody by it from then on (within 2 s on every
    /// gateway).
    Drop {
        #[command(flatten)]
        list: ListArgs,
    },
}

#[derive(clap::Args)]
struct ListArgs {
    /// The configuration file (YAML; see docs/configuration.md).
    #[arg(long)]
    config: PathBuf,
    #[arg(long)]
    activity: String,
    /// The list's name, as a phase names it (`who: {list: NAME}`).
    #[arg(long)]
    list: String,
}

/// Exit codes beyond success.
const EXIT_DRIFT: u8 = 1;
const EXIT_CONFIG: u8 = 2;
const EXIT_STORE: u8 = 3;

#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// mimalloc, not glibc's malloc: memory freed on another thread than the one that allocated it
/// (Pingora's tasks move between workers) made glibc's arena locks a fifth of the gateway's CPU.
/// Measured with glibc, jemalloc and mimalloc in one run (BENCHMARKS.md): mimalloc
/// spends the least CPU per winner. The `dhat-heap` build counts with dhat's allocator instead.
#[cfg(not(feature = "dhat-heap"))]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Counting only: the profile is never written (the process may end without unwinding).
    #[cfg(feature = "dhat-heap")]
    std::mem::forget(dhat::Profiler::builder().testing().build());
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config, live } => check(&config, live),
        Command::Schema => {
            print!("{}", flashgate::config::schema::json_schema_text());
            ExitCode::SUCCESS
        }
        Command::Reconcile {
            config,
            activity,
            orders,
            confirm_pending,
        } => {
            let settings = match Settings::load_without_secrets(&config) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            if let (Some(orders), Some(activity)) = (orders, activity.as_deref()) {
                return reconcile_orders(settings, activity, &orders, confirm_pending);
            }
            let report = flashgate::reconcile::run_cli(settings, activity.as_deref())
                .map(|r| (r.table(), r.clean()));
            reconcile_exit(report, "clean", "DRIFT")
        }
        Command::Draw { config, activity } => draw(&config, &activity),
        Command::Access { action } => access(action),
        Command::Report {
            config,
            activity,
            json,
            html,
            prometheus,
            lang,
        } => report(&config, activity, json, html.as_deref(), prometheus, lang),
        Command::Serve { config, upgrade } => {
            let (settings, source) = match ConfigSource::load(&config) {
                Ok(loaded) => loaded,
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            let _log_guard = flashgate::logging::init();
            let listeners = if upgrade {
                Listeners::TakeOver
            } else {
                Listeners::Bind
            };
            match flashgate::server::run(settings, Some(source), listeners, Default::default()) {
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

/// `flashgate check`: the file validated without secrets (unset ones named as warnings), then,
/// with `live`, judged against Redis's record as a reload would judge it.
fn check(config: &std::path::Path, live: bool) -> ExitCode {
    let (settings, missing) = match Settings::load_for_check(config) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    for name in missing {
        eprintln!(
            "warning: {name} is not set here: checked with a placeholder; the \
             gateway will not start without it"
        );
    }
    if let Some(open) = settings.identity.spoofable(&settings.server.listen) {
        eprintln!("warning: {open} (identity.header_from_any_peer: true)");
    }
    if live {
        match flashgate::live_check::run_cli(&settings) {
            Ok(verdict) if verdict.refused.is_empty() => {
                for note in &verdict.warnings {
                    eprintln!("warning: {note}");
                }
            }
            Ok(verdict) => {
                for e in &verdict.refused {
                    eprintln!("{}: refused by Redis's record: {e}", config.display());
                }
                return ExitCode::from(EXIT_CONFIG);
            }
            Err(e) => {
                eprintln!("{}: cannot read Redis: {e}", config.display());
                return ExitCode::from(EXIT_STORE);
            }
        }
    }
    println!(
        "{}: valid{} ({} activities, {} sale routes, grace period {} s)",
        config.display(),
        if live { ", and agrees with Redis" } else { "" },
        settings.activities.len(),
        settings.sale_routes.len(),
        settings.server.grace_period.as_secs()
    );
    ExitCode::SUCCESS
}

fn reconcile_orders(
    settings: Settings,
    activity: &str,
    orders: &std::path::Path,
    confirm_pending: bool,
) -> ExitCode {
    let text = match std::fs::read_to_string(orders) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", orders.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let report = flashgate::reconcile::run_orders_cli(settings, activity, &text, confirm_pending)
        .map(|r| (r.table(), r.clean()));
    reconcile_exit(report, "orders clean", "ORDERS DRIFT")
}

/// Writes `text` to stdout; a reader that went away (`flashgate reconcile | head`) ends the
/// output quietly instead of a panic (the exit code still says clean or not).
fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// `flashgate access`: loads, shows or drops an access list.
fn access(command: AccessCommand) -> ExitCode {
    use flashgate::access::{AccessError, Action};
    let (args, action) = match command {
        AccessCommand::Load { list, file } => match std::fs::read_to_string(&file) {
            Ok(text) => (list, Action::Load(text)),
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        AccessCommand::Show { list } => (list, Action::Show),
        AccessCommand::Drop { list } => (list, Action::Drop),
    };
    let settings = match Settings::load_without_secrets(&args.config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", args.config.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match flashgate::access::run_cli(&settings, &args.activity, &args.list, action) {
        Ok(text) => {
            emit(&text);
            ExitCode::SUCCESS
        }
        Err(AccessError::Store(e)) => {
            eprintln!("access: cannot reach Redis: {e}");
            ExitCode::from(EXIT_STORE)
        }
        Err(e) => {
            eprintln!("access: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// `flashgate draw`: prints the report, then `match` (exit 0) or `differ` (exit 1).
fn draw(config: &std::path::Path, activity: &str) -> ExitCode {
    let settings = match Settings::load_without_secrets(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match flashgate::reconcile::draw_cli(settings, activity) {
        Ok(audit) if audit.matches() => {
            emit(&format!("{}match\n", audit.report()));
            ExitCode::SUCCESS
        }
        Ok(audit) => {
            emit(&format!("{}differ\n", audit.report()));
            ExitCode::from(EXIT_DRIFT)
        }
        Err(e) => {
            eprintln!("draw: {e}");
            match e {
                flashgate::reconcile::ReconcileError::UnknownActivity(_) => {
                    ExitCode::from(EXIT_CONFIG)
                }
                _ => ExitCode::from(EXIT_STORE),
            }
        }
    }
}

/// `flashgate report`: the figures as text or JSON, and the page if asked.
fn report(
    config: &std::path::Path,
    activity: String,
    json: bool,
    html: Option<&std::path::Path>,
    prometheus: Option<String>,
    lang: flashgate::report::html::Lang,
) -> ExitCode {
    use flashgate::reconcile::ReconcileError;
    let settings = match Settings::load_without_secrets(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let shop = settings.pages.shop_name.clone();
    let ask = flashgate::report::Ask {
        activity,
        prometheus,
    };
    let report = match flashgate::report::run_cli(settings, &ask) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("report: {e}");
            return match e {
                ReconcileError::UnknownActivity(_) => ExitCode::from(EXIT_CONFIG),
                _ => ExitCode::from(EXIT_STORE),
            };
        }
    };
    if let Some(path) = html {
        let page = flashgate::report::html::page(&report, lang, &shop);
        if let Err(e) = std::fs::write(path, page) {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    }
    if json {
        emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report.story).expect("the story serialises")
        ));
    } else {
        emit(&flashgate::report::text(&report.story));
    }
    ExitCode::SUCCESS
}

/// Prints a reconcile report (its table and whether it is clean) and maps it, or the error
/// that stopped it, to the exit code.
fn reconcile_exit(
    report: Result<(String, bool), flashgate::reconcile::ReconcileError>,
    clean: &str,
    drift: &str,
) -> ExitCode {
    use flashgate::reconcile::ReconcileError;
    match report {
        Ok((table, true)) => {
            emit(&format!("{table}reconcile: {clean}\n"));
            ExitCode::SUCCESS
        }
        Ok((table, false)) => {
            emit(&format!("{table}reconcile: {drift}\n"));
            ExitCode::from(EXIT_DRIFT)
        }
        Err(e) => {
            eprintln!("reconcile: {e}");
            match e {
                ReconcileError::UnknownActivity(_) => ExitCode::from(EXIT_CONFIG),
                ReconcileError::Store(_)
                | ReconcileError::Busy(_)
                | ReconcileError::Refused(_)
                | ReconcileError::Prometheus(_) => ExitCode::from(EXIT_STORE),
            }
        }
    }
}
