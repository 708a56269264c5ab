//! `--cluster NAME --etcd URL[,URL..]`: the tools' way into a cluster of servers
//! registered in etcd (the `rdmactor-cluster` crate). Without `--cluster` a tool touches
//! no etcd at all.

use anyhow::{Context as _, Result};
use rdmactor_cluster::EtcdConfig;

/// The flags, flattened into a tool's own.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// The cluster to register in (server) or to find servers in (clients), by name.
    #[arg(long, requires = "etcd", value_name = "NAME")]
    pub cluster: Option<String>,
    /// etcd's client URLs, comma-separated (`http://10.0.0.1:2379,http://10.0.0.2:2379`).
    #[arg(long, requires = "cluster", value_name = "URL[,URL..]")]
    pub etcd: Option<String>,
}

impl ClusterArgs {
    /// The cluster's name and how to reach etcd, if `--cluster` was given.
    pub fn etcd(&self) -> Result<Option<(String, EtcdConfig)>> {
        let (Some(cluster), Some(etcd)) = (&self.cluster, &self.etcd) else {
            return Ok(None);
        };
        let config = EtcdConfig::parse(etcd).with_context(|| format!("--etcd {etcd:?}"))?;
        Ok(Some((cluster.clone(), config)))
    }
}
