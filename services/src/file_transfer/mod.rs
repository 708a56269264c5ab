//! File transfer over RDMA: the lab protocol (offer, grant, WRITE, done, verdict,
//! identify), made safe for files of any size, as plain state machines with no verbs,
//! no actors and no clock. A session drives them (see [`Endpoint`]).
//!
//! # The protocol
//!
//! Two roles. The **sender** has the file; the **receiver** grants a window of
//! registered memory that the sender RDMA-WRITEs the file into, chunk by chunk. For an
//! upload the client is the sender; for a download (`Fetch`) the server is. Control
//! messages are [`Msg`] values, postcard-encoded, one per framed message.
//!
//! ```text
//!   sender                                          receiver
//!     |  (download only: Fetch{name, alg} ← from the receiver)
//!     |-- Offer{name, len, digest, overwrite} -------->|  check name, size, existing file;
//!     |<------------------------ Reject{reason} -------|  ... refused: the transfer ends
//!     |<---- Grant{window: addr,len,rkey, slots, slot_len} --  register slots×slot_len,
//!     |                                                |  REMOTE_WRITE only; open temp file
//!     |== WRITE_WITH_IMM chunk 0 → slot 0, imm=0 =====>|  hash + append chunk 0
//!     |== WRITE_WITH_IMM chunk 1 → slot 1, imm=1 =====>|  ...
//!     |<-------------------------------- Ack{next:1} --|  slot 0 may be reused
//!     |== WRITE_WITH_IMM chunk 2 → slot 0, imm=2 =====>|
//!     |   ...                                          |
//!     |-- Done --------------------------------------->|  every chunk in? revoke window,
//!     |<----------------------- Good | Bad{reason} ----|  compare digest; fsync, rename
//!     |-- Identify{id} ------------------------------->|  (after Good, optional)
//!     |<--------------------------- Secret{key} | Refused
//! ```
//!
//! **Chunks and the window.** The file is cut into chunks of `slot_len` bytes (the
//! last one shorter). The receiver registers one window of `slots × slot_len` bytes
//! with one rkey and REMOTE_WRITE access only, and grants it once. Chunk `i` is written
//! into slot `i % slots` with WRITE_WITH_IMM, immediate `i`; the arrival tells the
//! receiver that chunk `i` is in its slot, without any other message. The receiver
//! consumes chunks strictly in order (hash update, append to the temporary file) and
//! answers with a cumulative `Ack{next}` ("chunks below `next` are consumed") only when
//! that frees a slot a later chunk needs, so the per-chunk traffic is the WRITE and at
//! most one Ack of a few bytes. The sender keeps up to `slots` chunks in flight and
//! reuses a slot once its previous chunk is both acknowledged (the remote slot is free)
//! and completed locally (its staging bytes are no longer read by the NIC). Small files
//! get a smaller window (one slot of the file's size); an empty file gets none
//! (`Grant{window: None}`) and goes straight to `Done`.
//!
//! **Ordering.** `Done` is posted after the last WRITE on the same RC queue pair, so it
//! arrives after every chunk; a `Done` before the last chunk, a chunk out of order or of
//! the wrong length, an Ack for chunks never written, and any message the current state
//! does not take are errors ([`TransferError`]) that name the state; the session ends
//! the connection with them.
//!
//! **Verification and storage.** The sender picks SHA-256 or BLAKE3 in the offer's
//! digest; the receiver hashes incrementally as chunks land and compares on `Done`. Data
//! goes to a temporary file in the destination directory (`.NAME.rdmactor-tmp-RANDOM`),
//! which is fsynced and given its final name only on a match (without `overwrite` by
//! `link`, which never replaces a file that appeared meanwhile; with it by an atomic
//! `rename`), and then the directory is fsynced. `Good` is sent only once the file is
//! durably in place. A mismatch, a failed commit, an error or a dropped state machine
//! removes the temporary file (see [`TempFile`]).
//!
//! **Refusals.** Names must be plain file names ([`validate_name`]); offers above
//! [`Config::max_size`], existing files without `overwrite`, offers beyond the
//! client's share ([`Config::client_quota`]) and offers the disk has no room for are
//! rejected with a reason, and the connection stays usable for the next transfer. The
//! room is checked (`statvfs`) and then reserved (`fallocate` on the temporary file)
//! when the offer arrives, before any data moves, so an accepted upload does not run
//! out of space halfway. The shares and the bytes promised to admitted uploads belong
//! to the service's [`QuotaOwner`] actor, asked once per offer ([`Output::Admit`]).
//!
//! **Serving a fetch.** The offer carries the file's digest, so the server must know
//! it before the first byte moves. It is not hashed again if the service already knows
//! it ([`DigestCache`]: the digest an upload was verified against, or one computed for
//! an earlier fetch, kept under the file's device, inode, length, mtime and ctime, so
//! a replaced or modified file is hashed afresh). Otherwise the whole file is read
//! and hashed off the connection's thread ([`Output::Prepare`]), and a client may
//! have at most [`Config::fetch_preparations`] of those at once, over all its
//! connections ([`PreparationLimit`]); one more is refused with
//! [`RejectReason::Quota`]. The store is in memory: after a restart, the first fetch
//! of each file hashes it.
//!
//! **Stat.** Between transfers a client may send `Stat{name, alg}` instead of a
//! `Fetch`: the server prepares it as it would the fetch (same access rules, same
//! digest cache, same limit on hashing) and answers `Held{len, digest}` or the
//! `Reject` the fetch would get; no window, no bytes. It lets a client tell a copy of
//! the bytes it expects from other bytes under the name without moving either (a
//! cluster's repair asks it before copying).
//!
//! **Copies for an owner.** A connection that proved an identity the service names as
//! a replicator ([`Config::replicators`]: a cluster's servers) may fetch and stat any
//! file, and may send `OfferFor{offer, owner}` in place of an `Offer`: the upload
//! goes on as any other, and the file is stored as `owner`'s, never replacing one,
//! proving no ID to `Identify`. From anyone else it is refused
//! [`RejectReason::Forbidden`]. So a cluster's repair copies a file for the owner its
//! record names, and the owner reads the copy from the node it went to.
//!
//! **Delete.** Between transfers a client may send `Delete{name}`: allowed where an
//! overwrite would be (the file's owner, told by the open file's owner attribute; or
//! the connection that stored an unowned file), answered `Deleted`, or refused as a
//! fetch would be (`NotFound` for another's file). The [`Recorder`] forgets the file
//! before its name is removed ([`DeleteJob`]), so a cluster's catalog never names
//! bytes that are gone.
//!
//! **Aborts.** A transfer that fails midway for a reason the peer should hear (a write
//! that ran out of space after all, a source that cannot be read) ends with
//! [`Msg::Abort`] and the reason, not with a closed connection: the sender stops and
//! sends `Done`, the receiver revokes its window on it; both finish with
//! [`Outcome::Aborted`]. Protocol violations still end the connection.
//!
//! **Auth.** After `Good`, the sender may send `Identify{id}`; the receiver answers
//! `Secret{key}` with the key the operator configured for `id`
//! ([`Config::secrets`]), or `Refused`.
//!
//! # Pieces
//!
//! * [`Sender`], [`Receiver`]: the two roles; [`Server`]: a server connection, which
//!   becomes the receiver on `Offer` and the sender on `Fetch`, one transfer at a time.
//! * [`Endpoint`]: the inputs and the driving order common to all three; [`Output`]:
//!   what the driver must do.
//! * [`Msg`] and the types it carries: the wire format; [`Hasher`], [`hash_file`]:
//!   hashing; [`TempFile`], [`open_source`]: the store; [`Config`]: the operator's
//!   settings (call [`Config::validate`] once at startup).
//! * [`FileTransfer`]: the service that drives a [`Server`] per connection;
//!   [`send_file`], [`fetch_file`]: the client side over a `ClientConnection`.
//!
//! # Driving it over rdmactor
//!
//! [`RemoteWindow`] has the fields of `rdmactor::verbs::RemoteRegion`. A session maps
//! [`Output::GrantWindow`] to `SessionCx::register(len, Access::REMOTE_WRITE)` and
//! `remote()`, [`Output::Revoke`] to `free`, [`Output::Stage`] to a local buffer,
//! [`Output::WriteChunk`] to `Op::Write { imm: Some(index), .. }` after
//! [`Endpoint::fill_chunk`], and a message with `imm: Some(i)` (and no data) to
//! [`Endpoint::handle_chunk`]. After a transfer finished, late completions of its
//! WRITEs may still arrive; once the next transfer started, the driver should drop
//! them (it knows them by their staging buffer) rather than pass them on.

mod client;
mod config;
mod delete;
mod digests;
mod endpoint;
mod error;
mod file_key;
#[doc(hidden)]
pub mod fuzz;
mod hash;
mod name;
mod output;
mod owner;
pub mod ownership;
mod prepare;
mod quota;
mod receiver;
mod recorder;
mod sender;
mod server;
mod session;
mod store;
mod wire;

pub use client::delete::delete_file;
pub use client::stat::stat_file;
pub use client::{fetch_file, send_file, ClientError, FetchOptions, Progress, SendOptions};
pub use config::{parse_secrets, Config};
pub use delete::DeleteJob;
pub use digests::{DigestCache, DigestStats};
pub use endpoint::Endpoint;
pub use error::{Result, TransferError};
pub use file_key::FileKey;
pub use hash::{hash_bytes, hash_file, hash_reader, Hasher};
pub use name::{validate_name, NameError, MAX_NAME_LEN};
pub use output::{Auth, ChunkWrite, Outcome, Output};
pub use owner::{Admission, Admit, Backed, QuotaOwner, Release, Usage};
pub use prepare::PrepareFetch;
pub use quota::{AdmissionId, ClientQuota, Ledger, PreparationLimit, PreparationPermit};
pub use receiver::{ConsumeJob, Consumed, Receiver, Sink};
pub use recorder::{Recorder, StoredCopy};
pub use sender::Sender;
pub use server::Server;
pub use session::FileTransfer;
pub use store::{free_space, open_source, sweep_temp_files, StoreError, TempFile};
pub use wire::{
    BadReason, Digest, FileOffer, HashAlg, Msg, RejectReason, RemoteWindow, SecretKey, WindowGrant,
    DIGEST_LEN, MAX_CHUNKS, MAX_GRANT_SLOTS, MAX_MSG_LEN, MIN_GRANT_SLOT_LEN,
};

#[cfg(test)]
mod tests;
