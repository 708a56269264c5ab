//! The client side of `Stat`: one question, one answer, on a connection that carries
//! nothing else meanwhile (see [`client`](super)).

use rdmactor::runtime::ClientConnection;
use rdmactor::transport::Transport;

use super::error::ClientError;
use super::finish;
use super::question::one_answer;
use crate::file_transfer::error::TransferError;
use crate::file_transfer::output::Outcome;
use crate::file_transfer::wire::{HashAlg, Msg};

/// Asks the server what it holds under `name`, hashed with `alg`, without moving the
/// file: [`Outcome::Held`] with its length and digest, or [`Outcome::Rejected`] with
/// the reason a fetch of it would get ([`RejectReason::NotFound`] for no such file).
/// The server may have to read the whole file to hash it (as for a fetch), unless it
/// knows its digest.
///
/// [`RejectReason::NotFound`]: crate::file_transfer::RejectReason::NotFound
///
/// # Errors
///
/// A bad name, a failed send, a closed connection, or an answer that is not one to a
/// `Stat`; the connection is closed then.
pub async fn stat_file<T: Transport>(
    conn: &ClientConnection<T>,
    name: &str,
    alg: HashAlg,
) -> Result<Outcome, ClientError> {
    let asked = async {
        crate::file_transfer::name::validate_name(name).map_err(TransferError::from)?;
        let msg = Msg::Stat {
            name: name.to_owned(),
            alg,
        };
        let answer = one_answer(conn, msg, STATE).await?;
        Ok(stat_answer(answer, alg)?)
    };
    finish(conn, asked.await).await
}

/// The outcome a `Stat`'s answer stands for; any other message is a protocol error.
fn stat_answer(msg: Msg, alg: HashAlg) -> Result<Outcome, TransferError> {
    match msg {
        Msg::Held { len, digest } if digest.alg == alg => Ok(Outcome::Held { len, digest }),
        Msg::Held { digest, .. } => Err(TransferError::FetchMismatch(format!(
            "asked for a {alg} digest, answered with {}",
            digest.alg
        ))),
        Msg::Reject { reason } => Ok(Outcome::Rejected(reason)),
        other => Err(unexpected_answer(other.kind().to_owned())),
    }
}

const STATE: &str = "waiting for the answer to Stat";

fn unexpected_answer(what: String) -> TransferError {
    TransferError::Unexpected { what, state: STATE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_answered_by_held_or_a_refusal_and_nothing_else() {
        use crate::file_transfer::wire::{Digest, RejectReason, DIGEST_LEN};
        let digest = Digest {
            alg: HashAlg::Sha256,
            bytes: [1; DIGEST_LEN],
        };
        assert_eq!(
            stat_answer(Msg::Held { len: 7, digest }, HashAlg::Sha256).unwrap(),
            Outcome::Held { len: 7, digest }
        );
        assert!(matches!(
            stat_answer(Msg::Held { len: 7, digest }, HashAlg::Blake3),
            Err(TransferError::FetchMismatch(_))
        ));
        assert_eq!(
            stat_answer(
                Msg::Reject {
                    reason: RejectReason::NotFound
                },
                HashAlg::Sha256
            )
            .unwrap(),
            Outcome::Rejected(RejectReason::NotFound)
        );
        assert!(matches!(
            stat_answer(Msg::Good, HashAlg::Sha256),
            Err(TransferError::Unexpected { .. })
        ));
    }
}
