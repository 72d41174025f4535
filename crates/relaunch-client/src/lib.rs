//! The tracking client: records go to a crash-safe local spool first
//! ([`spool`]), a background thread ships them to the server
//! ([`shipper`]), and the server stores each exactly once. [`run::Run`] is
//! the handle a training process (through Python) or the launcher logs
//! through; [`sync`] ships spools that nobody else will.

pub mod beat;
pub mod checkpoints;
pub mod env;
pub mod error;
pub mod files;
pub mod hash;
pub mod http;
pub mod local;
pub mod mirror;
pub mod run;
pub mod shipper;
pub mod spool;
pub mod sync;
pub mod system;
pub mod uploads;

pub use error::{ClientError, ErrorKind};
pub use http::Client;
pub use run::{Run, RunOptions};
