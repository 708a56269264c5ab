//! The client side of the protocol's one-message questions (`Stat`, `Delete`): one
//! message out, one back, on a connection that carries nothing else meanwhile.

use rdmactor::runtime::ClientConnection;
use rdmactor::transport::Transport;

use super::error::ClientError;
use crate::file_transfer::error::TransferError;
use crate::file_transfer::wire::Msg;

/// Sends `msg`, a question answered by one message (`Stat`, `Delete`), and returns
/// the answer; a chunk in its place is a protocol error, met in `state`.
pub(super) async fn one_answer<T: Transport>(
    conn: &ClientConnection<T>,
    msg: Msg,
    state: &'static str,
) -> Result<Msg, ClientError> {
    let what = msg.kind();
    conn.send(msg.encode())
        .await
        .map_err(|source| ClientError::Send { what, source })?;
    let answer = conn.recv().await.ok_or(ClientError::Closed)?;
    if let Some(index) = answer.imm {
        let what = format!("chunk {index}");
        return Err(TransferError::Unexpected { what, state }.into());
    }
    Ok(Msg::decode(&answer.data)?)
}
