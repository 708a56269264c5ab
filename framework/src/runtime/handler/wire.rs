//! The answer to a handler's request on the wire ([`Answer`]), what the framework says
//! when the handler never got to answer ([`Refusal`]), and what a client's
//! `call_typed` returns when a call fails ([`CallError`]).

use serde::{Deserialize, Serialize};

use crate::runtime::client_session::RequestError;

/// The answer to a request to a [`RequestHandler`](super::RequestHandler), postcard
/// encoded under the request's tag.
///
/// The first two variants are the handler's own result and are numbered as serde
/// numbers `Result`'s (`Ok` 0, `Err` 1), so an answer the handler gave decodes as a
/// postcard `Result<Resp, Error>` too, for a client that does not use rdmactor's; the
/// third is the framework's, for a request the handler never answered. Each is one
/// varint (the variant) followed by the value's postcard encoding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer<R, E> {
    /// The handler's answer.
    Ok(R),
    /// The handler's error.
    Err(E),
    /// The framework's: the handler did not answer this request.
    Refused(Refusal),
}

/// Why a request got no answer from its handler. Sent to the client as
/// [`Answer::Refused`]; the connection goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The request's bytes are not the handler's request type (another version of the
    /// protocol, or another service's request): postcard's reason.
    #[error("the server could not decode the request: {0}")]
    BadRequest(String),
    /// The connection already had as many calls running and waiting as the service
    /// allows (`HandlerService::max_in_flight`, `max_waiting`): retry later, or send
    /// fewer at once.
    #[error("busy: {running} calls running and {waiting} waiting on this connection")]
    Busy {
        /// Calls running on this connection.
        running: u32,
        /// Requests waiting for one of them to finish.
        waiting: u32,
    },
    /// The handler panicked while answering; the message is the panic's.
    #[error("the handler panicked: {0}")]
    Panicked(String),
    /// The handler answered, but its answer could not be sent (it does not encode, or is
    /// larger than the connection or the client takes).
    #[error("the answer could not be delivered: {0}")]
    Undeliverable(String),
    /// The server as a whole had no room for the call: its heap budget
    /// (`PoolConfig::heap_bytes`) could not count the request's bytes. Retry later; the
    /// connection goes on.
    #[error("the server is overloaded: {0}")]
    Overloaded(String),
}

/// Why [`ClientConnection::call_typed`](crate::runtime::ClientConnection::call_typed)
/// has no answer. `E` is the handler's own error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError<E> {
    /// The handler answered with its error.
    #[error("the handler failed: {0:?}")]
    Handler(E),
    /// The server's framework answered instead of the handler.
    #[error("the server refused the call: {0}")]
    Refused(Refusal),
    /// The request never got an answer: the connection closed, the request was too
    /// large, it could not be encoded, ...
    #[error(transparent)]
    Request(#[from] RequestError),
    /// An answer came but is not a [`Answer`] of the types asked for (a client and server
    /// of different versions, or a service that is not a handler): postcard's reason.
    #[error("the answer is not of the expected type: {0}")]
    BadAnswer(String),
}

/// A refusal, encoded as a [`Answer`] of any types: the variant's number does not depend
/// on them, so the session can refuse before it knows (or without) a typed answer.
pub(super) fn encode_refusal(refusal: Refusal) -> Vec<u8> {
    // A `Answer<(), ()>` cannot fail to encode: unit values and strings always do.
    postcard::to_allocvec(&Answer::<(), ()>::Refused(refusal)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_decodes_as_a_result_and_a_refusal_under_any_types() {
        let ok = postcard::to_allocvec(&Answer::<u32, String>::Ok(7)).unwrap();
        assert_eq!(
            postcard::from_bytes::<Result<u32, String>>(&ok).unwrap(),
            Ok(7)
        );
        let err = postcard::to_allocvec(&Answer::<u32, String>::Err("no".into())).unwrap();
        assert_eq!(
            postcard::from_bytes::<Result<u32, String>>(&err).unwrap(),
            Err("no".to_owned())
        );
        let busy = encode_refusal(Refusal::Busy {
            running: 2,
            waiting: 3,
        });
        assert_eq!(
            postcard::from_bytes::<Answer<Vec<u8>, u64>>(&busy).unwrap(),
            Answer::Refused(Refusal::Busy {
                running: 2,
                waiting: 3
            })
        );
    }
}
