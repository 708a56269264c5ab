//! One client's handle on the sandbox: its loads count against its own quota of the
//! module cache, and its holds end when the handle drops.

use std::fmt;
use std::sync::Arc;

use super::cache::ClientId;
use super::{Limits, ModuleHash, Result, Sandbox};

/// A client of the [`Sandbox`] (the lambda service makes one per connection). Modules it
/// loads are held for it within [`SandboxConfig::max_modules_per_client`] and
/// [`SandboxConfig::max_bytes_per_client`]: loading past them lets go of its own least
/// recently used modules, never another client's (see the cache's rules in
/// [`Sandbox`]'s module docs). Dropping the handle (the connection closed, and its last
/// job finished) ends its holds; modules nobody else holds leave the cache.
///
/// [`SandboxConfig::max_modules_per_client`]: super::SandboxConfig::max_modules_per_client
/// [`SandboxConfig::max_bytes_per_client`]: super::SandboxConfig::max_bytes_per_client
pub struct SandboxClient {
    sandbox: Arc<Sandbox>,
    id: ClientId,
}

impl fmt::Debug for SandboxClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxClient")
            .field("id", &self.id.0)
            .field("held", &self.held())
            .finish()
    }
}

impl SandboxClient {
    /// A new client of `sandbox`, holding nothing yet.
    pub fn new(sandbox: Arc<Sandbox>) -> Self {
        let id = ClientId(
            sandbox
                .next_client
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        SandboxClient { sandbox, id }
    }

    /// The sandbox.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// [`Sandbox::load`] for this client: the module is held for it, within its quota.
    ///
    /// # Errors
    ///
    /// As [`Sandbox::load`]; [`CacheFull`](super::LambdaError::CacheFull) also when the
    /// module alone is larger than the client's byte quota.
    pub fn load(&self, bytes: &[u8]) -> Result<ModuleHash> {
        self.sandbox.load_for(self.id, bytes)
    }

    /// [`Sandbox::run`] for this client. Any cached module may be run (its hash names
    /// it, whoever loaded it); a run marks the module as just used among this client's
    /// own holds only, so it cannot keep another client's module cached.
    ///
    /// # Errors
    ///
    /// As [`Sandbox::run`].
    pub fn run(&self, hash: &ModuleHash, input: &[u8], limits: &Limits) -> Result<Vec<u8>> {
        self.sandbox
            .run_for(self.id, hash, input, limits, &mut Default::default())
    }

    /// `true` if this client holds the module.
    pub fn holds(&self, hash: &ModuleHash) -> bool {
        self.sandbox.cache().holds(self.id, hash)
    }

    /// Modules this client holds.
    pub fn held(&self) -> usize {
        self.sandbox.held_by(self.id)
    }
}

impl Drop for SandboxClient {
    fn drop(&mut self) {
        self.sandbox.release(self.id);
    }
}
