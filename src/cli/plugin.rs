//! `kubectl restatus …`: the same binary, installed as `kubectl-restatus` (a link or a copy
//! on `PATH`, as the release archives and the krew manifest install it). kubectl runs it with
//! the arguments after `restatus`; only the name in help and errors changes.

use std::ffi::OsStr;
use std::path::Path;

use clap::{CommandFactory, FromArgMatches};

use super::Cli;

/// The file name kubectl looks for on `PATH` for `kubectl restatus`.
pub const PLUGIN_FILE: &str = "kubectl-restatus";

/// Parses the command line, naming the command as it was called: `kubectl restatus` when the
/// binary runs as the kubectl plugin, `restatus` otherwise. A usage error (and `--help`,
/// `--version`) is returned for [`super::usage_error`] to print.
pub fn try_parse() -> Result<Cli, clap::Error> {
    let called = std::env::args_os().next();
    let mut command = Cli::command();
    if called.as_deref().is_some_and(is_plugin) {
        command = command.bin_name("kubectl restatus").display_name("kubectl restatus");
    }
    let matches = command.try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

/// Whether `argv[0]` is the plugin's file (any directory; `.exe` on Windows).
fn is_plugin(argv0: &OsStr) -> bool {
    Path::new(argv0).file_stem().is_some_and(|stem| stem == PLUGIN_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_is_known_by_its_file_name_wherever_it_lies() {
        for plugin in ["kubectl-restatus", "/usr/local/bin/kubectl-restatus", "./kubectl-restatus.exe"] {
            assert!(is_plugin(OsStr::new(plugin)), "{plugin}");
        }
        for other in ["restatus", "/usr/bin/restatus", "kubectl-restatus-old", "kubectl"] {
            assert!(!is_plugin(OsStr::new(other)), "{other}");
        }
    }
}
