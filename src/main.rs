//! `restatus`: the command line. Thin: parse arguments, call the library, print, exit.

mod cli;

use std::process::ExitCode;

use cli::{Cli, Command};
use restatus::telemetry::LogFormat;

fn main() -> ExitCode {
    keep_large_buffers_apart();
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// glibc's malloc raises its mmap threshold to the size of each large block freed (up to
/// 32 MiB). Past the first LIST page, a page's body (megabytes) then comes from the heap
/// instead of its own mapping, and the holes it leaves grow with the run: a dry run over 40k
/// Servers peaked at 50 MiB with the threshold moving and at 40 MiB with it fixed, and its
/// growth from 10k to 40k halved (BENCHMARKS.md). Fixed at glibc's default of 128 KiB, large
/// short-lived buffers go back to the system when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_large_buffers_apart() {
    // SAFETY: mallopt sets one of malloc's parameters; no thread runs yet, nothing is borrowed.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_large_buffers_apart() {}

async fn run() -> ExitCode {
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
                LogFormat::Json => tracing::error!(error = %chain(&e), "command failed"),
                LogFormat::Plain => eprintln!("error: {}", chain(&e)),
            }
            ExitCode::from(failure)
        }
    }
}

/// An error and its causes, as `{:#}` prints them, each once: a cause whose text the message
/// so far already ends with (a library error that prints its source, then names it as its
/// source) is not repeated.
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("Kubernetes API: build client: {source}")]
    struct Prints {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_ends_with_is_printed_once() {
        let inner = std::io::Error::other("configured proxy refused");
        let e = anyhow::Error::new(Prints { source: inner }).context("restore");
        assert_eq!(chain(&e), "restore: Kubernetes API: build client: configured proxy refused");
        let plain = anyhow::anyhow!("no snapshot").context("restore");
        assert_eq!(chain(&plain), "restore: no snapshot");
    }
}
