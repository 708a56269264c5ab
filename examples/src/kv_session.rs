//! The `kv` service of [`kv`](crate::kv) written as a raw [`Session`] instead of a
//! request handler, on the same protocol and store: kept to measure what the handler
//! saves (docs/writing-a-service.md, "A request handler"), and as the shape to start
//! from when a service needs what only a session has. Serve it with
//! `.service("kv", KvSessions::default())`; `kv client` cannot tell the difference.

use std::collections::HashMap;

use rdmactor::prelude::*;
use rdmactor::runtime::{Answer, Asked};

use crate::kv::{KvError, KvLimits, KvRequest, KvResponse, KvStore, StoreOp, MAX_KEY};

/// The service: makes a session per connection, holding the store's address.
#[derive(Default)]
pub struct KvSessions {
    store: Owner<KvStore>,
    limits: KvLimits,
}

impl KvSessions {
    /// The service with its store bounded by `limits`.
    pub fn with_limits(limits: KvLimits) -> KvSessions {
        KvSessions {
            store: Owner::default(),
            limits,
        }
    }
}

impl Service for KvSessions {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        let limits = self.limits;
        let store = self
            .store
            .get_or_start_dedicated(move || KvStore::new(limits));
        Box::new(KvSession {
            store: store.recipient(),
            asked: HashMap::new(),
            next_token: 0,
        })
    }
}

type StoreAnswer = Result<KvResponse, KvError>;

/// One connection: the requests asked of the store, by wake-up token, with their tags.
struct KvSession {
    store: actix::Recipient<StoreOp>,
    asked: HashMap<u64, (u32, Asked<StoreAnswer>)>,
    next_token: u64,
}

impl Session for KvSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        let op = match msg.decode()? {
            KvRequest::Put { key, value } => StoreOp::Put(key, value),
            KvRequest::Get { key } => StoreOp::Get(key),
            KvRequest::Delete { key } => StoreOp::Delete(key),
            // A READ or WRITE here would be posted with `cx.post` and finished in
            // `on_op`: more plumbing still, which the handler does for you.
            KvRequest::PutFrom { .. } | KvRequest::GetInto { .. } => {
                let why = KvError::Transfer("not served by the session version".into());
                return cx.reply_typed(&msg, &Answer::<KvResponse, _>::Err(why));
            }
        };
        let (StoreOp::Put(key, _) | StoreOp::Get(key) | StoreOp::Delete(key)) = &op;
        if key.len() > MAX_KEY {
            let answer = Answer::<KvResponse, _>::Err(KvError::KeyTooLong(key.len()));
            return cx.reply_typed(&msg, &answer);
        }
        let token = self.next_token;
        self.next_token += 1;
        let asked = cx.ask(token, &self.store, op);
        self.asked.insert(token, (msg.tag, asked));
        Ok(())
    }

    fn on_wake(&mut self, cx: &mut SessionCx<'_>, token: u64) -> Result<(), SessionError> {
        let Some((tag, asked)) = self.asked.remove(&token) else {
            return Ok(());
        };
        if tag == 0 {
            return Ok(()); // one-way: nobody waits
        }
        let answer = match asked.try_take() {
            Some(Ok(Ok(resp))) => Answer::Ok(resp),
            Some(Ok(Err(e))) => Answer::Err(e),
            Some(Err(_)) | None => Answer::Err(KvError::StoreGone),
        };
        let bytes = postcard::to_allocvec(&answer).map_err(|e| SessionError::new(e.to_string()))?;
        cx.send(tag, bytes)
    }
}
