//! Native lambdas: Rust functions the embedding application registers by name. They run
//! in the host process with no limits, so only the application registers them, never a
//! client.

use std::collections::HashMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, PoisonError, RwLock};

use super::sandbox::{LambdaError, Result};

/// A native lambda: input bytes in, output bytes or an error message out.
pub type NativeFn = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

/// Native lambdas by name. Shareable between threads; registering while others run is fine.
#[derive(Default)]
pub struct NativeLambdas {
    lambdas: RwLock<HashMap<String, NativeFn>>,
}

impl fmt::Debug for NativeLambdas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NativeLambdas")
            .field("names", &self.names())
            .finish()
    }
}

impl NativeLambdas {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `f` under `name` and returns the lambda it replaces, if any.
    pub fn register(&self, name: impl Into<String>, f: NativeFn) -> Option<NativeFn> {
        self.lambdas
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.into(), f)
    }

    /// Removes a lambda; `false` if there was none by that name.
    pub fn unregister(&self, name: &str) -> bool {
        self.lambdas
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)
            .is_some()
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .lambdas
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Runs the lambda called `name` on `input`, on the calling thread.
    ///
    /// # Errors
    ///
    /// [`UnknownLambda`](LambdaError::UnknownLambda) if nothing is registered under `name`;
    /// [`NativeError`](LambdaError::NativeError) if the lambda returns an error or panics.
    pub fn run(&self, name: &str, input: &[u8]) -> Result<Vec<u8>> {
        // Clone the Arc so that the lock is not held while the lambda runs.
        let f = self
            .lambdas
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| LambdaError::UnknownLambda(name.to_string()))?;
        match panic::catch_unwind(AssertUnwindSafe(|| f(input))) {
            Ok(result) => result.map_err(LambdaError::NativeError),
            Err(_) => Err(LambdaError::NativeError(format!("`{name}` panicked"))),
        }
    }
}

/// FNV-1a offset basis (64-bit).
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV prime (64-bit).
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The 64-bit FNV-1a hash of `input` as 8 little-endian bytes: the same bytes
/// `examples/lambdas/checksum.wat` returns, for comparing the sandbox with native code.
pub fn checksum_native(input: &[u8]) -> Vec<u8> {
    let hash = input.iter().fold(FNV_OFFSET, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    });
    hash.to_le_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_native_matches_known_fnv1a_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(checksum_native(b""), 0xcbf29ce484222325u64.to_le_bytes());
        assert_eq!(checksum_native(b"a"), 0xaf63dc4c8601ec8cu64.to_le_bytes());
        assert_eq!(
            checksum_native(b"foobar"),
            0x85944171f73967e8u64.to_le_bytes()
        );
    }

    #[test]
    fn lambdas_run_by_name() {
        let lambdas = NativeLambdas::new();
        lambdas.register("checksum", Arc::new(|i: &[u8]| Ok(checksum_native(i))));
        lambdas.register("fail", Arc::new(|_: &[u8]| Err("no".to_string())));
        lambdas.register("panic", Arc::new(|_: &[u8]| panic!("boom")));
        assert_eq!(lambdas.names(), ["checksum", "fail", "panic"]);
        assert_eq!(
            lambdas.run("checksum", b"a").unwrap(),
            checksum_native(b"a")
        );
        assert_eq!(
            lambdas.run("fail", b""),
            Err(LambdaError::NativeError("no".into()))
        );
        assert!(matches!(
            lambdas.run("panic", b""),
            Err(LambdaError::NativeError(_))
        ));
        assert_eq!(
            lambdas.run("missing", b""),
            Err(LambdaError::UnknownLambda("missing".into()))
        );
        assert!(lambdas.unregister("fail"));
        assert!(!lambdas.unregister("fail"));
    }
}
