//! End-to-end tests on the real test bed: two kube-apiservers with etcd, and a real S3 server.
//! Run through `scripts/test`, which starts the test bed and exports its environment.

mod backup;
mod bed;
mod chart;
mod cli;
mod controller;
mod fleet;
mod journal;
mod metrics;
mod moving;
mod operator;
mod plugin;
mod proxy;
mod readonly;
mod restore;
mod s3;
mod tls;
