//! Moving a cluster with `clusterctl move`: [`preflight`] tells whether a move is safe now,
//! [`handshake`] holds clusterctl until a final consistent snapshot exists. Both read the
//! Cluster API objects through one view, [`cluster`]; preflight reads the profile's objects
//! through [`live`].

pub mod cluster;
pub mod discover;
pub mod graph;
pub mod handshake;
pub mod live;
pub mod preflight;
