//! The demo's steps, in the order it runs them; each returns the row of the table it
//! verified, or why it failed.

pub mod echo;
pub mod files;
pub mod hostile;
pub mod identity;
pub mod lambda;
pub mod read;
pub mod rping;
