//! Kubernetes clients: from an explicit kubeconfig file (tests use two clusters at once) or
//! inferred the usual way (`KUBECONFIG`, `~/.kube/config`, in-cluster service account).

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::domain::identity::Profile;
use crate::{Error, Result};

pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<kube::Client> {
    let options = KubeConfigOptions { context: context.map(str::to_string), ..Default::default() };
    let mut config = match kubeconfig {
        Some(path) => {
            let err = |reason: String| Error::Kubeconfig { path: path.to_path_buf(), reason };
            let file = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &options).await.map_err(|e| err(e.to_string()))?
        }
        None => match context {
            None => kube::Config::infer()
                .await
                .map_err(|e| Error::Kubeconfig { path: "(inferred)".into(), reason: e.to_string() })?,
            Some(_) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| Error::Kubeconfig { path: "(default)".into(), reason: e.to_string() })?,
        },
    };
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(60));
    kube::Client::try_from(config).map_err(|e| Error::kube("build client", e))
}

/// What every command that talks to a cluster starts from: its profile and a client.
pub async fn connect(
    profile: &str,
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<(Profile, kube::Client)> {
    let profile = Profile::load(profile)?;
    Ok((profile, client(kubeconfig, context).await?))
}
