//! Scrub rounds: the listed replicas [`RepairPlanner::poll_scrubs`] names are asked
//! what they hold (the files service's `Stat`: a message, and a read of the file on the
//! node unless it knows its digest; each node's questions on one connection, the nodes
//! at once), and the answers go back to the planner, whose next
//! [`poll_repairs`](RepairPlanner::poll_repairs) replaces the nodes found without the
//! recorded bytes.

use std::net::SocketAddr;
use std::time::Instant;

use futures::future::join_all;

use super::{holds, other_bytes, ClusterFiles, FilesError};
use crate::files::plan::{Found, RepairPlanner};
use crate::files::transfer::{FileTransfer, TransferError};

/// What one scrub round found.
#[derive(Debug, Default)]
pub struct ScrubReport {
    /// Replicas asked about.
    pub asked: usize,
    /// Listed replicas without the recorded bytes: the file, the node, and what it
    /// holds instead. The next repair round replaces them.
    pub lost: Vec<(String, String, String)>,
    /// Replicas that could not be asked, and why (left to the next period).
    pub unanswered: Vec<(String, String, String)>,
}

impl<T: FileTransfer> ClusterFiles<T> {
    /// One scrub round: tells `planner` the live nodes, asks the replicas it names
    /// what they hold, and tells it the answers.
    ///
    /// # Errors
    ///
    /// The catalog cannot be listed. A node that cannot be asked is reported, not an
    /// error.
    pub async fn scrub(
        &self,
        planner: &mut RepairPlanner,
        now: Instant,
    ) -> Result<ScrubReport, FilesError> {
        let (live, files) = self.round(planner).await?;
        let mut report = ScrubReport::default();
        // The questions by node: each node answers its batch on one connection, and
        // the nodes answer at the same time.
        let mut batches: Vec<(String, SocketAddr, Vec<String>)> = Vec::new();
        for scrub in planner.poll_scrubs(now, &files) {
            for node in scrub.nodes {
                let Some(info) = live.iter().find(|n| n.node == node) else {
                    continue;
                };
                match batches.iter_mut().find(|(n, ..)| *n == node) {
                    Some((_, _, names)) => names.push(scrub.name.clone()),
                    None => batches.push((node, info.record.addr, vec![scrub.name.clone()])),
                }
            }
        }
        let answers = join_all(
            batches
                .iter()
                .map(|(_, addr, names)| self.transfer.stat_many(*addr, names)),
        )
        .await;
        for ((node, _, names), answers) in batches.into_iter().zip(answers) {
            for (name, answer) in names.into_iter().zip(answers) {
                let Some((_, record)) = files.iter().find(|(n, _)| *n == name) else {
                    continue;
                };
                report.asked += 1;
                let (found, why) = match answer {
                    Ok(held) if holds(record, &held) => (Found::Recorded, String::new()),
                    Ok(held) => (Found::OtherBytes, other_bytes(&held, record)),
                    Err(TransferError::NotFound) => (Found::Missing, "no such file".to_owned()),
                    Err(e) => {
                        report.unanswered.push((name, node.clone(), e.to_string()));
                        continue;
                    }
                };
                planner.handle_scrubbed(&name, &node, found);
                if found != Found::Recorded {
                    tracing::warn!(name = %name, %node, %why, "cluster files: a listed replica is lost");
                    report.lost.push((name, node.clone(), why));
                }
            }
        }
        Ok(report)
    }
}
