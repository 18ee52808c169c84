//! `restatus`: the command line. Thin: parse arguments, call the library, print, exit.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    restatus::telemetry::init(cli.global.log_format);
    // preflight: 0 ready, 1 not ready, 2 could not check; everything else: 0 or 1.
    let failure = if matches!(cli.command, Command::Preflight(_)) { 2 } else { 1 };
    match cli::commands::run(cli.global, cli.command).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::from(failure)
        }
    }
}
