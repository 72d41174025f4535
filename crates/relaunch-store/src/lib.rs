//! A key-value store wire-compatible with PyTorch's `TCPStore`: the codec
//! ([`wire`]), the data and waiter semantics ([`state`]), a tokio server
//! ([`StoreServer`]) and an async client ([`StoreClient`]).
//!
//! PyTorch workers use the server unmodified (`init_process_group` with
//! `MASTER_ADDR`/`MASTER_PORT` pointing at it); relaunch's own coordination
//! uses the same server through [`StoreClient`]. This crate knows nothing of
//! training: keys and values are bytes.

pub mod client;
pub mod error;
pub mod server;
pub mod session;
pub mod state;
pub mod wire;

pub use client::{ClientOptions, StoreClient};
pub use error::{ErrorKind, FrameError, ProtocolError, StoreError};
pub use server::{RunningServer, ServerOptions, StoreServer, StoreStats};
pub use wire::Limits;
