//! Identity at the door: a connection to an authenticated-only service proves who it
//! is (a signature or a MAC over a nonce from the server's accept) before the service
//! makes its session. See ARCHITECTURE.md, "Identity at the door".

mod credential;
mod door;
mod gate;
mod identities;
mod keys;
mod proof;
mod throttle;

pub use credential::{Credential, CredentialError, Secret, KEY_FILE_HEADER};
pub use door::{AuthPolicy, DEFAULT_AUTH_TIMEOUT};
pub use keys::{valid_identity, AuthorizedKey, KeySet, Keys, KeysError, MAX_IDENTITY};
pub use proof::{AuthRefusal, Authenticated, Proof, ProofKind, AUTH_TAG, MAX_PROOF, NONCE_LEN};
pub use throttle::{FAILURE_BURST, FAILURE_REFILL_PER_SEC};

pub(crate) use door::{AuthSetup, Door};
pub(crate) use gate::{AuthReport, REFUSED_PREFIX};
pub(crate) use identities::IdentityCounts;
pub(crate) use proof::encode as encode_proof;
