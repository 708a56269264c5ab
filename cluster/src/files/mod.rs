//! Files across nodes: each file on R nodes chosen by rendezvous hashing over the live
//! nodes of the `files` service, recorded in etcd once every replica verified it, read
//! back from any replica with its digest checked, and copied anew when one of its nodes
//! has been gone longer than a grace period (or, with a scrub, was found without the
//! recorded bytes).
//!
//! The parts, one job each:
//! - [`plan`]: the rules (placement, fallbacks, fetch order, when to repair, when to
//!   wait after a failure, which replicas a scrub asks about), plain and unit tested,
//!   no I/O and no clock;
//! - [`catalog`]: the records in etcd (create-if-absent, locks, fenced updates);
//! - [`ClusterFiles`]: the driver that carries out the plans through a
//!   [`FileTransfer`] (the `files` service over RDMA with the `rdmactor` feature, a
//!   fake in tests);
//! - [`FileTransfer`]: what the driver needs of one node (upload, fetch bounded by a
//!   size, stat), with the answers the rules act on typed ([`TransferError`]);
//! - `rdma` (feature `rdmactor`): [`FileTransfer`] over `rdmactor-services`' files
//!   client: verified uploads and fetches, SHA-256.
//!
//! Layout: `/rdmactor/<cluster>/files/<name>` holds a JSON [`FileRecord`];
//! `/rdmactor/<cluster>/locks/files/<name>` is the name's repair lock.

pub mod catalog;
mod driver;
pub mod plan;
#[cfg(feature = "rdmactor")]
mod rdma;
mod record;
#[cfg(feature = "rdmactor")]
mod recorder;
mod transfer;

pub use catalog::{AddedCopy, Catalog, Created, Removed, RepairLock, Stored};
pub use driver::{
    CleanupReport, ClusterFiles, Deleted, Fetched, FilesError, RepairReport, ScrubReport, Staging,
    FILES_SERVICE,
};
pub use plan::{
    Backoff, Collector, FailureKind, Forget, Found, PlacementError, Repair, RepairPlanner, Scrub,
    UploadPlan, Verified,
};
#[cfg(feature = "rdmactor")]
pub use rdma::RdmaFiles;
pub use record::{file_key, files_prefix, repair_lock, FileRecord};
#[cfg(feature = "rdmactor")]
pub use recorder::CatalogRecorder;
pub use transfer::{FileTransfer, TransferError, Upload};
