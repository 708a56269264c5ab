//! A replicated file's entry in etcd: `name -> (digest, size, nodes)`, written once the
//! last replica answered GOOD.

use serde::{Deserialize, Serialize};

use crate::record::ROOT;
use crate::Error;

/// What the catalog holds for one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// The digest's algorithm (`sha256`, what the files service verifies with).
    pub alg: String,
    /// The digest every replica verified, lowercase hex.
    pub digest: String,
    /// Bytes.
    pub size: u64,
    /// The node ids holding a verified replica, in rendezvous order when placed.
    pub nodes: Vec<String>,
    /// The identity that uploaded the file first, if it proved one (issue 46); the
    /// same bytes uploaded by another identity add a replica and keep this owner.
    /// Absent in records written before owners were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// `/rdmactor/<cluster>/files/`: every file of a cluster.
pub fn files_prefix(cluster: &str) -> String {
    format!("{ROOT}/{cluster}/files/")
}

/// The key of the file `name`.
pub fn file_key(cluster: &str, name: &str) -> String {
    format!("{}{name}", files_prefix(cluster))
}

/// The etcd lock (its name) that whoever repairs `name` holds.
pub fn repair_lock(cluster: &str, name: &str) -> String {
    format!("{ROOT}/{cluster}/locks/files/{name}")
}

impl FileRecord {
    /// The JSON stored in etcd (readable with `etcdctl get`).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always serializes")
    }

    /// Reads a stored value; `key` names it in the error.
    pub fn from_json(key: &str, value: &[u8]) -> Result<FileRecord, Error> {
        serde_json::from_slice(value).map_err(|e| Error::BadRecord {
            key: key.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Whether `other` describes the same bytes (digest, algorithm and size).
    pub fn same_bytes(&self, other: &FileRecord) -> bool {
        self.alg == other.alg && self.digest == other.digest && self.size == other.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_json() {
        assert_eq!(file_key("c", "f.bin"), "/rdmactor/c/files/f.bin");
        assert!(file_key("c", "f").starts_with(&files_prefix("c")));
        assert!(!repair_lock("c", "f").starts_with(&files_prefix("c")));
        let r = FileRecord {
            alg: "sha256".into(),
            digest: "ab".into(),
            size: 3,
            nodes: vec!["a".into(), "b".into()],
            owner: None,
        };
        assert_eq!(FileRecord::from_json("k", &r.to_json()).unwrap(), r);
        let mut other = r.clone();
        other.nodes.reverse();
        assert!(r.same_bytes(&other));
        other.size = 4;
        assert!(!r.same_bytes(&other));
        assert!(FileRecord::from_json("/k", b"[]")
            .unwrap_err()
            .to_string()
            .contains("/k"));
    }
}
