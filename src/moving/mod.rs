//! Moving a cluster with `clusterctl move`: [`preflight`] tells whether a move is safe now,
//! [`handshake`] holds clusterctl until a final consistent snapshot exists. Both read the
//! Cluster API objects through one view, [`cluster`].

pub mod cluster;
pub mod handshake;
pub mod preflight;
