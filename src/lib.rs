//! restatus keeps the `status` of Kubernetes objects safe across cluster moves and disasters.
//!
//! Layers, top to bottom (a module imports only from layers below it; see
//! `docs/ARCHITECTURE.md`):
//!
//! * flows: [`controller`] (watch-driven restore) on [`moving`] (preflight, move handshake)
//!   on [`backup`] (capture → encode → store, schedule), [`restore`] (choose → per kind:
//!   list keys, then plan and apply page by page → check pairing) and [`journal`] (watch →
//!   segments of status changes chained to the newest snapshot);
//! * shared by the flows: [`metrics`] (the bucket's newest snapshot, OpenMetrics text, the one
//!   HTTP server of the long-running modes);
//! * edges: [`k8s`] (clients, the pager, watches, writes, events, leader election, the writes'
//!   adaptive limit: a pure limiter and its gate) and [`store`] (object store backends, snapshots
//!   read verified and written create-only, snapshot choice, journal segments, retention,
//!   cluster ids);
//! * pure: [`domain`] (raw objects, profiles, annotations, pairing, capture verdicts, live
//!   objects, status diffs, snapshot comparison) on [`format`] (identity keys, records,
//!   manifest, payload and its spill to disk, signatures, encryption, journal segments);
//! * support: [`error`], [`progress`], [`telemetry`].
//!
//! `tests/layers.rs` checks these layers against the code.
//!
//! `fleet` (feature `fleet`) makes sample fleets for the demo, tests and benchmarks; the
//! `restatus` binary is built without it.

pub mod backup;
pub mod controller;
pub mod domain;
pub mod error;
#[cfg(feature = "fleet")]
pub mod fleet;
pub mod format;
pub mod journal;
pub mod k8s;
pub mod metrics;
pub mod moving;
pub mod progress;
pub mod restore;
pub mod store;
pub mod telemetry;

/// The builders tests share (feature `test-support`); not restatus's API.
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub mod fixtures;

pub use error::{Error, Result};

/// The name restatus writes under (field manager, tool name in manifests).
pub const TOOL_NAME: &str = "restatus";
/// The version of this build, recorded in every manifest.
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");
