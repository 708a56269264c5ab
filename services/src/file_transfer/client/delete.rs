//! The client side of `Delete`: one question, one answer, on a connection that carries
//! nothing else meanwhile (the server's job is `file_transfer/delete.rs`).

use rdmactor::runtime::ClientConnection;
use rdmactor::transport::Transport;

use super::error::ClientError;
use super::finish;
use super::question::one_answer;
use crate::file_transfer::error::TransferError;
use crate::file_transfer::output::Outcome;
use crate::file_transfer::wire::Msg;

/// Asks the server to remove the file `name`: [`Outcome::Deleted`], or
/// [`Outcome::Rejected`] with the reason ([`RejectReason::NotFound`](crate::file_transfer::RejectReason::NotFound) for no such file
/// or one this client may not remove).
///
/// # Errors
///
/// A bad name, a failed send, a closed connection, or an answer that is not one to a
/// `Delete`; the connection is closed then.
pub async fn delete_file<T: Transport>(
    conn: &ClientConnection<T>,
    name: &str,
) -> Result<Outcome, ClientError> {
    let asked = async {
        crate::file_transfer::name::validate_name(name).map_err(TransferError::from)?;
        let msg = Msg::Delete {
            name: name.to_owned(),
        };
        Ok(delete_answer(one_answer(conn, msg, STATE).await?)?)
    };
    finish(conn, asked.await).await
}

/// The outcome a `Delete`'s answer stands for; any other message is a protocol error.
fn delete_answer(msg: Msg) -> Result<Outcome, TransferError> {
    match msg {
        Msg::Deleted => Ok(Outcome::Deleted),
        Msg::Reject { reason } => Ok(Outcome::Rejected(reason)),
        other => Err(unexpected_answer(other.kind().to_owned())),
    }
}

const STATE: &str = "waiting for the answer to Delete";

fn unexpected_answer(what: String) -> TransferError {
    TransferError::Unexpected { what, state: STATE }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_transfer::wire::RejectReason;

    #[test]
    fn a_delete_is_answered_by_deleted_or_a_refusal_and_nothing_else() {
        assert_eq!(delete_answer(Msg::Deleted).unwrap(), Outcome::Deleted);
        assert_eq!(
            delete_answer(Msg::Reject {
                reason: RejectReason::NotFound
            })
            .unwrap(),
            Outcome::Rejected(RejectReason::NotFound)
        );
        assert!(matches!(
            delete_answer(Msg::Good),
            Err(TransferError::Unexpected { .. })
        ));
    }
}
