//! `restatus`: the command line. Thin: parse arguments, call the library, print, exit.

mod cli;

use std::process::ExitCode;

use cli::{Cli, Command};
use restatus::telemetry::LogFormat;

#[tokio::main]
async fn main() -> ExitCode {
    let cli: Cli = match cli::plugin::try_parse() {
        Ok(cli) => cli,
        Err(e) => return cli::usage_error(e),
    };
    let log_format = cli.global.log_format;
    restatus::telemetry::init(log_format);
    // Exit codes (README, `--help`): 2 for a usage error (above); preflight 0 ready, 1 not ready,
    // 2 could not check; backup 3 when the snapshot written is marked inconsistent; everything
    // else 0 or 1.
    let failure = if matches!(cli.command, Command::Preflight(_)) { 2 } else { 1 };
    match cli::commands::run(cli.global, cli.command).await {
        Ok(code) => code,
        Err(e) => {
            // Printed once: a JSON log line with `--log-format json` (stderr stays pure JSON),
            // a plain `error:` line otherwise.
            match log_format {
                LogFormat::Json => tracing::error!(error = %format!("{e:#}"), "command failed"),
                LogFormat::Plain => eprintln!("error: {e:#}"),
            }
            ExitCode::from(failure)
        }
    }
}
