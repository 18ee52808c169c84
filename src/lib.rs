//! restatus keeps the `status` of Kubernetes objects safe across cluster moves and disasters.
//!
//! The backup pipeline reads top-down through the modules:
//!
//! * [`capture`]: list each kind of the [`identity::Profile`] page by page (Kubernetes edge);
//! * [`object`] and [`identity`]: view a raw object and derive its UID-independent keys (pure);
//! * [`format`]: turn objects into [`format::Record`]s, stream them through zstd and sha256,
//!   and describe the snapshot in a [`format::Manifest`] (pure);
//! * [`store`]: lay payload and manifest out in an object store, manifest last (object-store edge);
//! * [`backup`]: the pipeline that ties these together;
//! * [`retention`] and [`schedule`]: which snapshots to delete, and when to take the next one (pure).
//!
//! The restore pipeline: [`restore`] chooses and verifies a snapshot (load → verify), [`plan`]
//! decides per object (pure), [`apply`] writes (Kubernetes edge); [`pairing`] checks the result.
//! [`controller`] runs the same plan per watch event, with [`leader`] election and [`metrics`].

pub mod apply;
pub mod backup;
pub mod capture;
pub mod controller;
pub mod error;
pub mod fleet;
pub mod format;
pub mod handshake;
pub mod identity;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod object;
pub mod output;
pub mod pairing;
pub mod plan;
pub mod preflight;
pub mod restore;
pub mod retention;
pub mod schedule;
pub mod store;
pub mod telemetry;

pub use error::{Error, Result};

/// The name restatus writes under (field manager, tool name in manifests).
pub const TOOL_NAME: &str = "restatus";
/// The version of this build, recorded in every manifest.
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");
