//! Records the git commit of the build for `restatus --version`: `git rev-parse --short HEAD`
//! when the sources are a git checkout, else `RESTATUS_GIT_COMMIT` (e.g. set by an image build
//! from a tarball), else "unknown". Reruns when HEAD or the branch it names moves.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RESTATUS_GIT_COMMIT");
    // Only this package's own checkout: a tarball unpacked inside another repository must not
    // take that repository's commit.
    let own = std::env::var("CARGO_MANIFEST_DIR").ok().and_then(|dir| std::fs::canonicalize(dir).ok());
    let top = git(&["rev-parse", "--show-toplevel"]).and_then(|top| std::fs::canonicalize(top).ok());
    let commit = if own.is_some() && own == top { git(&["rev-parse", "--short", "HEAD"]) } else { None };
    if commit.is_some() {
        // HEAD itself (a checkout of another branch), the branch's ref (a commit on it), and
        // packed-refs (where a ref lands after `git gc`). Only existing paths: a missing one
        // would rerun this script at every build.
        let mut paths = vec![git(&["rev-parse", "--git-path", "HEAD"])];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            paths.push(git(&["rev-parse", "--git-path", &branch]));
        }
        paths.push(git(&["rev-parse", "--git-path", "packed-refs"]));
        for path in paths.into_iter().flatten().map(PathBuf::from).filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let commit = commit
        .or_else(|| std::env::var("RESTATUS_GIT_COMMIT").ok().filter(|c| !c.trim().is_empty()))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RESTATUS_GIT_COMMIT={commit}");
    // The compiler's version, for the `restatus_build_info` metric (cargo sets RUSTC here).
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RESTATUS_RUSTC_VERSION={rustc}");
}
