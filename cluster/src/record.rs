//! The registry's layout in etcd: one key per (service, node), a JSON value.
//!
//! ```text
//! /rdmactor/<cluster>/services/<service>/<node-id>  →  {"node":"a","service":"echo",
//!     "addr":"192.0.2.1:7471","version":"0.1.0","draining":false,
//!     "load":{"connections":12,"pool_bytes":8388608,"pool_max_bytes":1073741824}}
//! ```
//!
//! Service first, node last: a client of one service reads and watches one prefix
//! (`/rdmactor/<cluster>/services/<service>/`), whatever else the nodes serve. Every key
//! of a node is attached to the node's lease, so all of them go when the lease does.
//! JSON, not postcard: `etcdctl get --prefix /rdmactor/` shows the registry as it is, and
//! a field added later is ignored by older readers (unknown fields are skipped).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The first part of every key.
pub const ROOT: &str = "/rdmactor";

/// What a node reports about how busy it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    /// Connections open now (every service of the node together).
    pub connections: u64,
    /// Registered memory in use now, in bytes.
    pub pool_bytes: u64,
    /// The registered-memory cap, in bytes (0: unknown).
    pub pool_max_bytes: u64,
}

impl Load {
    /// The share of the pool in use, 0 to 1 (0 when the cap is unknown).
    pub fn pool_use(&self) -> f64 {
        if self.pool_max_bytes == 0 {
            0.0
        } else {
            self.pool_bytes as f64 / self.pool_max_bytes as f64
        }
    }
}

/// The value stored under a node's key for one service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's id (also the key's last part).
    pub node: String,
    /// The service (also in the key).
    pub service: String,
    /// Where clients connect (the server's `--advertise`).
    pub addr: SocketAddr,
    /// The server's software version.
    pub version: String,
    /// The node is shutting down: clients pick another for new connections.
    #[serde(default)]
    pub draining: bool,
    /// How busy the node is, as of its last report.
    #[serde(default)]
    pub load: Load,
}

/// `/rdmactor/<cluster>/services/`: every service of a cluster.
pub fn cluster_prefix(cluster: &str) -> String {
    format!("{ROOT}/{cluster}/services/")
}

/// `/rdmactor/<cluster>/services/<service>/`: every node serving `service`.
pub fn service_prefix(cluster: &str, service: &str) -> String {
    format!("{ROOT}/{cluster}/services/{service}/")
}

/// The key of `node` serving `service`.
pub fn node_key(cluster: &str, service: &str, node: &str) -> String {
    format!("{ROOT}/{cluster}/services/{service}/{node}")
}

/// Checks a cluster, service or node name: non-empty, no `/` (it would shift the key's
/// parts), no control characters.
pub fn check_name(what: &'static str, name: &str) -> Result<(), Error> {
    let bad = if name.is_empty() {
        Some("is empty")
    } else if name.contains('/') {
        Some("contains '/'")
    } else if name.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    };
    match bad {
        Some(why) => Err(Error::InvalidName {
            what,
            name: name.to_owned(),
            why,
        }),
        None => Ok(()),
    }
}

impl NodeRecord {
    /// The JSON stored in etcd.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always serializes")
    }

    /// Reads a stored value; `key` names it in the error.
    pub fn from_json(key: &str, value: &[u8]) -> Result<NodeRecord, Error> {
        serde_json::from_slice(value).map_err(|e| Error::BadRecord {
            key: key.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// The record the unit tests of the crate's modules list: node `node` of `echo` at
/// 192.0.2.1:7471, with `connections` reported.
#[cfg(test)]
pub(crate) fn test_record(node: &str, draining: bool, connections: u64) -> NodeRecord {
    NodeRecord {
        node: node.into(),
        service: "echo".into(),
        addr: "192.0.2.1:7471".parse().unwrap(),
        version: "0".into(),
        draining,
        load: Load {
            connections,
            ..Load::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(cluster_prefix("c1"), "/rdmactor/c1/services/");
        assert_eq!(service_prefix("c1", "echo"), "/rdmactor/c1/services/echo/");
        assert_eq!(
            node_key("c1", "echo", "a:7471"),
            "/rdmactor/c1/services/echo/a:7471"
        );
        assert!(node_key("c1", "echo", "a").starts_with(&service_prefix("c1", "echo")));
    }

    #[test]
    fn names_cannot_shift_the_key() {
        assert!(check_name("node", "192.0.2.1:7471").is_ok());
        for bad in ["", "a/b", "a\nb"] {
            let err = check_name("node", bad).unwrap_err();
            assert!(err.to_string().contains("node"), "{err}");
        }
    }

    #[test]
    fn json_round_trip_and_old_readers() {
        let record = NodeRecord {
            node: "a".into(),
            service: "echo".into(),
            addr: "192.0.2.1:7471".parse().unwrap(),
            version: "0.1.0".into(),
            draining: true,
            load: Load {
                connections: 3,
                pool_bytes: 1 << 20,
                pool_max_bytes: 1 << 30,
            },
        };
        let json = record.to_json();
        assert_eq!(NodeRecord::from_json("k", &json).unwrap(), record);
        // A newer writer's extra field is ignored; missing optional fields default.
        let newer =
            br#"{"node":"a","service":"echo","addr":"192.0.2.1:7471","version":"9","zone":"x"}"#;
        let read = NodeRecord::from_json("k", newer).unwrap();
        assert!(!read.draining);
        assert_eq!(read.load, Load::default());
        let err = NodeRecord::from_json("/k", b"{").unwrap_err();
        assert!(err.to_string().contains("/k"), "{err}");
    }
}
